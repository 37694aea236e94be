"""The pure, sans-IO scheduling core: no trio, httpx, quart, prometheus, clock, logging or randomness."""

# Public API of the Program-scheduling state machine (re-exports).
from actors.core.effects import (  # noqa: E402
    AdmissionCapacitySnapshot,
    Admit,
    ArmTimer,
    CacheDiscontinuity,
    CacheMissImpactObserved,
    CancelTimer,
    CapacitySourceChanged,
    CompletionIgnored,
    Effect,
    QueueWaitObserved,
    Reject,
    RequestIntervalObserved,
    RetireProgram,
    SharedPrefixObserved,
    SpawnProgram,
    StaleObservationDropped,
    Transition,
    TtlArmed,
)
from actors.core.errors import IllegalTransition, InvalidEvent, InvariantViolation, Rejection  # noqa: E402
from actors.core.events import (  # noqa: E402
    ACTING_TTL,
    FORCE_RESUME,
    PAUSED_RETENTION,
    QUEUE_TIMEOUT,
    TIMER_KINDS,
    Event,
    ObservationReceived,
    ObservationStale,
    ObservationStarted,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestSubmitted,
    TargetsChanged,
    TimerFired,
)
from actors.core.ids import ProgramKey, ProgramRef, RequestId, TargetId, redacted_id  # noqa: E402
from actors.core.invariants import check as check_invariants  # noqa: E402
from actors.core.model import RequestHints, Usage  # noqa: E402
from actors.core.scheduler import Step, initial_state, step  # noqa: E402
from actors.core.snapshot import snapshot  # noqa: E402
from actors.core.state import SchedulerState  # noqa: E402
