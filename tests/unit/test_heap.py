"""daemon/heap.py: a serving process's collector settings (docs/operations.md §13.8)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from daemon.heap import YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_settle_heap_freezes_what_is_alive_and_raises_the_young_threshold(restore_gc: None) -> None:
    older = gc.get_threshold()[1:]
    alive = [[] for _ in range(100)]  # tracked containers alive at the call
    settle_heap()
    assert gc.get_freeze_count() >= len(alive)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *older)


def test_cycles_made_after_settling_are_still_collected(restore_gc: None) -> None:
    settle_heap()
    collected: list[int] = []

    class Node:
        pass

    node = Node()
    node.self = node  # type: ignore[attr-defined]
    ref = weakref.ref(node, lambda _: collected.append(1))
    del node
    gc.collect(0)  # a young collection: the frozen heap is not traversed
    assert ref() is None and collected == [1]
