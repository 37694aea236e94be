"""The health board's rotation under any sequence of verdicts (docs/operations.md §11.3).

A Hypothesis state machine drives :class:`daemon.health.HealthBoard` with everything that writes
it: periodic checks, failed and good exchanges of real traffic (outlier ejection, connect
timeouts making a worker suspect), confirming probes, engines missing from a worker's ``/metrics``,
DP ranks the worker refused and the health rounds' verdicts on them.  After every step:

* only targets of healthy workers are in rotation, and the rotation is empty only when no worker
  is healthy (a 503 only when nothing could serve);
* a target whose engine is missing or whose rank was refused is in rotation only when every
  healthy target is in that state (the last resort); a suspect only when no healthy target with
  its engine is a non-suspect;
* a refused rank comes back exactly when a health round finds its engine no longer missing, and
  ``report_rank_refused`` says whether the rank was in rotation before.
"""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from actors.core.config import BackendTarget
from daemon.health import HealthBoard

URLS = ("http://w0:8000", "http://w1:8000")
TARGETS = tuple(
    BackendTarget(worker_url=url, dp_rank=rank, target_id=f"{url}@{rank}", index=2 * w + rank)
    for w, url in enumerate(URLS)
    for rank in (0, 1)
)
WORKER = st.sampled_from(URLS)
TARGET = st.sampled_from(TARGETS)


class RotationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.board = HealthBoard(TARGETS, failures_to_eject=2, successes_to_restore=2, outlier_failures=2)
        self.now = 0.0
        self.refused: set[str] = set()  # target ids refused and not yet settled back (the model)

    def run(self, fn: object, *args: object, **kwargs: object) -> object:
        """Board methods read the trio clock (a suspect's time): run each inside a tiny trio run."""

        async def call() -> object:
            return fn(*args, **kwargs)  # type: ignore[operator]

        return trio.run(call, clock=trio.testing.MockClock(autojump_threshold=0))

    @rule(url=WORKER, ok=st.booleans())
    def check(self, url: str, ok: bool) -> None:
        self.now += 1.0
        self.board.record_check(url, ok, "ok" if ok else "HTTP 503", self.now)

    @rule(url=WORKER, eject_now=st.booleans(), suspect=st.booleans())
    def exchange_failed(self, url: str, eject_now: bool, suspect: bool) -> None:
        self.run(self.board.report_failure, url, "failed", eject_now=eject_now, suspect=suspect)

    @rule(url=WORKER)
    def exchange_ok(self, url: str) -> None:
        self.board.report_success(url)

    @rule(url=WORKER, ok=st.booleans())
    def probe(self, url: str, ok: bool) -> None:
        # the health actor takes every probe request off the channel before a probe settles
        # (daemon.health.run_suspect_probes); settling without taking them would let the requests
        # of later suspicions pile up in a channel the real actor keeps empty
        self.take_probe_requests()
        self.run(self.board.settle_suspect, url, ok, "ok" if ok else "timeout", probe_started=0.0)

    def take_probe_requests(self) -> None:
        while True:
            try:
                self.board.probe_requests.receive_nowait()
            except trio.WouldBlock:
                return

    @rule(rank=TARGET, missing=st.booleans())
    def scrape(self, rank: BackendTarget, missing: bool) -> None:
        self.board.set_engine_missing(rank, missing)

    @rule(rank=TARGET)
    def rank_refused(self, rank: BackendTarget) -> None:
        was_in = rank in self.board.healthy_targets()
        already = rank.target_id in self.refused
        assert self.board.report_rank_refused(rank, "HTTP 400: data_parallel_rank 1 is out of range") == (
            was_in and not already
        )
        self.refused.add(rank.target_id)

    @rule(rank=TARGET, still_missing=st.booleans())
    def health_round(self, rank: BackendTarget, still_missing: bool) -> None:
        self.board.settle_rank_refused(rank, "engine 1 not listed" if still_missing else None)
        if not still_missing:
            self.refused.discard(rank.target_id)

    @invariant()
    def rotation_is_the_rule(self) -> None:
        board = self.board
        rotation = board.healthy_targets()
        healthy = [t for t in TARGETS if board.is_healthy(t)]
        assert set(rotation) <= set(healthy)
        assert bool(rotation) == bool(healthy)
        out = [t for t in healthy if board.engine_missing(t)]
        if any(t in out for t in rotation):
            assert set(out) == set(healthy), (rotation, out)  # the last resort only
        present = [t for t in healthy if t not in out]
        calm = [t for t in present if not board.worker(t.worker_url).suspect]
        if any(board.worker(t.worker_url).suspect for t in rotation):
            assert not calm, (rotation, calm)
        if calm:
            assert set(rotation) == set(calm)

    @invariant()
    def refused_ranks_stay_out_until_settled(self) -> None:
        for t in TARGETS:
            if t.target_id in self.refused:
                assert self.board.engine_missing(t)


TestRotationMachine = RotationMachine.TestCase
