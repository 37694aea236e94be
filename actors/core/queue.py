"""The RequestPool and the resume ordering keys (docs/program-scheduling.md §1 and §5).

RequestPool
    One strict FIFO per exact Program generation (``ProgramRef``), plus an index by request
    id.  Request-scoped fields (``hints``) live on exactly one ``PendingRequest``; they travel
    with it into the ``Dispatch`` and are dropped at completion or cancellation.  Empty FIFOs
    are deleted.  Only the FIFO front can be taken.

Ordering across Programs (resume order) is not the pool's business; it is the explicit key
of :func:`resume_key` (smaller resumes first)::

    (forced tier, request class rank, -front priority, tenant counter, yielded, ordinary...)
    ordinary FCFS: (queued_at, program_id, model_pool)
    ordinary MRU:  (never finished, -last_request_finished_at, queued_at, program_id, model_pool)
    ordinary LAS:  (attained service of the Program's task, then as MRU)

Extension points for the request classes planned next (batch jobs, priority classes with
fairness) — both slot in without changing the pool:

* every ``PendingRequest`` carries ``request_class`` (today always ``"interactive"``); the key's
  second component is ``CLASS_RANK[front.request_class]``, so a batch class is one more entry
  that sorts after interactive work while force-resume still bounds its starvation;
* tenant fairness (VTC, docs/priority.md §3) is the key's fourth component: the front request's
  tenant's virtual token counter (0 for everyone with ``fairness = "off"``, and equal for all
  Programs of one tenant, so a single tenant's order is the ordinary one).

Queue membership (rank or global queues) is a ``dict[ProgramRef, None]`` (an insertion-ordered
set); a Program is in at most one queue and records which in ``Program.queued_in``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator

from actors.core.ids import ProgramRef, RequestId
from actors.core.model import AGENT, BATCH, INTERACTIVE, MAX_SEGMENT_YIELD, PendingRequest, Program

# Class ranks of the default band order (docs/priority.md §2).  Every RequestPool entry is of the
# ``agent`` class today (interactive and batch requests wait in their own queues), so the component
# is constant in the pool's order.
CLASS_RANK: dict[str, int] = {INTERACTIVE: 0, AGENT: 1, BATCH: 2}


class RequestPool:
    __slots__ = ("_fifos", "_by_id")

    def __init__(self) -> None:
        self._fifos: dict[ProgramRef, deque[PendingRequest]] = {}
        self._by_id: dict[RequestId, PendingRequest] = {}

    def retain(self, req: PendingRequest) -> None:
        fifo = self._fifos.get(req.ref)
        if fifo is None:
            fifo = self._fifos[req.ref] = deque()
        fifo.append(req)
        self._by_id[req.request_id] = req

    def retain_front(self, req: PendingRequest) -> None:
        """Put ``req`` back at the front of its FIFO (a dispatch taken back, docs/priority.md §3)."""
        fifo = self._fifos.get(req.ref)
        if fifo is None:
            fifo = self._fifos[req.ref] = deque()
        fifo.appendleft(req)
        self._by_id[req.request_id] = req

    def get(self, request_id: RequestId) -> PendingRequest | None:
        return self._by_id.get(request_id)

    def front(self, ref: ProgramRef) -> PendingRequest | None:
        fifo = self._fifos.get(ref)
        return fifo[0] if fifo else None

    def take_front(self, ref: ProgramRef, request_id: RequestId | None = None) -> PendingRequest | None:
        """Pop the front of ``ref``'s FIFO; with ``request_id``, only if it names the front."""
        fifo = self._fifos.get(ref)
        if not fifo or (request_id is not None and fifo[0].request_id != request_id):
            return None
        req = fifo.popleft()
        if not fifo:
            del self._fifos[ref]
        del self._by_id[req.request_id]
        return req

    def cancel(self, request_id: RequestId) -> tuple[PendingRequest, bool] | None:
        """Remove a request from anywhere in its FIFO; returns (request, it was the front)."""
        req = self._by_id.pop(request_id, None)
        if req is None:
            return None
        fifo = self._fifos[req.ref]
        was_front = fifo[0] is req
        fifo.remove(req)
        if not fifo:
            del self._fifos[req.ref]
        return req, was_front

    def program_len(self, ref: ProgramRef) -> int:
        fifo = self._fifos.get(ref)
        return len(fifo) if fifo else 0

    def requests(self, ref: ProgramRef) -> tuple[PendingRequest, ...]:
        fifo = self._fifos.get(ref)
        return tuple(fifo) if fifo else ()

    def refs(self) -> Iterator[ProgramRef]:
        return iter(self._fifos)

    def __len__(self) -> int:
        return len(self._by_id)

    def fifo_lengths_total(self) -> int:
        return sum(len(f) for f in self._fifos.values())

    def has_empty_fifo(self) -> bool:
        return any(not f for f in self._fifos.values())


_INF = math.inf


def fcfs_key(p: Program) -> tuple[object, ...]:
    q = p.queued_at if p.queued_at is not None else _INF
    return (q, p.ref.program_id, p.ref.model_pool)


def mru_key(p: Program) -> tuple[object, ...]:
    f = p.last_request_finished_at
    q = p.queued_at if p.queued_at is not None else _INF
    if f is None:
        return (1, 0.0, q, p.ref.program_id, p.ref.model_pool)
    return (0, -f, q, p.ref.program_id, p.ref.model_pool)


ORDINARY_KEYS: dict[str, Callable[[Program], tuple[object, ...]]] = {"fcfs": fcfs_key, "mru": mru_key}


def resume_key(
    p: Program,
    front: PendingRequest | None,
    now: float,
    resume_order: str,
    tenant_counter: float = 0.0,
    attained: float = 0.0,
) -> tuple[object, ...]:
    """Explicit total order of resume candidates (smaller first), see the module docstring.

    ``tenant_counter`` is the virtual token counter of the front request's tenant
    (docs/priority.md §3): among equal class and priority, the least-served tenant goes first.
    ``attained`` is the service the Program's task attained so far (``las`` only,
    docs/program-scheduling.md §5.1).
    """
    forced = p.force_resume_deadline is not None and p.force_resume_deadline <= now
    priority = front.hints.priority if front is not None else 0
    klass = CLASS_RANK.get(front.request_class, 0) if front is not None else 0
    yielded = 1 if p.last_pause_reason == MAX_SEGMENT_YIELD else 0
    if resume_order == "las":
        return (0 if forced else 1, klass, -priority, tenant_counter, yielded, attained, *mru_key(p))
    return (0 if forced else 1, klass, -priority, tenant_counter, yielded, *ORDINARY_KEYS[resume_order](p))
