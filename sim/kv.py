"""Paged KV block pool with vLLM-style prefix caching (pure, no I/O).

Model (docs/simulator.md §1, "Paged KV cache" and "Prefix caching"):

* Blocks ``1..num_gpu_blocks-1`` are usable; block 0 is vLLM's reserved null block.
* A request's KV is a list of block ids.  Only *full* blocks are hashed: the hash of block ``i`` is
  ``hash((parent_hash, tuple(block_token_ids)))`` chained from a fixed root derived from the seed;
  a ``cache_salt`` is mixed into the first block only, which re-roots the whole chain.  Hashes are
  Python ``hash`` of int tuples, which is deterministic across processes.
* The free list is an LRU queue: allocation pops from the head and, if the popped block still
  carries a hash, evicts it from the hash map; freeing a request releases its blocks in reverse
  order (deepest block first) to the tail, so shared prefixes survive longest.  A cache hit on a
  block with ``ref_cnt == 0`` removes it from the free queue ("touch").  Identical blocks are not
  de-duplicated: ``cached`` maps a hash to its oldest block and ``dups`` keeps the younger copies,
  promoted when the oldest is evicted.
* The queue is stored as *segments* (docs/simulator.md §8.1): one list per ``free`` call, holding the
  blocks that call released in request order (so the queue order is each segment reversed, oldest
  segment first).  A request's chain leaves and re-enters the queue as one list slice instead of one
  ``OrderedDict`` operation per block.  The observable order (pops, evictions, hits) is exactly the
  per-block queue's, which ``tests/sim/test_kv_segments.py`` checks against a per-block reference
  model.  ``find_hits`` may start from a recently released chain that lost no block since
  (``_chain_hits``), which returns what the per-block lookups would.
* ``usage = 1 - free / (num_gpu_blocks - 1)``; evictable cached blocks count as free.
"""

from __future__ import annotations

import zlib
from array import array
from collections import deque
from collections.abc import Sequence
from itertools import compress, repeat
from operator import eq


def root_hash(seed: int) -> int:
    """The fixed parent hash of every chain's first block (vLLM's NONE_HASH)."""
    return hash(("agentd-sim-none-hash", seed))


def salt_key(cache_salt: str | None) -> int | None:
    if cache_salt is None:
        return None
    data = cache_salt.encode("utf-8")
    return zlib.crc32(data) * 1_000_003 + len(data)


def extend_block_hashes(
    hashes: list[int],
    tokens: Sequence[int],
    n_blocks: int,
    block_size: int,
    root: int,
    salt: int | None = None,
    offset: int | None = 0,
) -> None:
    """Extend ``hashes`` in place to ``n_blocks`` full blocks.

    ``tokens`` holds the token ids from block ``len(hashes)`` on (``offset`` = that block's first
    token index is subtracted), so callers pass only the new range.
    """
    i = len(hashes)
    if i >= n_blocks:
        return
    parent = hashes[-1] if hashes else root
    append = hashes.append
    base = i * block_size if offset is None else offset
    first = i * block_size - base
    size = (n_blocks - i) * block_size
    span = tokens[first : first + size]
    if first >= 0 and len(span) == size:  # the usual case: cut the blocks at C speed
        blocks = zip(*([iter(span)] * block_size), strict=True)
        if i == 0 and salt is not None:
            parent = hash((parent, next(blocks), salt))
            append(parent)
        for block in blocks:
            parent = hash((parent, block))
            append(parent)
        return
    while i < n_blocks:
        start = i * block_size - base
        block = tuple(tokens[start : start + block_size])
        parent = hash((parent, block, salt)) if i == 0 and salt is not None else hash((parent, block))
        append(parent)
        i += 1


_MAX_CHAINS = 32  # remembered chains per pool (the most recently released ones)


