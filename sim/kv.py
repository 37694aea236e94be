"""Paged KV block pool with vLLM-style prefix caching (pure, no I/O).

Model (docs/simulator.md §1, "Paged KV cache" and "Prefix caching"):

* Blocks ``1..num_gpu_blocks-1`` are usable; block 0 is vLLM's reserved null block.
* A request's KV is a list of block ids.  Only *full* blocks are hashed: the hash of block ``i`` is
  ``hash((parent_hash, tuple(block_token_ids)))`` chained from a fixed root derived from the seed;
  a ``cache_salt`` is mixed into the first block only, which re-roots the whole chain.  Hashes are
  Python ``hash`` of int tuples, which is deterministic across processes.
* The free list is an LRU queue (``OrderedDict``): allocation pops from the head and, if the popped
  block still carries a hash, evicts it from the hash map; freeing a request releases its blocks in
  reverse order (deepest block first) to the tail, so shared prefixes survive longest.  A cache hit
  on a block with ``ref_cnt == 0`` removes it from the free queue ("touch").  Identical blocks are not
  de-duplicated: ``cached`` maps a hash to its oldest block and ``dups`` keeps the younger copies,
  promoted when the oldest is evicted.
* ``usage = 1 - free / (num_gpu_blocks - 1)``; evictable cached blocks count as free.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Sequence


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
    while i < n_blocks:
        start = i * block_size - base
        block = tuple(tokens[start : start + block_size])
        parent = hash((parent, block, salt)) if i == 0 and salt is not None else hash((parent, block))
        append(parent)
        i += 1


class BlockPool:
    """The block table of one engine: reference counts, hashes, LRU free queue."""

    __slots__ = ("num_gpu_blocks", "ref_cnt", "block_hash", "cached", "dups", "free_queue", "evictions")

    def __init__(self, num_gpu_blocks: int) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2, got {num_gpu_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.ref_cnt: list[int] = [0] * num_gpu_blocks
        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        self.cached: dict[int, int] = {}  # hash -> oldest block carrying it
        self.dups: dict[int, list[int]] = {}  # hash -> younger blocks carrying it (rare)
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / (self.num_gpu_blocks - 1)

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def find_hits(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Blocks of the longest cached prefix of ``hashes`` (at most ``max_blocks``)."""
        # C-speed lookups of the whole candidate range, then cut at the first miss
        found = list(map(self.cached.get, hashes[:max_blocks]))
        try:
            first_miss = found.index(None)
        except ValueError:
            first_miss = len(found)
        del found[first_miss:]
        return found  # type: ignore[return-value]  # no None is left

    def count_evictable(self, blocks: Sequence[int]) -> int:
        return list(map(self.ref_cnt.__getitem__, blocks)).count(0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cache hits, removing unreferenced ones from the free queue."""
        ref = self.ref_cnt
        free_queue = self.free_queue
        for b in blocks:
            r = ref[b]
            if not r:
                del free_queue[b]
            ref[b] = r + 1

    def allocate(self, n: int, out: list[int]) -> None:
        """Pop ``n`` blocks from the free-queue head into ``out`` (caller checked ``num_free``)."""
        self.allocate_each([out] * n)

    def allocate_each(self, outs: list[list[int]]) -> None:
        """Pop one block from the free-queue head into each list of ``outs``, in order."""
        popitem = self.free_queue.popitem
        ref = self.ref_cnt
        block_hash = self.block_hash
        cached = self.cached
        dups = self.dups
        for out in outs:
            b = popitem(last=False)[0]
            h = block_hash[b]
            if h is not None:
                if not dups and cached[h] == b:  # the common eviction, inlined
                    block_hash[b] = None
                    del cached[h]
                    self.evictions += 1
                else:
                    self._evict(b)
            ref[b] = 1
            out.append(b)

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        assert h is not None
        self.block_hash[b] = None
        self.evictions += 1
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
        """Release a request's blocks, tail first, to the free-queue tail."""
        ref = self.ref_cnt
        free_queue = self.free_queue
        for b in reversed(blocks):
            r = ref[b] - 1
            ref[b] = r
            if not r:
                free_queue[b] = None
