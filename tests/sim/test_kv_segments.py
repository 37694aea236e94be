"""The segmented free queue of ``sim.kv.BlockPool`` against a per-block reference model.

The reference is the plain vLLM free-block queue (docs/simulator.md §1): one ``OrderedDict`` in
queue order, a reference count per block, allocation popping the head, ``free`` appending a
request's unreferenced blocks deepest first, a hit on an unreferenced block removing it from the
queue.  ``BlockPool`` stores the same queue as segments (docs/simulator.md §8); every observable
(blocks handed out, evictions, hits, the queue order, reference counts, the hash maps) must match
after every operation of random request lifecycles, including duplicate blocks and preemptions,
and lookups that start from a remembered chain (``remember_chain``) give the reference's hits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.kv import BlockPool, extend_block_hashes


class ReferencePool:
    """Per-block reference model of the pool (the pre-segment implementation, loops only)."""

    def __init__(self, num_gpu_blocks: int) -> None:
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        self.cached: dict[int, int] = {}
        self.dups: dict[int, list[int]] = {}
        self.queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_gpu_blocks))
        self.evictions = 0

    def find_hits(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        hits: list[int] = []
        for h in hashes[:max_blocks]:
            b = self.cached.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def count_evictable(self, blocks: Sequence[int]) -> int:
        return sum(1 for b in blocks if self.ref_cnt[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self.queue[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int, out: list[int]) -> None:
        for _ in range(n):
            b = self.queue.popitem(last=False)[0]
            h = self.block_hash[b]
            if h is not None:
                self.block_hash[b] = None
                self.evictions += 1
                younger = self.dups.get(h, [])
                if self.cached[h] == b:
                    if younger:
                        self.cached[h] = younger.pop(0)
                    else:
                        del self.cached[h]
                else:
                    younger.remove(b)
                if h in self.dups and not self.dups[h]:
                    del self.dups[h]
            self.ref_cnt[b] = 1
            out.append(b)

    def cache_blocks(self, blocks: Sequence[int], hashes: Sequence[int]) -> None:
        for b, h in zip(blocks, hashes, strict=True):
            if self.block_hash[b] is not None:
                continue
            self.block_hash[b] = h
            if h in self.cached:
                self.dups.setdefault(h, []).append(b)
            else:
                self.cached[h] = b

    def free(self, blocks: Sequence[int]) -> None:
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.queue[b] = None


def chain(family: int, length: int) -> list[int]:
    """Block hashes of a prompt: families share their first three blocks, then diverge."""
    return [(0 if i < 3 else family) * 1000 + i for i in range(length)]


def assert_same(pool: BlockPool, ref: ReferencePool) -> None:
    assert pool.free_order() == list(ref.queue)
    assert pool.num_free == len(ref.queue)
    assert [pool.ref_count(b) for b in range(1, pool.num_gpu_blocks)] == ref.ref_cnt[1:]
    assert pool.block_hash == ref.block_hash
    assert pool.cached == ref.cached
    assert pool.dups == ref.dups
    assert pool.evictions == ref.evictions


# one operation: (kind, a, b, c) with small integers, interpreted by run_ops
OPS = st.lists(
    st.tuples(
        st.sampled_from(["start", "start", "start", "free", "free", "grow", "recompute"]),
        st.integers(0, 5),
        st.integers(0, 14),
        st.integers(0, 4),
    ),
    max_size=60,
)


def run_ops(num_gpu_blocks: int, ops: list[tuple[str, int, int, int]]) -> None:
    pool = BlockPool(num_gpu_blocks)
    ref = ReferencePool(num_gpu_blocks)
    held: list[tuple[list[int], list[int]]] = []  # (blocks, hashes) of running requests, twice
    for kind, a, b, c in ops:
        if kind in ("start", "recompute"):
            # a request with the chain of family a, b full blocks and c partial/extra blocks;
            # "recompute" skips the prefix cache, computing cached blocks again (duplicates)
            hashes = chain(a, b)
            hits = [] if kind == "recompute" else pool.find_hits(hashes, b)
            assert hits == ([] if kind == "recompute" else ref.find_hits(hashes, b))
            evictable = pool.count_evictable(hits)
            assert evictable == ref.count_evictable(hits)
            need = b - len(hits) + c
            if need + evictable > pool.num_free:
                continue  # the engine would not admit it
            pool.touch(hits)
            ref.touch(hits)
            blocks, ref_blocks = list(hits), list(hits)
            pool.allocate(need, blocks)
            ref.allocate(need, ref_blocks)
            assert blocks == ref_blocks
            pool.cache_blocks(blocks[len(hits) : b], hashes[len(hits) : b])
            ref.cache_blocks(ref_blocks[len(hits) : b], hashes[len(hits) : b])
            held.append((blocks, hashes))
        elif kind == "grow" and held:
            blocks, _ = held[a % len(held)]
            n = min(c + 1, pool.num_free)
            grown = list(blocks)
            pool.allocate_each([blocks] * n)
            ref.allocate(n, grown)
            assert blocks == grown
        elif kind == "free" and held:
            blocks, hashes = held.pop(a % len(held))
            if c:  # as the engine does: lookups may start from this chain (find_hits checks it)
                pool.remember_chain(blocks[: len(hashes)])
            pool.free(blocks)
            ref.free(blocks)
        assert_same(pool, ref)
    while held:
        blocks, _ = held.pop()
        pool.free(blocks)
        ref.free(blocks)
    assert_same(pool, ref)
    rest: list[int] = []
    ref_rest: list[int] = []
    pool.allocate(pool.num_free, rest)
    ref.allocate(len(ref.queue), ref_rest)
    assert rest == ref_rest
    assert_same(pool, ref)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_gpu_blocks=st.integers(2, 48), ops=OPS)
def test_segmented_queue_matches_per_block_queue(num_gpu_blocks: int, ops: list[tuple[str, int, int, int]]) -> None:
    run_ops(num_gpu_blocks, ops)


def test_chain_leaves_and_reenters_as_one_segment() -> None:
    pool = BlockPool(10)
    first: list[int] = []
    pool.allocate(4, first)
    pool.cache_blocks(first, chain(1, 4))
    pool.free(first)
    assert pool.free_order() == [5, 6, 7, 8, 9, 4, 3, 2, 1]  # never used first, then deepest first
    hits = pool.find_hits(chain(1, 4), 3)
    assert hits == [1, 2, 3]
    pool.touch(hits)
    assert pool.free_order() == [5, 6, 7, 8, 9, 4]
    assert [pool.ref_count(b) for b in (1, 2, 3, 4)] == [1, 1, 1, 0]
    pool.touch([1])  # a second holder
    pool.free(hits)
    assert pool.free_order() == [5, 6, 7, 8, 9, 4, 3, 2]  # block 1 is still held
    pool.free([1])
    assert pool.free_order() == [5, 6, 7, 8, 9, 4, 3, 2, 1]


def test_allocating_more_than_free_is_an_error() -> None:
    pool = BlockPool(3)
    with pytest.raises(ValueError, match="cannot allocate 3 blocks, 2 free"):
        pool.allocate(3, [])


def test_many_touched_segments_are_compacted() -> None:
    """Segments emptied by hits are dropped from the queue's segment list (bounded memory)."""
    pool = BlockPool(400)
    for i in range(300):
        blocks: list[int] = []
        pool.allocate(1, blocks)
        pool.cache_blocks(blocks, [i])
        pool.free(blocks)
        pool.touch(pool.find_hits([i], 1))  # the segment it went to is empty again
    assert len(pool._segments) < 200
    assert pool.num_free == 399 - 300


