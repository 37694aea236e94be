"""The core's resume order against the naive reference model, on random waiting sets.

Scenario (one rank, Program-count guard only): ``K`` blocker Programs fill the rank; some
waiters first ran one request each, of a random service time (so MRU has finish times and LAS
attained service, summed per task, to order by); then every waiter
queues with a random front priority, at random times; some carry a zero deadline hint and
are force-resumed at once. Completing the blockers one at a time frees one slot each, and the
order in which the core admits the waiters must be exactly the naive model's order.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.core.config import ProgramSchedulingConfig
from actors.core.effects import Transition
from actors.core.events import RequestCompleted, RequestSubmitted, TargetsChanged
from actors.core.model import RequestHints
from actors.core.scheduler import initial_state, step
from actors.core.state import SchedulerState
from property_tests.reference_model import Waiter, count_only_admissions, naive_order
from property_tests.strategies import make_targets, parse_program_request

ADMISSIONS = ("program_admit", "force_resume", "batch_gain_admit")


class Driver:
    def __init__(self, cfg: ProgramSchedulingConfig) -> None:
        self.cfg = cfg
        self.state: SchedulerState = initial_state(cfg)
        self.target = make_targets(1)[0]
        self.now = 0.0
        self.seq = 0
        self.admitted: list[str] = []
        self.run(TargetsChanged("default", (self.target,)))

    def run(self, event: object) -> tuple[object, ...]:
        effects = step(self.state, event, now=self.now, cfg=self.cfg).effects
        self.admitted += [e.program.program_id for e in effects if isinstance(e, Transition) and e.reason in ADMISSIONS]
        return effects

    def submit(self, index: int, priority: int = 0, deadline: float | None = None) -> str:
        self.seq += 1
        rid = f"r{self.seq}"
        ident = parse_program_request(index, {}).identity
        self.run(RequestSubmitted(rid, ident, 1000, RequestHints(priority=priority, deadline_seconds=deadline)))
        return rid


waiter_specs = st.lists(
    st.tuples(
        st.booleans(),  # ran one request before queueing
        st.integers(min_value=-2, max_value=2),  # front priority
        st.sampled_from([None, None, None, 0.0]),  # deadline hint (0: forced at arrival)
        st.sampled_from([0.0, 0.0, 1.0, 2.5]),  # time before queueing
        st.sampled_from([0.5, 1.0, 2.0, 3.5]),  # service time of the request run before queueing
    ),
    min_size=1,
    max_size=8,
)


@given(
    st.integers(min_value=1, max_value=3),
    st.sampled_from(["mru", "fcfs", "las"]),
    waiter_specs,
    st.permutations(range(8)),
)
def test_admission_order_matches_the_naive_model(
    k: int, resume_order: str, specs: list[tuple[bool, int, float | None, float, float]], prelude_order: list[int]
) -> None:
    cfg = ProgramSchedulingConfig(
        max_active_programs_per_target=k,
        resume_order=resume_order,
        admission_waiting_request_threshold=0,
        stats_window_size=1000,
        queue_timeout_seconds=10_000.0,
        force_resume_timeout_seconds=10_000.0,
        paused_retention_ttl_seconds=100_000.0,
    )
    d = Driver(cfg)
    first = 10  # Program indexes >= 10 are waiters, 100+ are blockers
    # Prelude: waiters that ran before finish one request each (alone on the rank, in a random order).
    finished: dict[int, float] = {}
    attained: dict[str, float] = {}  # placement key (the task) -> service seconds of its Programs
    for i in prelude_order:
        if i < len(specs) and specs[i][0]:
            d.now += 1.0
            rid = d.submit(first + i)
            d.now += specs[i][4]
            d.run(RequestCompleted(rid, True))
            finished[first + i] = d.now
            task = parse_program_request(first + i, {}).identity.placement_key
            attained[task] = attained.get(task, 0.0) + specs[i][4]
    assert d.state.ranks[d.target.target_id].active == {}  # TTL 0 before the windows mature
    d.admitted.clear()
    # Blockers fill the rank.
    d.now += 1.0
    blockers = [d.submit(100 + b) for b in range(k)]
    assert d.admitted == [parse_program_request(100 + b, {}).identity.program_id for b in range(k)]
    d.admitted.clear()
    # Waiters queue one at a time; at each arrival the naive model decides who enters
    # (zero-deadline waiters are forced in at once, bypassing the full rank).
    waiters: list[Waiter] = []
    forced: list[Waiter] = []
    for i, (_ran, priority, deadline, gap, _service) in enumerate(specs):
        d.now += gap
        ident = parse_program_request(first + i, {}).identity
        pid = ident.program_id
        d.admitted.clear()
        d.submit(first + i, priority, deadline)
        w = Waiter(
            pid,
            "default",
            d.target.target_id,
            None if deadline is None else d.now,
            priority,
            False,
            d.now,
            # A blocking subagent's request (expected_resume false by default) ended its Program
            # at completion: it comes back as a new generation that never finished a request.
            finished.get(first + i) if ident.expected_resume else None,
            attained.get(ident.placement_key, 0.0),
        )
        queue = [x for x in waiters if x not in forced] + [w]
        entered = count_only_admissions(queue, k + len(forced), k, False, d.now, resume_order)
        assert d.admitted == [x.program_id for x in entered]
        waiters.append(w)
        forced += entered
    # Each blocker completion frees one slot (forced entrants still hold theirs): the next
    # waiters in naive order enter.
    d.admitted.clear()
    for rid in blockers:
        d.now += 1.0
        d.run(RequestCompleted(rid, True))
    remaining = [w for w in waiters if w not in forced]
    free_slots = max(0, k - len(forced))
    expected = [w.program_id for w in naive_order(remaining, d.now, resume_order)][:free_slots]
    assert d.admitted == expected
