"""Every message that travels between the Program-scheduling actors (docs/architecture.md §3).

One value type per fact: what the scheduler actor receives *is* the pure core's input event
(``actors.core.events``: ``RequestSubmitted``, ``RequestCompleted``, ``RequestAbandoned``,
``TimerFired``, ``ObservationReceived``, ``RepairTick``), and what a Program actor receives *is* the
core's timer effect (``ArmTimer``, ``CancelTimer``). The one actor-level fact is
:class:`ObservationRoundStarted` (one scrape round of every target). Nothing is translated on the
way, so the fields the edge filled in reach the core unchanged. Every message is a frozen attrs
value that cattrs can (un)structure, so the messages could cross a process boundary; the in-process
reply channel therefore travels beside the message, in a :class:`Submission`, never inside it.

Flow::

    HTTP handler --Submission(RequestSubmitted, reply)--> scheduler actor --Admitted|Rejection--> handler
    HTTP handler --RequestCompleted | RequestAbandoned--> scheduler actor
    observation pacer --ObservationRoundStarted, RepairTick--> scheduler actor
    rank actor (one per DP rank) --ObservationReceived--> scheduler actor
    scheduler    --ArmTimer | CancelTimer--> Program actor (via the registry); retire = inbox closed
    Program actor --TimerFired--> scheduler actor

Replies are :class:`Admitted` (the target to forward to) or the core's
:class:`~actors.core.errors.Rejection` (status, reason, message, Retry-After), preceded, when the
submission asked for them, by :class:`QueuePosition` notices while the request waits.
"""

from __future__ import annotations

from typing import Any, Protocol

from attrs import frozen

from actors.core.config import BackendTarget
from actors.core.effects import ArmTimer, CancelTimer
from actors.core.errors import Rejection
from actors.core.events import (
    BatchSubmitted,
    InteractiveSubmitted,
    ObservationReceived,
    RepairTick,
    RequestAbandoned,
    RequestCompleted,
    RequestRequeued,
    RequestSubmitted,
    TimerFired,
)

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
    # a long prefill the scheduler may ask back before its first token (docs/priority.md §3,
    # "Re-queueing a blocking long prefill"): the proxy keeps it re-dispatchable
    requeueable: bool = False


@frozen
class QueuePosition:
    """The request waits in the scheduler's queue: its place in line and expected wait
    (docs/program-scheduling.md §13).  Sent before the final ``Admitted``/``Rejection`` to
    submissions that asked for it (``Submission.queue_updates``): once when the request is queued,
    then at every tick; never blocks (dropped when the handler has not read the previous one)."""

    request_id: str
    position: int
    eta_seconds: float


Reply = Admitted | Rejection | QueuePosition


class ReplySink(Protocol):
    """Where the scheduler actor's answers to one submission go: an in-process reply channel
    (``trio.MemorySendChannel[Reply]``), or a relay connection's lease that turns the answer into
    its ``Grant``/``Refuse`` frame (docs/architecture.md §9).  ``send_nowait`` raises
    ``trio.BrokenResourceError`` when nobody waits for the answer any more; ``close`` ends the
    sink (after the final answer, or without one when the scheduler stops)."""

    def send_nowait(self, value: Reply, /) -> None: ...
    def close(self) -> None: ...
    def statistics(self) -> Any: ...


@frozen(eq=False)
class Submission:
    """In-process delivery of a ``RequestSubmitted`` (or ``BatchSubmitted``) with the one-shot channel for its reply.

    Not a message (a channel is not a value): a transport across processes would carry the
    event and map ``reply`` to its connection.  ``eq=False``: a channel has identity only.
    """

    event: RequestSubmitted | BatchSubmitted | InteractiveSubmitted | RequestRequeued
    reply: ReplySink
    # send QueuePosition notices while it waits (the reply channel needs a buffer of at least 2,
    # so that a notice never takes the room of the final reply)
    queue_updates: bool = False


# ---------------------------------------------------------------------------------------------
# Observation rounds (observation pacer -> scheduler)
# ---------------------------------------------------------------------------------------------


@frozen
class ObservationRoundStarted:
    """A scrape round of these targets begins now: the scheduler checkpoints each live target's
    ledger (one core ``ObservationStarted`` per target, the epoch protocol)."""

    epoch: int
    target_ids: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Mailbox types
# ---------------------------------------------------------------------------------------------

ProgramCommand = ArmTimer | CancelTimer

SchedulerMessage = (
    RequestSubmitted
    | RequestCompleted
    | RequestAbandoned
    | TimerFired
    | ObservationRoundStarted
    | ObservationReceived
    | RepairTick
)

SchedulerInboxItem = Submission | SchedulerMessage