def test_a_run_starting_inside_a_segment() -> None:
    """Duplicate blocks: a chain's hits can continue in the middle of another request's segment."""
    pool = BlockPool(6)
    ref = ReferencePool(6)
    a: list[int] = []
    b: list[int] = []
    for p, (x, y) in ((pool, (a, b)), (ref, (list(a), list(b)))):
        p.allocate(2, x)
        p.allocate(2, y)
        p.cache_blocks(x, [10, 11])
        p.cache_blocks(y, [10, 11])  # computed twice concurrently: younger copies of both hashes
        p.free(x)
        p.free(y)
    assert_same(pool, ref)
    for p in (pool, ref):
        p.allocate(2, [])  # block 5 (never used), then a's deepest block: 11 moves to b's copy
    assert_same(pool, ref)
    hits = pool.find_hits([10, 11], 2)
    assert hits == ref.find_hits([10, 11], 2) == [a[0], b[1]]  # b[1] sits behind b[0] in b's segment
    pool.touch(hits)
    ref.touch(hits)
    assert_same(pool, ref)
    assert pool.free_order() == [b[0]]


def reference_hashes(tokens: list[int], n_blocks: int, bs: int, root: int, salt: int | None) -> list[int]:
    """The chain by its definition (docs/simulator.md §1): one hash per full block, salt in the first."""
    hashes: list[int] = []
    parent = root
    for i in range(n_blocks):
        block = tuple(tokens[i * bs : (i + 1) * bs])
        parent = hash((parent, block, salt)) if i == 0 and salt is not None else hash((parent, block))
        hashes.append(parent)
    return hashes


@settings(max_examples=100, deadline=None)
@given(
    bs=st.sampled_from([1, 2, 3, 16]),
    tokens=st.lists(st.integers(0, 1 << 40), max_size=70),
    have=st.integers(0, 5),
    salt=st.sampled_from([None, 12345]),
    whole=st.booleans(),
)
def test_extend_block_hashes_is_the_chain_definition(
    bs: int, tokens: list[int], have: int, salt: int | None, whole: bool
) -> None:
    n = len(tokens) // bs
    have = min(have, n)
    expected = reference_hashes(tokens, n, bs, 7, salt)
    hashes = expected[:have]
    if whole:  # the caller passes every token (offset 0)
        extend_block_hashes(hashes, tokens, n, bs, 7, salt)
    else:  # the caller passes only the new range
        extend_block_hashes(hashes, tokens[have * bs :], n, bs, 7, salt, offset=None)
    assert hashes == expected
