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

import os
import random
import uuid

PREFIX = "agentd-"
REQUEST_ID_SEED = 0x1D5  # the seeded generator of deterministic runs


_BATCH = 256  # ids drawn per read of the operating system's randomness
# forks of this process so far, counted in the child: a pool drawn before a fork is not used after
# it (no getpid system call per id, docs/benchmarks.md §10.2.4)
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class RequestIds:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng
        # random bytes for the next ids: one read of the OS's randomness per _BATCH ids; drawn
        # again in a forked child (its parent's pool would repeat the parent's ids)
        self._pool = b""
        self._at = 0
        self._fork = -1  # the fork generation the pool was drawn in

    def new(self) -> str:
        if self._rng is not None:
            return PREFIX + uuid.UUID(int=self._rng.getrandbits(128), version=4).hex
        at = self._at
        if at >= len(self._pool) or self._fork != _forks[0]:
            self._pool, self._fork, at = os.urandom(16 * _BATCH), _forks[0], 0
        self._at = at + 16
        digits = self._pool[at : at + 16].hex()
        # what uuid.UUID(bytes=..., version=4).hex gives: version nibble 4, variant bits 10
        return f"{PREFIX}{digits[:12]}4{digits[13:16]}{'89ab'[int(digits[16], 16) & 3]}{digits[17:]}"


def upstream_request_id(request_id: str, client_request_id: str | None) -> str:
    """The id a worker sees: the client's id (when it sent one) joined to agentd's unique id."""
    return request_id if not client_request_id else f"{client_request_id}-{request_id}"
