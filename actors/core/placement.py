"""Initial binding of a new Program generation to its home rank (docs/program-scheduling.md §9).

Binding only picks ``home_target`` (= the first ``last_target``) of a new generation; admission
and resume decide the actual placement.  The table is keyed by ``(model_pool, program_id)``:
an existing binding is reused while its target is still a candidate, otherwise the strategy
chooses among the candidates sorted by ``target_id``.

Strategies (``binding_strategy``):

* ``consistent_hash``: a ring of ``hash_virtual_nodes`` points per target, point ``i`` of target
  ``t`` at ``h("t:i")``; the owner of ``placement_hash_key`` is the first point ``>= h(key)``,
  wrapping.  ``h`` = first 8 bytes of blake2b (stable across processes, unlike ``hash()``);
  the reference's mcrouter furc hash is not reproduced (documented deviation), so rings are
  equally balanced but place keys differently.
* ``program_round_robin``: a per-pool counter over the sorted targets.
* ``least_program_count``: min ``(accounted_programs, target_id)``.
* ``reasoning_token_balance``: max ``capacity - accounted_tokens``, ties to the smaller id.
* ``cache_aware``: keep the immediately admissible candidates (all if none), then prefer the
  target whose committed routing texts share the longest prefix with this request's text
  (at least half of it); otherwise the lowest ``kv_pressure``.  The prefix table learns a
  placement only when a request is dispatched (``commit_placement``).
"""

from __future__ import annotations

import bisect
import hashlib
from collections import deque

from attrs import frozen

from actors.core.ids import ProgramKey, TargetId

CACHE_AWARE_TEXTS_PER_TARGET = 64
CACHE_AWARE_MIN_MATCH_RATIO = 0.5
CACHE_AWARE_PREFIX_CHARS = 4096


def stable_hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@frozen
class Candidate:
    target_id: TargetId
    accounted_programs: int
    accounted_tokens: float
    capacity_tokens: int | None
    kv_pressure: float
    immediately_admissible: bool


class HashRing:
    __slots__ = ("points", "owners")

    def __init__(self, targets: tuple[TargetId, ...], virtual_nodes: int) -> None:
        pts: dict[int, TargetId] = {}
        for t in targets:  # sorted order; a colliding later point wins, as in the reference
            for i in range(virtual_nodes):
                pts[stable_hash64(f"{t}:{i}")] = t
        self.points = sorted(pts)
        self.owners = [pts[k] for k in self.points]

    def owner(self, key: str) -> TargetId:
        i = bisect.bisect_left(self.points, stable_hash64(key))
        return self.owners[i % len(self.owners)]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Binder:
    """The binding table plus per-strategy state."""

    __slots__ = ("strategy", "virtual_nodes", "bindings", "_rr", "_rings", "_texts")

    def __init__(self, strategy: str, virtual_nodes: int) -> None:
        self.strategy = strategy
        self.virtual_nodes = virtual_nodes
        self.bindings: dict[ProgramKey, TargetId] = {}
        self._rr: dict[str, int] = {}
        self._rings: dict[tuple[TargetId, ...], HashRing] = {}
        self._texts: dict[TargetId, deque[str]] = {}

    def bind(self, key: ProgramKey, hash_key: str, candidates: list[Candidate], text: str | None) -> TargetId | None:
        if not candidates:
            return None
        existing = self.bindings.get(key)
        if existing is not None and any(c.target_id == existing for c in candidates):
            return existing
        cands = sorted(candidates, key=lambda c: c.target_id)
        chosen = self._choose(key.model_pool, hash_key, cands, text)
        self.bindings[key] = chosen
        return chosen

    def bind_ids(self, key: ProgramKey, hash_key: str, sorted_ids: tuple[TargetId, ...]) -> TargetId | None:
        """``bind`` for the strategies that need no per-target accounting (hash, round robin)."""
        if not sorted_ids:
            return None
        existing = self.bindings.get(key)
        if existing is not None and existing in sorted_ids:
            return existing
        if self.strategy == "program_round_robin":
            n = self._rr.get(key.model_pool, 0)
            self._rr[key.model_pool] = n + 1
            chosen = sorted_ids[n % len(sorted_ids)]
        else:
            chosen = self._ring(sorted_ids).owner(hash_key)
        self.bindings[key] = chosen
        return chosen

    def _ring(self, ids: tuple[TargetId, ...]) -> HashRing:
        ring = self._rings.get(ids)
        if ring is None:
            if len(self._rings) > 64:
                self._rings.clear()
            ring = self._rings[ids] = HashRing(ids, self.virtual_nodes)
        return ring

    def _choose(self, pool: str, hash_key: str, cands: list[Candidate], text: str | None) -> TargetId:
        s = self.strategy
        if s == "program_round_robin":
            n = self._rr.get(pool, 0)
            self._rr[pool] = n + 1
            return cands[n % len(cands)].target_id
        if s == "least_program_count":
            return min(cands, key=lambda c: (c.accounted_programs, c.target_id)).target_id
        if s == "reasoning_token_balance":
            return min(cands, key=lambda c: (-((c.capacity_tokens or 0) - c.accounted_tokens), c.target_id)).target_id
        if s == "cache_aware":
            return self._cache_aware(cands, text)
        return self._ring(tuple(c.target_id for c in cands)).owner(hash_key)

    def _cache_aware(self, cands: list[Candidate], text: str | None) -> TargetId:
        pool = [c for c in cands if c.immediately_admissible] or cands
        if text:
            probe = text[:CACHE_AWARE_PREFIX_CHARS]
            best: tuple[int, float, str] | None = None
            for c in pool:
                match = max((_common_prefix(probe, t) for t in self._texts.get(c.target_id, ())), default=0)
                if match > 0 and match >= CACHE_AWARE_MIN_MATCH_RATIO * len(probe):
                    k = (-match, c.kv_pressure, c.target_id)
                    if best is None or k < best:
                        best = k
            if best is not None:
                return TargetId(best[2])
        return min(pool, key=lambda c: (c.kv_pressure, c.target_id)).target_id

    def commit_placement(self, text: str | None, target: TargetId) -> None:
        """cache_aware learns ``text -> target`` once a request was actually dispatched there."""
        if self.strategy != "cache_aware" or not text:
            return
        texts = self._texts.get(target)
        if texts is None:
            texts = self._texts[target] = deque(maxlen=CACHE_AWARE_TEXTS_PER_TARGET)
        texts.append(text[:CACHE_AWARE_PREFIX_CHARS])

    def release(self, key: ProgramKey) -> None:
        self.bindings.pop(key, None)

    def restore(self, key: ProgramKey, target: TargetId) -> None:
        """``key`` is bound to ``target`` again (a failover's move given back, docs/program-scheduling.md §9.1)."""
        self.bindings[key] = target

    def remove_target(self, target: TargetId) -> None:
        for k in [k for k, t in self.bindings.items() if t == target]:
            del self.bindings[k]
        self._texts.pop(target, None)