class BlockPool:
    """The block table of one engine: reference counts, hashes, LRU free queue of segments."""

    __slots__ = (
        "num_gpu_blocks",
        "block_hash",
        "cached",
        "dups",
        "evictions",
        "ref_cnt",
        "_num_free",
        "_segments",
        "_by_first",
        "_empty_segments",
        "_chains",
        "_evicted_at",
    )

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2, got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        self.cached: dict[int, int] = {}  # hash -> oldest block carrying it
        self.dups: dict[int, list[int]] = {}  # hash -> younger blocks carrying it (rare)
        self.evictions = 0
        self.ref_cnt: list[int] = [0] * num_gpu_blocks  # 0: in the free queue (block 0 is never used)
        self._num_free = num_gpu_blocks - 1
        # the free queue, head first: each segment holds its blocks in reverse queue order (the
        # order of the request that released them), so the queue head is segments[0][-1]
        initial = list(range(num_gpu_blocks - 1, 0, -1))
        self._segments: deque[list[int]] = deque([initial])
        self._by_first: dict[int, list[int]] = {initial[0]: initial}  # seg[0] -> seg (non-empty ones)
        self._empty_segments = 0  # emptied by touches, still in _segments
        # recently released chains, by the hash of their last block, with the eviction count when
        # they were released: candidates for find_hits
        self._chains: dict[int, tuple[list[int], int]] = {}
        self._evicted_at = array("q", [0]) * num_gpu_blocks  # block -> eviction count when last evicted

    @property
    def num_free(self) -> int:
        return self._num_free

    def usage(self) -> float:
        return 1.0 - self._num_free / (self.num_gpu_blocks - 1)

    def ref_count(self, b: int) -> int:
        return self.ref_cnt[b]

    def free_order(self) -> list[int]:
        """The free queue, head (next to be allocated) first."""
        order: list[int] = []
        for seg in self._segments:
            order.extend(reversed(seg))
        return order

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def find_hits(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Blocks of the longest cached prefix of ``hashes`` (at most ``max_blocks``)."""
        start = 0
        found: list[int | None] = []
        if self._chains and not self.dups:
            found = self._chain_hits(hashes, max_blocks)
            start = len(found)
        # C-speed lookups of the (rest of the) candidate range, then cut at the first miss
        found += map(self.cached.get, hashes[start:max_blocks])
        try:
            first_miss = found.index(None)
        except ValueError:
            first_miss = len(found)
        del found[first_miss:]
        return found  # type: ignore[return-value]  # no None is left

    def _chain_hits(self, hashes: Sequence[int], max_blocks: int) -> list[int | None]:
        """The blocks of the longest remembered chain that is a prefix of ``hashes`` and still
        cached, else [] (docs/simulator.md §8.1).

        A chain is found by its last hash (a chain hash stands for the whole prefix, as everywhere
        in the cache).  Its blocks carried their hashes when it was released and lose them only when
        evicted; with no duplicate blocks, a block carrying hash h is ``cached[h]``.  So a chain none
        of whose blocks was evicted since is exactly what looking its hashes up would return."""
        chains = self._chains
        evicted_at = self._evicted_at
        for size in sorted({len(c) for c, _ in chains.values()}, reverse=True):
            if size > max_blocks:
                continue
            key = hashes[size - 1]
            entry = chains.get(key)
            if entry is None or len(entry[0]) != size:
                continue
            chain, stamp = entry
            if stamp == self.evictions or max(map(evicted_at.__getitem__, chain)) <= stamp:
                return list(chain)
            del chains[key]  # a block of it was evicted since: forget it
        return []

    def remember_chain(self, blocks: Sequence[int]) -> None:
        """Remember a released request's cached blocks (each carries its chain hash) for find_hits."""
        if not blocks:
            return
        h = self.block_hash[blocks[-1]]
        if h is None:
            return
        chains = self._chains
        chains.pop(h, None)
        chains[h] = (list(blocks), self.evictions)
        if len(chains) > _MAX_CHAINS:
            del chains[next(iter(chains))]

    def count_evictable(self, blocks: Sequence[int]) -> int:
        return list(map(self.ref_cnt.__getitem__, blocks)).count(0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cache hits, removing unreferenced ones from the free queue."""
        ref = self.ref_cnt
        refs = list(map(ref.__getitem__, blocks))
        j = 0
        while True:  # each run of unreferenced hits leaves the queue as one slice
            try:
                j = refs.index(0, j)
            except ValueError:
                break
            j = self._take_run(blocks, j)
        for b in blocks:
            ref[b] += 1

    def _take_run(self, blocks: Sequence[int], j: int) -> int:
        """Remove the longest run ``blocks[j:k]`` that sits in one segment from the queue; returns k."""
        b = blocks[j]
        seg = self._by_first.get(b)
        i = 0
        if seg is None:  # a run starting inside a segment (duplicate blocks): find it
            seg, i = self._locate(b)
        size = min(len(seg) - i, len(blocks) - j)
        if seg[i : i + size] != blocks[j : j + size]:
            lo, hi = 1, size  # seg[i] == blocks[j]: a run of lo matches, of hi does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if seg[i : i + mid] == blocks[j : j + mid]:
                    lo = mid
                else:
                    hi = mid
            size = lo
        del seg[i : i + size]
        self._num_free -= size
        if i == 0:
            del self._by_first[b]
            if seg:
                self._by_first[seg[0]] = seg
            else:
                self._drop_empty_segment()
        return j + size

    def _locate(self, b: int) -> tuple[list[int], int]:
        for seg in self._segments:
            if b in seg:
                return seg, seg.index(b)
        raise AssertionError(f"block {b} is free but in no segment")

    def _drop_empty_segment(self) -> None:
        """Count a segment emptied in place; compact the deque when empties dominate it."""
        self._empty_segments += 1
        if self._empty_segments > 64 and 2 * self._empty_segments > len(self._segments):
            self._segments = deque(seg for seg in self._segments if seg)
            self._empty_segments = 0

    def _pop(self, n: int) -> list[int]:
        """Remove the ``n`` blocks at the queue head, head first."""
        segments = self._segments
        popped: list[int] = []
        while n:
            seg = segments[0]
            size = len(seg)
            if not size:
                segments.popleft()
                self._empty_segments -= 1
                continue
            if n >= size:
                del self._by_first[seg[0]]
                seg.reverse()
                popped += seg
                segments.popleft()
                n -= size
            else:
                take = seg[-n:]
                del seg[-n:]
                take.reverse()
                popped += take
                n = 0
        return popped

    def allocate(self, n: int, out: list[int]) -> None:
        """Pop ``n`` blocks from the free-queue head into ``out`` (caller checked ``num_free``)."""
        self.allocate_each([out] * n)

    def allocate_each(self, outs: list[list[int]]) -> None:
        """Pop one block from the free-queue head into each list of ``outs``, in order."""
        if len(outs) > self._num_free:
            raise ValueError(f"cannot allocate {len(outs)} blocks, {self._num_free} free")
        popped = self._pop(len(outs))
        self._num_free -= len(popped)
        ref = self.ref_cnt
        block_hash = self.block_hash
        cached = self.cached
        dups = self.dups
        evicted_at = self._evicted_at
        for out, b in zip(outs, popped, strict=True):
            h = block_hash[b]
            if h is not None:
                if not dups and cached[h] == b:  # the common eviction, inlined
                    block_hash[b] = None
                    del cached[h]
                    self.evictions += 1
                    evicted_at[b] = self.evictions
                else:
                    self._evict(b)
            ref[b] = 1
            out.append(b)

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        assert h is not None
        self.block_hash[b] = None
        self.evictions += 1
        self._evicted_at[b] = self.evictions
        younger = self.dups.get(h)
        if self.cached[h] == b:
            if younger:
                self.cached[h] = younger.pop(0)
            else:
                del self.cached[h]
        elif younger is not None:
            younger.remove(b)
        if younger is not None and not younger:
            del self.dups[h]

    def cache_blocks(self, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        """``cache_block`` for each pair, in order (one call per request and step)."""
        block_hash = self.block_hash
        cached = self.cached
        for b, h in zip(blocks, hashes, strict=True):
            if block_hash[b] is not None:
                continue
            block_hash[b] = h
            if h in cached:
                self.dups.setdefault(h, []).append(b)
            else:
                cached[h] = b

    def cache_block(self, b: int, h: int) -> None:
        if self.block_hash[b] is not None:
            return
        self.block_hash[b] = h
        if h in self.cached:
            self.dups.setdefault(h, []).append(b)
        else:
            self.cached[h] = b

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's blocks: those no other request holds go, tail first, to the queue tail."""
        ref = self.ref_cnt
        refs = list(map(ref.__getitem__, blocks))
        if refs.count(1) == len(refs):  # no block is shared with a running request: all are released
            released = list(blocks)
            for b in released:
                ref[b] = 0
        else:
            for b in blocks:
                ref[b] -= 1
            released = list(compress(blocks, map(eq, refs, repeat(1))))
        if released:
            self._num_free += len(released)
            self._segments.append(released)
            self._by_first[released[0]] = released
