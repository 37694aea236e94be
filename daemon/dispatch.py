"""Dispatch contract between the HTTP proxy and the schedulers, and the native dispatcher.

The proxy turns every accepted request into a :class:`ProxyRequest`, asks a :class:`Dispatcher`
for a :class:`Lease` on one :class:`~daemon.config.BackendTarget`, forwards the request there and
calls ``lease.finish(Outcome)`` exactly once when the response ended.  Leaving the lease context
without ``finish`` means the request was abandoned (client gone, cancelled); the dispatcher then
releases everything itself.

:class:`NativeDispatcher` implements the request-level policies of :mod:`daemon.routing` for
requests without Program identity.  It is the single writer of the per-target in-flight counts;
health comes from a read-only view published by the health actor (:mod:`daemon.health`).
Program scheduling (``daemon/program_dispatch.py``) implements the same protocol.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs
import trio

from actors.core.config import BackendTarget
from actors.core.errors import Rejection
from actors.core.ids import DEFAULT_MODEL_POOL
from actors.core.model import Usage
from daemon.http.priority import DEFAULT_INFO, PriorityInfo
from daemon.http.queue_eta import QueueWatch
from daemon.routing import Policy, build_policy, routing_key

if TYPE_CHECKING:
    from daemon.http.identity import ParsedIdentity
    from daemon.http.requests import PromptSize


@attrs.frozen
class ProxyRequest:
    request_id: str
    endpoint: str  # "chat" | "completions" | "responses"
    body: dict[str, Any]  # parsed JSON body as the client sent it (never mutated)
    headers: Mapping[str, str]  # lower-case header names
    model: str | None
    stream: bool
    # the prompt's size (the Program scheduler's estimate) and the routing text (consistent hash,
    # Program binding): given, or worked out from the body by ``texts`` the first time they are
    # read; a request that needs neither (round robin, least loaded) never walks its body for them
    # (docs/benchmarks.md §10.2.8)
    _prompt: PromptSize | None = None
    _routing_text: str | None = None
    identity: ParsedIdentity | None = None
    # the job name when the request is batch class (docs/batch.md §2), else None
    batch_job: str | None = None
    # the tenant name of the authenticated API key (daemon/auth.py, docs/operations.md §10), None
    # when the request carried no key (authentication off); the tenant source of highest rank
    principal: str | None = None
    # the client's own id (X-Request-Id header, else the body's request_id), kept beside agentd's
    # unique request_id and never used as the engine's id alone (daemon/request_ids.py)
    client_request_id: str | None = None
    # the model pool (daemon/models.py): the core's default pool when every target serves the
    # model; else the model's name, with the indices of the targets that serve it
    model_pool: str = DEFAULT_MODEL_POOL
    pool_targets: frozenset[int] | None = None
    # class, priority (larger first) and tenant after the operator's rules (docs/priority.md §5)
    prio: PriorityInfo = DEFAULT_INFO
    # where the top-level members of the body are in the raw bytes (daemon/http/rawbody.py): the
    # edits before forwarding splice the bytes instead of re-encoding the body; None = re-encode
    layout: Any = attrs.field(default=None, eq=False, repr=False)
    # the client's bound on its queue wait (x-agentd-max-queue-seconds, docs/program-scheduling.md §13)
    max_queue_seconds: float | None = None
    # the latest queue position and ETA of a waiting streaming request, for its SSE comments
    queue_watch: QueueWatch | None = None
    # workers this request could not reach (connect failed, nothing sent): a failover's next
    # lease avoids them while another worker is in rotation (docs/operations.md §11.3)
    avoid_workers: frozenset[str] = frozenset()
    # (routing_text, prompt size) of the body, called at most once, when either is first read
    # without having been given (daemon/http/requests.py request_texts)
    texts: Callable[[], tuple[str, PromptSize]] | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def prompt(self) -> PromptSize:
        if self._prompt is None:
            self._work_out_texts()
        assert self._prompt is not None
        return self._prompt

    @property
    def routing_text(self) -> str:
        if self._routing_text is None:
            self._work_out_texts()
        assert self._routing_text is not None
        return self._routing_text

    def _work_out_texts(self) -> None:
        if self.texts is None:
            raise AttributeError("ProxyRequest: neither prompt and routing_text nor texts were given")
        routing_text, prompt = self.texts()
        # a cache of values fixed by the (never mutated) body: frozen for everything else
        if self._routing_text is None:
            object.__setattr__(self, "_routing_text", routing_text)
        if self._prompt is None:
            object.__setattr__(self, "_prompt", prompt)


@attrs.frozen
class Outcome:
    success: bool
    usage: Usage | None
    error: str | None
    first_token_seconds: float | None
    decode_seconds: float | None
    finish_reason: str | None = None  # the first choice's, when the response carried one
    tool_names: tuple[str, ...] = ()  # functions the first choice called (docs/program-scheduling.md §12)


class Lease(Protocol):
    @property
    def target(self) -> BackendTarget: ...
    @property
    def wants_usage(self) -> bool: ...
    @property
    def attempt(self) -> int: ...  # 0, or the how-manieth repeat of a preempted batch request
    def finish(self, outcome: Outcome) -> None: ...


class Dispatcher(Protocol):
    def lease(self, req: ProxyRequest) -> AbstractAsyncContextManager[Lease]: ...


class DispatchRejected(Exception):
    """An expected refusal (429/503 style): carries the core's :class:`Rejection` unchanged."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.message)
        self.rejection = rejection


