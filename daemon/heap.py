"""The cyclic garbage collector of a serving process (docs/operations.md §13.8).

A request through agentd allocates a few hundred container objects and frees them by reference
counting: the request path leaves no reference cycles behind (checked with ``gc.DEBUG_SAVEALL``
over 400 requests, docs/benchmarks.md §10.2.4).  Python's collector nevertheless runs a young
collection every 700 net allocations, and with 32 requests in flight the ones alive at that
moment survive it and climb to the older generations, which triggers full collections of the
whole heap - some 80,000 objects of imported modules, about 70 ms each on the 2-core bench
machine.  Measured with ``gc.callbacks`` at c=32 with 1 KB requests: 0.55-0.6 s of collector time
per 8 s of load, about 7% of the process's CPU, and a 70 ms pause at every full collection.

:func:`settle_heap` runs once a serving process has started: one full collection, then
``gc.freeze()`` (everything alive now - modules, classes, the configuration, the app - is left
out of every later collection) and a young-generation threshold of :data:`YOUNG_THRESHOLD`
allocations.  Cycles are still collected (an error path can make them: a traceback holds its
frames); the cost is at most that many objects of cyclic garbage waiting for their collection.
"""

from __future__ import annotations

import gc

# net allocations between two young collections (CPython's default: 700); the older generations
# keep CPython's ratios (10, 10)
YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Collect once, freeze what is alive now and raise the young threshold (module docstring)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
