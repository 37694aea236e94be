"""The interactive class's part of the scheduler state (docs/priority.md §2); decisions are in ``interactive``."""

from __future__ import annotations

from attrs import define

from actors.core.ids import RequestId, TargetId


@define(slots=True, eq=False)
class InteractivePending:
    request_id: RequestId
    tenant: str
    priority: int
    prompt_tokens: int
    reserved_output_tokens: int
    model_pool: str
    arrived_at: float
    queue_deadline: float
    seq: int
    avoid_workers: frozenset[str] = frozenset()  # a failover's (docs/program-scheduling.md §9.1)

    @property
    def need_tokens(self) -> int:
        return self.prompt_tokens + self.reserved_output_tokens


@define(slots=True, eq=False)
class InteractiveRunning:
    request_id: RequestId
    tenant: str
    priority: int
    target_id: TargetId
    charged_tokens: float
    reserved_output_tokens: int
    dispatched_at: float
    on_ledger: bool = True  # False once its rank left the topology


class InteractiveState:
    """Waiting and running interactive requests (one writer: the scheduler actor)."""

    __slots__ = (
        "pending",
        "running",
        "admitted_count",
        "rejected_count",
        "batch_preemptions",
        "program_pauses",
        "seq",
        "claimed",
        "last_arrival",
        "pool_last_arrival",
        "reserved",
    )

    def __init__(self) -> None:
        # insertion order = arrival order
        self.pending: dict[RequestId, InteractivePending] = {}
        self.running: dict[RequestId, InteractiveRunning] = {}
        self.admitted_count = 0
        self.rejected_count = 0
        self.batch_preemptions = 0
        self.program_pauses = 0
        self.seq = 0
        self.claimed = False  # some rank carries an interactive claim (cleared by the next pass)
        self.last_arrival: float | None = None  # when the latest interactive request was submitted
        # per model pool: its latest interactive arrival, and the ranks reserved for interactive
        # since its window opened (``interactive_reserved_ranks``, docs/priority.md §2)
        self.pool_last_arrival: dict[str, float] = {}
        self.reserved: dict[str, tuple[TargetId, ...]] = {}
