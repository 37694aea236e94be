"""The end-of-step bookkeeping of ``scheduler.step`` after session 28's fast paths gives what the
plain formulation gives (docs/benchmarks.md §1.2):

* ``timeline.sync_touched`` (``attribution.sync`` inlined) leaves each touched Program's time
  account exactly as ``attribution.sync`` does (docs/program-scheduling.md §14);
* ``timers.sync_timers`` (an Active Program decided without building its wanted timers) emits the
  same timer commands, takes the same tokens and leaves the same armed timers as the diff of
  ``wanted_timers`` against the armed ones for every Program.

``reference_sync_timers`` is ``sync_timers`` as it was before the fast path.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from actors.core.attribution import IDLE, QUEUED, SERVING, ProgramTime, TimeBook, sync
from actors.core.effects import ArmTimer, CancelTimer
from actors.core.events import ACTING_TTL, FORCE_RESUME, PAUSED_RETENTION, QUEUE_TIMEOUT
from actors.core.ids import ProgramRef, SeqCounter
from actors.core.model import ACTING, ACTIVE, PAUSED, REASONING, Program
from actors.core.timeline import sync_touched
from actors.core.timers import sync_timers, wanted_timers

REF = ProgramRef("default", "p", 0)
KINDS = (ACTING_TTL, FORCE_RESUME, QUEUE_TIMEOUT, PAUSED_RETENTION)
times = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.25])
amounts = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=100.0))


class Pool:
    def __init__(self, waiting: list[float]) -> None:
        self.waiting = [SimpleNamespace(queue_deadline=t) for t in waiting]

    def program_len(self, ref: object) -> int:
        return len(self.waiting)

    def front(self, ref: object) -> object:
        return self.waiting[0] if self.waiting else None

    def requests(self, ref: object) -> tuple[Any, ...]:
        return tuple(self.waiting)


@given(
    since=times,
    now=times,
    phase=st.sampled_from([IDLE, QUEUED, SERVING]),
    serving_open=amounts,
    buckets=st.lists(amounts, min_size=5, max_size=5),
    in_flight=st.integers(0, 2),
    waiting=st.integers(0, 2),
    known=st.booleans(),
)
def test_sync_touched_is_sync(
    since: float,
    now: float,
    phase: int,
    serving_open: float,
    buckets: list[float],
    in_flight: int,
    waiting: int,
    known: bool,
) -> None:
    book = TimeBook()
    if known:
        rec = book.record(REF.key, since)
        rec.since, rec.phase, rec.serving_open = since, phase, serving_open
        rec.queue, rec.prefill, rec.between_turns, rec.unreported_prefill, rec.unreported_queue = buckets
        expected = attrs.evolve(rec)
    else:
        expected = ProgramTime(started_at=now, since=now)
    sync(expected, now, in_flight, waiting)
    s = SimpleNamespace(
        times=book,
        now=now,
        pool=Pool([0.0] * waiting),
        touched={REF: SimpleNamespace(in_flight=in_flight)},
    )
    sync_touched(s)  # type: ignore[arg-type]
    assert attrs.asdict(book.records[REF.key]) == attrs.asdict(expected)
    assert book.totals.programs == 1


def reference_sync_timers(s: Any) -> None:
    programs, effects = s.programs, s.effects
    for ref, p in s.touched.items():
        if programs.get(ref.key) is not p:
            continue
        want = wanted_timers(s, p)
        have = p.timers
        if have is None:
            if not want:
                continue
            have = {}
        else:
            for kind in [k for k in have if k not in want]:
                del have[kind]
                effects.append(CancelTimer(program=ref, kind=kind))
        for kind, deadline in want.items():
            cur = have.get(kind)
            if cur is None or cur[0] != deadline:
                token = s.timer_tokens.next()
                have[kind] = (deadline, token)
                effects.append(ArmTimer(program=ref, kind=kind, deadline=deadline, token=token))
        p.timers = have or None


def make_state(fields: dict[str, Any], armed: dict[str, tuple[float, int]] | None, waiting: list[float]) -> Any:
    p = Program(ref=REF, created_at=0.0)
    for name, value in fields.items():
        setattr(p, name, value)
    p.timers = dict(armed) if armed is not None else None
    return SimpleNamespace(
        programs={REF.key: p},
        touched={REF: p},
        effects=[],
        timer_tokens=SeqCounter(100),
        pool=Pool(waiting),
        now=1.0,
        cfg=SimpleNamespace(paused_retention_ttl_seconds=30.0),
    )


deadlines = st.one_of(st.none(), times)


@given(
    state=st.sampled_from([ACTIVE, PAUSED]),
    status=st.sampled_from([ACTING, REASONING]),
    ttl_deadline=deadlines,
    force_resume_deadline=deadlines,
    in_flight=st.integers(0, 1),
    armed=st.one_of(
        st.none(), st.dictionaries(st.sampled_from(KINDS), st.tuples(times, st.integers(0, 5)), min_size=1)
    ),
    waiting=st.lists(times, max_size=2),
)
def test_sync_timers_is_the_diff_of_wanted_timers(
    state: str,
    status: str,
    ttl_deadline: float | None,
    force_resume_deadline: float | None,
    in_flight: int,
    armed: dict[str, tuple[float, int]] | None,
    waiting: list[float],
) -> None:
    fields = {
        "state": state,
        "status": status,
        "ttl_deadline": ttl_deadline,
        "force_resume_deadline": force_resume_deadline,
        "in_flight": in_flight,
        "paused_at": 0.5,
    }
    new, old = make_state(fields, armed, waiting), make_state(fields, armed, waiting)
    sync_timers(new)
    reference_sync_timers(old)
    p_new, p_old = new.programs[REF.key], old.programs[REF.key]
    assert new.effects == old.effects
    assert p_new.timers == p_old.timers
    assert (None if p_new.timers is None else list(p_new.timers)) == (
        None if p_old.timers is None else list(p_old.timers)
    )
    assert new.timer_tokens.value == old.timer_tokens.value
