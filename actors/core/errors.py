"""Errors of the scheduling core.

``...Error`` classes are bugs or invalid input; an expected refusal is not an exception but a
``Reject`` effect carrying a :class:`Rejection` reason and an HTTP ``status_hint``.
"""

from __future__ import annotations

from attrs import frozen


class CoreError(Exception):
    """Base class of core errors."""


class IllegalTransition(CoreError):
    """A lifecycle transition that the transition table does not allow.

    Raised *before* anything is changed, so the Program record is left untouched.
    """

    def __init__(self, from_state: str, trigger: str) -> None:
        super().__init__(f"illegal Program transition: {trigger!r} from state {from_state!r}")
        self.from_state = from_state
        self.trigger = trigger


class InvariantViolation(CoreError):
    """``invariants.check`` found a broken invariant (a bug in the core)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class InvalidEvent(CoreError):
    """An event that names a field with an impossible value (for example a duplicate request id)."""


@frozen
class Rejection:
    """Why a request was refused, with the HTTP status the edge answers.

    The same value travels from the core (``Reject`` effects) or a dispatcher to the HTTP edge,
    which renders it as an OpenAI-style error whose ``code`` is ``reason`` (docs/architecture.md
    §5).  ``retry_after_seconds`` becomes a ``Retry-After`` header when set.
    """

    reason: str
    status_hint: int
    message: str
    retry_after_seconds: float | None = None


QUEUE_TIMEOUT = Rejection(
    reason="queue_timeout", status_hint=429, message="Program request exceeded its admission queue timeout"
)
# an identity-free interactive request queued in the scheduler (docs/priority.md §5.5): same reason
INTERACTIVE_QUEUE_TIMEOUT = Rejection(
    reason="queue_timeout", status_hint=429, message="interactive request exceeded its admission queue timeout"
)
NO_TARGETS = Rejection(reason="no_targets", status_hint=503, message="no healthy DP targets are available")
