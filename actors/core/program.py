"""Program lifecycle as an explicit transition table (docs/program-scheduling.md §1).

A live Program generation is in one of four lifecycle states, the pair (state, status):

=====================  ==============================================================
``paused_reasoning``   owns no capacity, has >= 1 request waiting (queued for resume)
``paused_acting``      idle, owns nothing; the paused-retention timer runs
``active_reasoning``   owns logical capacity on its placement; requests in flight
``active_acting``      owns capacity, nothing in flight or waiting; acting TTL armed
``released``           terminal: records deleted (the generation number is remembered)
=====================  ==============================================================

Triggers are the scheduler's verbs.  :func:`next_state` looks the pair up and raises
:class:`IllegalTransition` for a missing entry; :func:`apply` changes the record only after the
lookup succeeded, so an illegal transition leaves the Program untouched.

agentd differs from the reference here in one place (docs/program-scheduling.md §10, B6):
``invalidate`` of an idle Program (no waiter, nothing counted in flight) goes to
``paused_acting`` instead of the reference's orphaned ``paused_reasoning`` with zero waiters
so the paused-retention release can reclaim it.
"""

from __future__ import annotations

from actors.core.errors import IllegalTransition
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING, Program

PAUSED_REASONING = "paused_reasoning"
PAUSED_ACTING = "paused_acting"
ACTIVE_REASONING = "active_reasoning"
ACTIVE_ACTING = "active_acting"
RELEASED = "released"
LIVE_STATES = (PAUSED_REASONING, PAUSED_ACTING, ACTIVE_REASONING, ACTIVE_ACTING)

# Triggers
ARRIVE = "arrive"  # a request is retained for the Program
ACTIVATE = "activate"  # admission/resume commit on a rank
DISPATCH = "dispatch"  # the FIFO front of an Active Program is claimed
COMPLETE_BUSY = "complete_busy"  # a completion leaves requests in flight
COMPLETE_IDLE = "complete_idle"  # the last in-flight request completed, nothing waiting
PAUSE = "pause"  # pause(reason): TTL expiry, capacity repair, yield, failure
CANCEL_IDLE = "cancel_idle"  # the last waiter was cancelled, nothing in flight
CANCEL_BUSY = "cancel_busy"  # a waiter was cancelled, other requests remain
INVALIDATE_IDLE = "invalidate_idle"  # placement target removed; no waiter left
INVALIDATE_WAITING = "invalidate_waiting"  # placement target removed; waiters remain
RELEASE = "release"  # terminal release (retention, terminate, unstarted cancel)
REQUEUE = "requeue"  # its only request in flight went back to the pool before its first token
TRIGGERS = (
    ARRIVE,
    ACTIVATE,
    DISPATCH,
    COMPLETE_BUSY,
    COMPLETE_IDLE,
    PAUSE,
    CANCEL_IDLE,
    CANCEL_BUSY,
    INVALIDATE_IDLE,
    INVALIDATE_WAITING,
    RELEASE,
    REQUEUE,
)

TRANSITIONS: dict[tuple[str, str], str] = {
    (PAUSED_REASONING, ARRIVE): PAUSED_REASONING,
    (PAUSED_REASONING, ACTIVATE): ACTIVE_REASONING,
    (PAUSED_REASONING, CANCEL_IDLE): PAUSED_ACTING,
    (PAUSED_REASONING, CANCEL_BUSY): PAUSED_REASONING,
    (PAUSED_REASONING, RELEASE): RELEASED,
    (PAUSED_ACTING, ARRIVE): PAUSED_REASONING,
    (PAUSED_ACTING, RELEASE): RELEASED,
    (ACTIVE_REASONING, ARRIVE): ACTIVE_REASONING,
    (ACTIVE_REASONING, DISPATCH): ACTIVE_REASONING,
    (ACTIVE_REASONING, COMPLETE_BUSY): ACTIVE_REASONING,
    (ACTIVE_REASONING, COMPLETE_IDLE): ACTIVE_ACTING,
    (ACTIVE_REASONING, CANCEL_BUSY): ACTIVE_REASONING,
    (ACTIVE_REASONING, CANCEL_IDLE): PAUSED_ACTING,
    (ACTIVE_REASONING, INVALIDATE_IDLE): PAUSED_ACTING,
    (ACTIVE_REASONING, INVALIDATE_WAITING): PAUSED_REASONING,
    (ACTIVE_REASONING, REQUEUE): PAUSED_REASONING,
    (ACTIVE_ACTING, ARRIVE): ACTIVE_REASONING,
    (ACTIVE_ACTING, PAUSE): PAUSED_ACTING,
    (ACTIVE_ACTING, INVALIDATE_IDLE): PAUSED_ACTING,
    (ACTIVE_ACTING, RELEASE): RELEASED,
}

_SPLIT = {
    PAUSED_REASONING: (PAUSED, REASONING),
    PAUSED_ACTING: (PAUSED, ACTING),
    ACTIVE_REASONING: (ACTIVE, REASONING),
    ACTIVE_ACTING: (ACTIVE, ACTING),
}


def next_state(current: str, trigger: str) -> str:
    """The lifecycle state after ``trigger``; raises :class:`IllegalTransition` if not allowed."""
    try:
        return TRANSITIONS[(current, trigger)]
    except KeyError:
        raise IllegalTransition(current, trigger) from None


# (state, status, trigger) -> ((new state, new status) or None when released, from name, to name)
_FAST: dict[tuple[str, str, str], tuple[tuple[str, str] | None, str, str]] = {
    (*_SPLIT[frm], trig): (_SPLIT.get(to), frm, to) for (frm, trig), to in TRANSITIONS.items()
}


def apply(program: Program, trigger: str) -> tuple[str, str]:
    """Apply ``trigger`` to ``program``; returns ``(from_state, to_state)``.

    ``released`` leaves the state/status fields as they were (the record is then deleted by
    the scheduler).  Raises before mutating anything.  (Same table as :func:`next_state`,
    pre-split by (state, status) because this runs several times per request.)
    """
    row = _FAST.get((program.state, program.status, trigger))
    if row is None:
        raise IllegalTransition(program.lifecycle, trigger)
    split, frm, to = row
    if split is not None:
        program.state, program.status = split
    return frm, to
