"""Lifecycle transition table (actors/core/program.py): every legal move and every illegal one."""

from __future__ import annotations

import pytest

from actors.core import program as lc
from actors.core.errors import IllegalTransition
from actors.core.ids import ProgramRef
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING, Program

SPLIT = {
    lc.PAUSED_REASONING: (PAUSED, REASONING),
    lc.PAUSED_ACTING: (PAUSED, ACTING),
    lc.ACTIVE_REASONING: (ACTIVE, REASONING),
    lc.ACTIVE_ACTING: (ACTIVE, ACTING),
}


def make(state: str) -> Program:
    p = Program(ref=ProgramRef("default", "p", 0), created_at=0.0)
    p.state, p.status = SPLIT[state]
    return p


@pytest.mark.parametrize(("start", "trigger"), sorted(lc.TRANSITIONS))
def test_core_program_legal_transitions_move_to_table_target(start: str, trigger: str) -> None:
    p = make(start)
    frm, to = lc.apply(p, trigger)
    assert (frm, to) == (start, lc.TRANSITIONS[(start, trigger)])
    if to != lc.RELEASED:
        assert p.lifecycle == to
    else:
        assert p.lifecycle == start


ILLEGAL = [(s, t) for s in lc.LIVE_STATES for t in lc.TRIGGERS if (s, t) not in lc.TRANSITIONS]


@pytest.mark.parametrize(("start", "trigger"), ILLEGAL)
def test_core_program_illegal_transition_raises_and_leaves_state(start: str, trigger: str) -> None:
    p = make(start)
    with pytest.raises(IllegalTransition) as info:
        lc.apply(p, trigger)
    assert p.lifecycle == start
    assert info.value.from_state == start and info.value.trigger == trigger


def test_core_program_released_is_terminal() -> None:
    for trigger in lc.TRIGGERS:
        with pytest.raises(IllegalTransition):
            lc.next_state(lc.RELEASED, trigger)


def test_core_program_expected_moves() -> None:
    # spot checks against the transition table of docs/program-scheduling.md §1
    assert lc.next_state(lc.PAUSED_REASONING, lc.ACTIVATE) == lc.ACTIVE_REASONING
    assert lc.next_state(lc.ACTIVE_REASONING, lc.COMPLETE_IDLE) == lc.ACTIVE_ACTING
    assert lc.next_state(lc.ACTIVE_ACTING, lc.PAUSE) == lc.PAUSED_ACTING
    assert lc.next_state(lc.ACTIVE_ACTING, lc.ARRIVE) == lc.ACTIVE_REASONING
    assert lc.next_state(lc.PAUSED_ACTING, lc.RELEASE) == lc.RELEASED
    # B6 fix: an idle Program whose target vanished is reclaimable (paused_acting)
    assert lc.next_state(lc.ACTIVE_REASONING, lc.INVALIDATE_IDLE) == lc.PAUSED_ACTING
    # admission never evicts: an active Program cannot be activated again
    assert (lc.ACTIVE_ACTING, lc.ACTIVATE) not in lc.TRANSITIONS
