"""``SchedulerState``: every piece of Program-scheduling state, in one record with one writer.

The scheduler actor owns one ``SchedulerState`` and changes it only through ``scheduler.step``.
Every other core module takes it as its first argument; this module imports none of them, so the
core's modules import each other in one direction only::

    state <- lifecycle <- resume, repair <- binding <- topology <- timers <- handlers <- scheduler

(``program``, ``ledger``, ``queue``, ``placement``, ``stats`` and the value modules sit below
``state``; ``snapshot`` and ``invariants`` read it from the side.)
"""

from __future__ import annotations

from typing import cast

from actors.core.attained import AttainedService
from actors.core.attribution import TimeBook
from actors.core.batch_state import BatchState
from actors.core.config import DEFAULT_PRIORITY, BatchJobsConfig, PriorityConfig, ProgramSchedulingConfig
from actors.core.effects import Effect
from actors.core.eta import EtaBook
from actors.core.fairness import FairnessState
from actors.core.ids import ProgramKey, ProgramRef, RequestId, SeqCounter, TargetId
from actors.core.interactive_state import InteractiveState
from actors.core.model import Dispatch, Lineage, Program, RankState, RequestHints
from actors.core.placement import Binder
from actors.core.queue import RequestPool
from actors.core.stats import ProgressTtlFactors, ResumeHitWindow
from actors.core.tool_retention import ToolGapModel

# (target id, worker url, DP rank, index) of one target, as a pool's target list is compared; the
# DP rank is None at DP size 1, where the id is the URL alone (docs/operations.md §13.10)
TargetSignature = tuple[str, str, int | None, int]


class SchedulerState:
    """All scheduling state (one writer: the scheduler actor)."""

    def __init__(
        self,
        cfg: ProgramSchedulingConfig,
        batch: BatchJobsConfig | None = None,
        priority: PriorityConfig | None = None,
    ) -> None:
        self.cfg = cfg
        # class bands, per-class caps and tenant fairness (docs/priority.md)
        self.prio: PriorityConfig = priority if priority is not None else DEFAULT_PRIORITY
        self.fair = FairnessState()
        # interactive-class requests the edge queued here (docs/priority.md §2)
        self.interactive = InteractiveState()
        # the batch class (docs/batch.md §2); None when [batch_jobs] is disabled
        self.batch: BatchState | None = None if batch is None or not batch.enabled else BatchState(batch)
        self.now = 0.0
        self.programs: dict[ProgramKey, Program] = {}
        self.pool = RequestPool()
        self.in_flight: dict[RequestId, Dispatch] = {}
        self.ranks: dict[TargetId, RankState] = {}
        self.pools: dict[str, tuple[TargetId, ...]] = {}
        self.pool_signatures: dict[str, tuple[TargetSignature, ...]] = {}
        self.revision = 0
        self.rank_queues: dict[TargetId, dict[ProgramRef, None]] = {}
        self.global_queues: dict[str, dict[ProgramRef, None]] = {}
        self.last_generations: dict[ProgramKey, int] = {}
        # release time of each released Program, in release order (oldest first): the tick
        # forgets generation histories from the front (sequences.prune_released_generations)
        self.released_at: dict[ProgramKey, float] = {}
        self.epochs = SeqCounter()
        self.timer_tokens = SeqCounter()
        self.request_seq = SeqCounter()
        self.binder = Binder(cfg.binding_strategy, cfg.hash_virtual_nodes)
        self.lineage = Lineage()
        self.dirty_ranks: dict[TargetId, None] = {}
        # request intervals of every rank: the TTL fit of a rank whose own window is not full yet
        self.warm_factors = ProgressTtlFactors(cfg.stats_window_size)
        # engine cache kept across pauses: scales the cache-miss impact in the TTL fit
        self.resume_hits = ResumeHitWindow(cfg.stats_window_size)
        # gaps after each tool, per model pool: the per-tool acting TTL (docs/program-scheduling.md §12)
        self.tools = ToolGapModel(cfg.tool_retention)
        self.forced_admissions = 0
        # where each Program's time goes (docs/program-scheduling.md §14)
        self.times = TimeBook()
        # service each task attained so far: the ``las`` resume order (docs/program-scheduling.md §5.1)
        self.attained = AttainedService()
        # drain windows, first ETAs and recent errors of the queue ETA (docs/program-scheduling.md §13)
        self.eta = EtaBook()
        # the light-tenant isolation view of the admission pass in progress (fairness_isolation)
        self.isolation: dict[TargetId, frozenset[str]] | None = None
        # (time, view) of the last admission pass's isolation view (diagnostics, the fairness machines)
        self.isolation_last: tuple[float, dict[TargetId, frozenset[str]]] | None = None
        # model pool -> (light tenant, rank) -> when the tenant was last present there (fairness_isolation)
        self.isolation_recent: dict[str, dict[tuple[str, TargetId], float]] = {}
        # model pool -> Program in a tool call -> (tenant, rank, when its request ended) (fairness_isolation)
        self.isolation_tool_calls: dict[str, dict[ProgramRef, tuple[str, TargetId, float]]] = {}
        # per-step scratch
        self.effects: list[Effect] = []
        self.touched: dict[ProgramRef, Program] = {}


def lookup_key(ref: ProgramRef) -> ProgramKey:
    """``ref.key`` for dict lookups only: the plain ``(model_pool, program_id)`` slice hashes and
    compares equal to the ``ProgramKey`` without building one (this runs several times per event).
    Use ``ref.key`` wherever the key is kept or its fields are read."""
    return cast(ProgramKey, ref[:2])


def queue_timeout(s: SchedulerState, hints: RequestHints) -> float:
    """How long a request may wait in the router's queue: ``queue_timeout_seconds``, or the
    request's own deadline when it is shorter (docs/program-scheduling.md §5, "Queue timeout")."""
    timeout = s.cfg.queue_timeout_seconds
    if hints.deadline_seconds is not None:
        timeout = min(timeout, hints.deadline_seconds)
    return timeout


def live_program(s: SchedulerState, ref: ProgramRef) -> Program | None:
    """The live Program of generation ``ref``, or None when that generation is gone."""
    p = s.programs.get(lookup_key(ref))
    return p if p is not None and p.ref == ref else None
