"""Native request-level routing policies for requests without a Program identity.

Each policy is a small object with ``choose(healthy, key_material, in_flight) -> BackendTarget``;
``healthy`` is the non-empty tuple of currently healthy targets in configuration order (the stable
ordering key is ``BackendTarget.index``), ``in_flight`` maps ``target.index`` to the number of leases
currently held on it.  Policies never see unhealthy targets, so a target that fails its health
check leaves rotation at once and comes back when it recovers.

* ``round_robin``     - a counter over the healthy list.
* ``random``          - uniform pick with an injected ``random.Random`` (seeded by the caller).
* ``power_of_two``    - two distinct random candidates, the one with fewer in-flight requests wins
                        (ties -> lower index).
* ``consistent_hash`` - a hash ring with virtual nodes over *all* targets; a key walks clockwise to
                        the first healthy target, so only keys of a failed target move.  The key is
                        the ``x-session-id`` header, else a known agent session header, else a stable
                        hash of the routing text (system prompt + first user message), else of the
                        canonical request body: never one constant key for all chat traffic.

Hashing uses BLAKE2b (stable across processes and runs, unlike ``hash()``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from actors.core.config import BackendTarget

POLICIES: tuple[str, ...] = ("round_robin", "random", "power_of_two", "consistent_hash")
# Session headers checked in this order after x-session-id (lower-case).
SESSION_HEADERS: tuple[str, ...] = (
    "x-session-id",
    "x-claude-code-session-id",
    "session-id",
    "x-codex-session-id",
)
HASH_VIRTUAL_NODES = 160


class Policy(Protocol):
    name: str

    def choose(
        self,
        healthy: Sequence[BackendTarget],
        key: str,
        in_flight: Sequence[int],
    ) -> BackendTarget: ...


def stable_hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def routing_key(headers: Mapping[str, str], routing_text: str, body: Mapping[str, Any]) -> str:
    """The consistent-hash key of one request (see the module docstring for the precedence)."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return f"header:{name}:{value}"
    if routing_text:
        return f"text:{routing_text}"
    return "body:" + json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._counter = 0

    def choose(self, healthy: Sequence[BackendTarget], key: str, in_flight: Sequence[int]) -> BackendTarget:
        target = healthy[self._counter % len(healthy)]
        self._counter += 1
        return target


class RandomChoice:
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, healthy: Sequence[BackendTarget], key: str, in_flight: Sequence[int]) -> BackendTarget:
        return healthy[self._rng.randrange(len(healthy))]


class PowerOfTwo:
    name = "power_of_two"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, healthy: Sequence[BackendTarget], key: str, in_flight: Sequence[int]) -> BackendTarget:
        if len(healthy) == 1:
            return healthy[0]
        first, second = self._rng.sample(range(len(healthy)), 2)
        a, b = healthy[first], healthy[second]
        return min(a, b, key=lambda t: (in_flight[t.index], t.index))


class ConsistentHash:
    name = "consistent_hash"

    def __init__(self, targets: Sequence[BackendTarget], virtual_nodes: int = HASH_VIRTUAL_NODES):
        points: list[tuple[int, int]] = []
        for target in targets:
            for vnode in range(virtual_nodes):
                points.append((stable_hash64(f"{target.target_id}#{vnode}"), target.index))
        points.sort()
        self._hashes = [p[0] for p in points]
        self._owners = [p[1] for p in points]

    def choose(self, healthy: Sequence[BackendTarget], key: str, in_flight: Sequence[int]) -> BackendTarget:
        by_index = {t.index: t for t in healthy}
        start = bisect.bisect_left(self._hashes, stable_hash64(key))
        count = len(self._hashes)
        for step in range(count):
            owner = self._owners[(start + step) % count]
            target = by_index.get(owner)
            if target is not None:
                return target
        raise ValueError("consistent_hash: no healthy target on the ring")


def build_policy(name: str, targets: Sequence[BackendTarget], rng: random.Random) -> Policy:
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return RandomChoice(rng)
    if name == "power_of_two":
        return PowerOfTwo(rng)
    if name == "consistent_hash":
        return ConsistentHash(targets)
    raise ValueError(f"routing.policy must be one of {list(POLICIES)}, got {name!r}")