class Requeued(Exception):
    """The scheduler took the request back before any of its answer reached the client
    (docs/priority.md §3, "Re-queueing a blocking long prefill"): the forward stops, writes
    nothing more, and the request waits for its next admission."""


@runtime_checkable
class RequeueableLease(Lease, Protocol):
    """A lease whose forward the scheduler may take back before the answer starts: each forward
    runs in :meth:`attempt_scope` (cancelled when it is taken back; ``committed()`` tells whether
    a byte of the answer went to the client, after which it never is), and :meth:`readmit` waits
    for the next admission (raising :class:`DispatchRejected` when it is refused)."""

    @property
    def requeueable(self) -> bool: ...
    @property
    def requeue_requested(self) -> bool: ...
    def attempt_scope(self, committed: Callable[[], bool]) -> trio.CancelScope: ...
    def attempt_done(self) -> None: ...
    async def readmit(self) -> None: ...


class HealthView(Protocol):
    """Read-only health state (written only by the health actor)."""

    def healthy_targets(self) -> tuple[BackendTarget, ...]: ...
    def unhealthy_reason(self) -> str: ...


@attrs.define(eq=False)
class NativeLease:
    target: BackendTarget
    wants_usage: bool = False
    attempt: int = 0
    outcome: Outcome | None = None

    def finish(self, outcome: Outcome) -> None:
        if self.outcome is not None:
            raise RuntimeError(f"lease on {self.target.target_id} finished twice")
        self.outcome = outcome


@attrs.frozen
class NativeStatistics:
    leases_granted_count: int
    finished_count: int
    abandoned_count: int
    rejected_count: int


class NativeDispatcher:
    """Request-level routing over healthy targets; owns the in-flight count per target."""

    def __init__(
        self,
        targets: Sequence[BackendTarget],
        policy: str,
        health: HealthView,
        rng: random.Random,
    ) -> None:
        self.targets = tuple(targets)
        self.policy: Policy = build_policy(policy, self.targets, rng)
        self._health = health
        self._in_flight = [0] * len(self.targets)
        # a relay process's view of the other processes' in-flight counts per target index, added
        # for the load-aware policies (docs/operations.md §13); None in a single process
        self.others_in_flight: list[int] | None = None
        self._granted = 0
        self._finished = 0
        self._abandoned = 0
        self._rejected = 0

    def in_flight(self, target: BackendTarget) -> int:
        return self._in_flight[target.index]

    def total_in_flight(self) -> int:
        return sum(self._in_flight)

    def statistics(self) -> NativeStatistics:
        return NativeStatistics(self._granted, self._finished, self._abandoned, self._rejected)

    def pick(self, req: ProxyRequest) -> BackendTarget:
        healthy = self._health.healthy_targets()
        if req.pool_targets is not None:  # only the workers serving the request's model
            healthy = tuple(t for t in healthy if t.index in req.pool_targets)
        if req.avoid_workers:  # a failover among suspects (every worker in rotation is one): not the same again
            untried = tuple(t for t in healthy if t.worker_url not in req.avoid_workers)
            healthy = untried or healthy
        if not healthy:
            self._rejected += 1
            raise DispatchRejected(
                Rejection(
                    reason="no_healthy_target",
                    status_hint=503,
                    message=f"no healthy targets are available: {self._health.unhealthy_reason()}",
                )
            )
        if len(healthy) == 1:
            return healthy[0]
        key = ""
        if self.policy.name == "consistent_hash":
            key = routing_key(req.headers, req.routing_text, req.body)
        others = self.others_in_flight
        counts = self._in_flight if others is None else [a + b for a, b in zip(self._in_flight, others, strict=True)]
        return self.policy.choose(healthy, key, counts)

    def _lease(self, target: BackendTarget) -> _NativeLeaseScope:
        return _NativeLeaseScope(self, NativeLease(target))

    def lease(self, req: ProxyRequest) -> AbstractAsyncContextManager[NativeLease]:
        return self._lease(self.pick(req))


class _NativeLeaseScope:
    """A native lease's lifetime: counted in flight from entry to exit; the exit (synchronous:
    nothing to await, so cancellation cannot skip it) counts it finished or abandoned.  A class,
    not an async generator: no generator per request (docs/benchmarks.md §10.2.4)."""

    __slots__ = ("_dispatcher", "_lease")

    def __init__(self, dispatcher: NativeDispatcher, lease: NativeLease) -> None:
        self._dispatcher = dispatcher
        self._lease = lease

    async def __aenter__(self) -> NativeLease:
        dispatcher = self._dispatcher
        dispatcher._in_flight[self._lease.target.index] += 1
        dispatcher._granted += 1
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        dispatcher = self._dispatcher
        dispatcher._in_flight[self._lease.target.index] -= 1
        if self._lease.outcome is None:
            dispatcher._abandoned += 1
        else:
            dispatcher._finished += 1
