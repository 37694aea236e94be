"""The edge's side of the queue ETA (docs/program-scheduling.md §13).

* ``x-agentd-max-queue-seconds``: the client's bound on its queue wait, plain decimal seconds >= 0
  (``0`` = do not queue).  :func:`max_queue_bound` parses it; a bad value is a 400 naming the
  header.  The scheduler refuses at once (429 ``queue_wait_exceeds_bound`` with ``Retry-After``) a
  request whose queue ETA exceeds it.
* :class:`QueueWatch`: what the Program dispatcher last heard about a waiting streaming request
  (``QueuePosition`` notices); the SSE keep-alive (``limits.sse_keepalive_seconds``) sends
  ``: queued position=P eta=E.Es`` instead of ``: keep-alive`` while the request waits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import attrs

from daemon.http.errors import ApiError

MAX_QUEUE_HEADER = "x-agentd-max-queue-seconds"
# a plain decimal number (float() also takes "1_0", "١٠" and "1e3"; a header value is ASCII text)
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def max_queue_bound(headers: Mapping[str, str]) -> float | None:
    """The request's queue-wait bound in seconds, None without the header; ApiError 400 when bad."""
    raw = headers.get(MAX_QUEUE_HEADER)
    if raw is None:
        return None
    text = raw.strip()
    value = float(text) if len(text) <= 32 and _SECONDS.fullmatch(text) else math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ApiError(
            400,
            f"invalid {MAX_QUEUE_HEADER} header: must be seconds >= 0 written as plain decimal digits with"
            f" at most one point, at most 32 characters (0, 2.5), got {raw[:40]!r}",
            code="invalid_header",
            param=MAX_QUEUE_HEADER,
        )
    return value


@attrs.define(eq=False)
class QueueWatch:
    """The latest queue position and ETA of one waiting request (written by its dispatcher, read by
    its SSE keep-alive; both run in the request's own tasks)."""

    waiting: bool = False
    position: int = 0
    eta_seconds: float = 0.0
    told_at: float = 0.0

    def tell(self, position: int, eta_seconds: float, now: float) -> None:
        self.waiting = True
        self.position = position
        self.eta_seconds = eta_seconds
        self.told_at = now

    def done(self) -> None:
        self.waiting = False

    def comment(self) -> bytes | None:
        """The SSE comment while waiting, else None: the scheduler's latest position and ETA as
        told (re-told at every tick; the edge does not count it down)."""
        if not self.waiting:
            return None
        return f": queued position={self.position} eta={self.eta_seconds:.1f}s\n\n".encode()
