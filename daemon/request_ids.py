"""Request ids: ``agentd-<32 hex digits>``, a random (version 4) UUID per request.

Unique across restarts and replicas (no counter that starts again at 1), so logs, metrics and the
engine's own request ids of two daemons never collide.  A client's ``X-Request-Id`` (or body
``request_id``) is kept beside it as ``ProxyRequest.client_request_id``; the id sent to the
worker joins both (:func:`upstream_request_id`), so a client's id - and a batch job tag in it
(docs/batch.md §2.1) - reaches the engine but is never its id alone (docs/operations.md,
"Request ids").

Deterministic runs (``agentd simulate``, tests) pass a seeded ``random.Random``; the daemon
otherwise draws from the operating system's randomness.
"""

from __future__ import annotations

import random
import uuid

PREFIX = "agentd-"
REQUEST_ID_SEED = 0x1D5  # the seeded generator of deterministic runs


class RequestIds:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng

    def new(self) -> str:
        if self._rng is None:
            return PREFIX + uuid.uuid4().hex
        return PREFIX + uuid.UUID(int=self._rng.getrandbits(128), version=4).hex


def upstream_request_id(request_id: str, client_request_id: str | None) -> str:
    """The id a worker sees: the client's id (when it sent one) joined to agentd's unique id."""
    return request_id if not client_request_id else f"{client_request_id}-{request_id}"
