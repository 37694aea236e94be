"""Every message that travels between the Program-scheduling actors.

Naming follows the architecture guide: facts are past-tense nouns (``Completed``,
``TimerFired``, ``ObservationReceived``), commands are imperative (``ArmTimer``, ``CancelTimer``),
replies are ``Admitted``/``Rejected``.  All messages are frozen attrs values; those carrying a
reply channel use ``eq=False`` (a channel has identity, not value).

Flow::

    HTTP handler --Submit(reply)--> scheduler actor --Admitted|Rejected--> handler
    HTTP handler --Completed | Abandoned--> scheduler actor
    rank actors  --ObservationStarted, ObservationReceived, RepairTick--> scheduler actor
    scheduler    --ArmTimer | CancelTimer--> Program actor (via the registry); Retire = inbox closed
    Program actor --TimerFired--> scheduler actor
"""

from __future__ import annotations

from typing import Any

import trio
from attrs import frozen

from actors.core.config import BackendTarget
from actors.observations import EngineSample

# ---------------------------------------------------------------------------------------------
# Requests (HTTP handler -> scheduler) and replies
# ---------------------------------------------------------------------------------------------


@frozen
class Admitted:
    """The request may be dispatched to ``target`` (the Program's placement)."""

    request_id: str
    target: BackendTarget
    program: str  # redacted Program id, for logs
    queue_seconds: float


@frozen
class Rejected:
    """The request will not be dispatched; ``status`` is the HTTP status to answer."""

    request_id: str
    reason: str  # bounded enum: "queue_timeout" | "no_targets" | ...
    status: int
    message: str
    retry_after_seconds: float | None


Reply = Admitted | Rejected


@frozen(eq=False)
class Submit:
    """A request carrying Program identity arrived; answer exactly once on ``reply``."""

    request_id: str
    parsed_identity: Any  # actors.core.identity.ParsedIdentity
    model: str | None
    estimated_prompt_tokens: int
    routing_text: str
    reply: trio.MemorySendChannel[Reply]


@frozen
class Completed:
    """The dispatched request ended (reported exactly once per admitted request)."""

    request_id: str
    success: bool
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    decode_seconds: float | None
    error: str | None


@frozen
class Abandoned:
    """The request left before being dispatched or without a result (client gone, cancelled)."""

    request_id: str


# ---------------------------------------------------------------------------------------------
# Timers (scheduler <-> Program actors)
# ---------------------------------------------------------------------------------------------


@frozen
class ArmTimer:
    """(Re-)arm timer ``kind`` of one Program generation; replaces any timer of that kind."""

    kind: str
    deadline: float  # absolute trio clock
    token: int


@frozen
class CancelTimer:
    kind: str


ProgramCommand = ArmTimer | CancelTimer


@frozen
class TimerFired:
    """A Program actor's timer reached its deadline; stale tokens are dropped by the core."""

    program: Any  # actors.core.ids.ProgramRef
    kind: str
    token: int
    deadline: float


# ---------------------------------------------------------------------------------------------
# Observations (rank actors -> scheduler)
# ---------------------------------------------------------------------------------------------


@frozen
class ObservationStarted:
    """A scrape of these targets begins now (the core checkpoints its ledger: epoch protocol)."""

    epoch: int
    target_ids: tuple[str, ...]


@frozen
class ObservationReceived:
    """What one scrape said about one target; ``sample`` None = no series for its engine."""

    epoch: int
    target_id: str
    observed_at: float
    sample: EngineSample | None


@frozen
class RepairTick:
    """The periodic decision tick (capacity repair, TTL expiry, retention, scheduling)."""

    deadline: float


SchedulerMessage = Submit | Completed | Abandoned | TimerFired | ObservationStarted | ObservationReceived | RepairTick
