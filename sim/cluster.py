"""Trio shell around the pure engines of one simulated vLLM server (one engine per DP rank).

One task (``SimCluster.run``) is the single writer of every engine of the server: it receives
submissions and aborts on a bounded inbox, routes them to a rank, and sleeps with
``trio.move_on_at`` until the earliest engine event (step end or arrival), then advances the due
engines to ``trio.current_time()`` and forwards their outputs to per-request channels.  Time is
only ever read from the Trio clock, so the cluster runs in real time under hypercorn and in virtual
time under ``trio.testing.MockClock(autojump_threshold=0)``.

Determinism: Trio shuffles tasks that become runnable together, so submissions made at the same
instant may reach the inbox in any order.  With ``deterministic=True`` (virtual time) the cluster
waits until every task is blocked (``trio.testing.wait_all_tasks_blocked``) before taking a batch
and processes it sorted by each submission's ``order_key`` (its aborts by request id); routing and
engine order then depend only on the requests, never on task wake order.

Quiet events: in virtual time with ``per_step_wakeups=False`` most engine events (a request
becoming schedulable, the end of a prefill step, a decode run cut short) deliver nothing to a
consumer that only wants final outputs.  After each wake-up the cluster applies such events at
once, without sleeping, as long as nothing can reach the engines before them (no runnable task,
empty inbox, no cluster waiting for its batch in ``wait_all_tasks_blocked``, every other deadline
later); it sleeps only until the first event with something to deliver.  Inputs and deliveries
keep their exact times.  Trio has no public way to ask whether *some* task waits in
``wait_all_tasks_blocked``, so the clusters record their own waits (``_IdleWaits``, one per Trio
run; the deterministic scheduler actor waits through :func:`wait_until_idle`, which records it);
other code that waits for idle next to a virtual-time cluster with ``per_step_wakeups=False``
is not seen (no such caller exists in agentd), and an input it sends too late raises
``RuntimeError`` (docs/simulator.md §4).

Routing (docs/simulator.md §3, "DP ranks"): a pinned rank must satisfy ``0 <= rank < dp_size``
(checked in ``submit``, ``ValueError`` otherwise); unpinned requests go to the engine with the
lowest ``waiting * 4 + running`` (the lowest rank on ties; vLLM rotates its scan start per client).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, NoReturn

import attrs
import trio

from sim.config import DEFAULT_MODEL, SimServerShape, shape_fields
from sim.engine import Engine, EngineConfig, EngineOutput, Request
from sim.stats import CostModel

# Submissions waiting for the cluster task; a full inbox applies backpressure to HTTP handlers.
INBOX_BUFFER = 1024


@attrs.frozen
class SimConfig:
    """One simulated server: ``dp_size`` engines made from ``engine`` (rank ``r`` seeded
    ``engine.seed * 1000 + r``) serving ``model``, plus options of the API and of this Trio shell.
    ``from_shape`` builds one from a ``SimServerShape``; the server's ``dp_size``, ``model`` and
    ``seed`` are these fields (the copies inside ``engine`` are not read here)."""

    dp_size: int = 1
    engine: EngineConfig = EngineConfig()
    model: str = DEFAULT_MODEL
    seed: int = 0
    strict_xargs: bool = False
    # "ignore" (vLLM v1) or "reject" (HTTP 400, as V0 and some deployments) a non-zero priority
    # when the scheduling policy is fcfs.
    priority_under_fcfs: str = "ignore"
    default_chat_max_tokens: int = 256
    default_completion_max_tokens: int = 16
    # Wake at every engine step so streams flow token by token (real time); False wakes only at
    # the end of multi-step decode runs (fastest in virtual time).
    per_step_wakeups: bool = True
    # Order same-instant submissions explicitly (virtual time); see module docstring.
    deterministic: bool = False

    @classmethod
    def from_shape(
        cls, shape: SimServerShape, *, worker_index: int = 0, cost: CostModel | None = None, **overrides: Any
    ) -> SimConfig:
        """The server of ``shape`` (an ``EmbeddedConfig``, a ``ClusterSpec``...) that is worker
        ``worker_index`` of its cluster: seed ``shape.seed + worker_index``."""
        seed = shape.seed + worker_index
        engine = EngineConfig(**{**shape_fields(shape), "seed": seed}, cost=cost if cost is not None else CostModel())
        return cls(dp_size=shape.dp_size, engine=engine, model=shape.model, seed=seed, **overrides)


@attrs.frozen(eq=False)
class Submission:
    request: Request
    dp_rank: int | None
    outputs: trio.MemorySendChannel[EngineOutput]
    order_key: tuple[Any, ...]
    final_only: bool = False


@attrs.frozen
class Abort:
    request_id: str


class SimCluster:
    """The engines of one simulated server plus the task that drives them."""

    def __init__(self, config: SimConfig) -> None:
        if config.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {config.dp_size}")
        self.config = config
        self.engines = [
            Engine(attrs.evolve(config.engine, seed=config.engine.seed * 1000 + rank)) for rank in range(config.dp_size)
        ]
        self._inbox_send, self._inbox_receive = trio.open_memory_channel[Submission | Abort](INBOX_BUFFER)
        self._streams: dict[str, trio.MemorySendChannel[EngineOutput]] = {}
        self._final_only: set[str] = set()
        self._owner: dict[str, Engine] = {}
        self.started = False
        # the latest time quiet events were applied at while the clock still read an earlier time
        self._quiet_horizon = -math.inf

    @property
    def dp_size(self) -> int:
        return self.config.dp_size

    @property
    def max_model_len(self) -> int:
        return self.config.engine.max_model_len

    def now(self) -> float:
        return trio.current_time()

    def check_rank(self, dp_rank: int | None) -> None:
        if dp_rank is not None and not 0 <= dp_rank < self.dp_size:
            raise ValueError(f"data_parallel_rank {dp_rank} is out of range [0, {self.dp_size}).")

    async def submit(
        self,
        request: Request,
        *,
        dp_rank: int | None = None,
        order_key: tuple[Any, ...] = (),
        final_only: bool = False,
    ) -> trio.MemoryReceiveChannel[EngineOutput]:
        """Queue ``request``; returns the channel of its outputs (closed after the finish).

        With ``final_only`` only the finishing output is sent (non-streamed requests)."""
        self.check_rank(dp_rank)
        # every output carries >= 1 token and the finish rides on the last one, so one slot per
        # output token is enough: the cluster task never blocks on a slow consumer
        send, receive = trio.open_memory_channel[EngineOutput](len(request.output) + 1)
        await self._inbox_send.send(Submission(request, dp_rank, send, order_key or (request.request_id,), final_only))
        return receive

    def abort(self, request_id: str) -> None:
        """Best-effort abort, callable from cancelled code.  If the inbox is full the abort is
        picked up anyway when the request's next output finds its channel closed."""
        with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
            self._inbox_send.send_nowait(Abort(request_id))

    def pick_rank(self) -> int:
        best = 0
        best_score = self.engines[0].load_score()
        for rank in range(1, len(self.engines)):
            score = self.engines[rank].load_score()
            if score < best_score:
                best, best_score = rank, score
        return best

    async def run(self, *, task_status: trio.TaskStatus[SimCluster] = trio.TASK_STATUS_IGNORED) -> None:
        per_step = self.config.per_step_wakeups
        # virtual time without streaming: engine events that deliver nothing run without a wake-up
        skip_quiet = self.config.deterministic and not per_step
        engines = self.engines
        with self._inbox_receive:
            self.started = True
            task_status.started(self)
            while True:
                times = [engine.next_event_time(per_step=per_step) for engine in engines]
                wake = min([t for t in times if t is not None], default=math.inf)
                batch: list[Submission | Abort] = []
                with trio.move_on_at(wake):
                    batch.append(await self._inbox_receive.receive())
                    if self.config.deterministic:
                        await _wait_all_tasks_blocked()
                    while True:
                        try:
                            batch.append(self._inbox_receive.receive_nowait())
                        except trio.WouldBlock:
                            break
                now = trio.current_time()
                if batch:
                    self._take(batch, now)
                    due = engines
                else:
                    due = [e for e, t in zip(engines, times, strict=True) if t is not None and t <= now]
                for engine in due:
                    t = engine.next_event_time(per_step=per_step)
                    if t is not None and t <= now:
                        self._dispatch(engine, engine.advance_to(now))
                if skip_quiet:
                    await self._run_quiet_events(now)

    async def _run_quiet_events(self, now: float) -> None:
        """Apply engine events that deliver nothing (virtual time, final outputs only) without a wake.

        An event at ``t`` may be applied early, while the Trio clock still reads ``now``, when no
        input can reach the engines before ``t``: no task is runnable, the inbox is empty, no cluster
        waits in ``wait_all_tasks_blocked`` and every other deadline is later than ``t``.  Under the
        mock clock's autojump the next wake-up would then be exactly ``t`` with nothing in between,
        so the engines see the same inputs at the same times.  When an event does produce something
        to deliver the task sleeps until ``t`` first, so consumers observe the same clock.  An input
        that arrives before ``t`` all the same (something the check cannot see ran at ``now``)
        raises ``RuntimeError`` rather than reaching the engines late or in their past.
        """
        engines = self.engines
        while True:
            times = [engine.next_event_time() for engine in engines]
            t = min([x for x in times if x is not None], default=math.inf)
            if t == math.inf or not self._quiet_until(now, t):
                return
            produced = [(e, e.advance_to(t)) for e, x in zip(engines, times, strict=True) if x is not None and x <= t]
            self._quiet_horizon = t
            if any(self._deliverable(outs) for _, outs in produced):
                await trio.sleep_until(t)
                if self._inbox_receive.statistics().current_buffer_used:
                    _missed_input(now, t)
                for engine, outs in produced:
                    self._dispatch(engine, outs)
                return

    def _quiet_until(self, now: float, t: float) -> bool:
        stats = trio.lowlevel.current_statistics()
        if stats.tasks_runnable or self._inbox_receive.statistics().current_buffer_used:
            return False
        if _idle_waits().waiting:
            return False
        # a margin so that rounding in ``now + delta`` never hides a deadline at ``t`` itself
        return now + stats.seconds_to_next_deadline > t + 1e-9 * max(1.0, abs(t))

    def _deliverable(self, outputs: list[EngineOutput]) -> bool:
        streams = self._streams
        final_only = self._final_only
        for out in outputs:
            if out.request_id in streams and (out.finish_reason is not None or out.request_id not in final_only):
                return True
        return False

    def _take(self, batch: list[Submission | Abort], now: float) -> None:
        if now < self._quiet_horizon:
            _missed_input(now, self._quiet_horizon)
        # aborts first: they can only name requests submitted before this batch (a consumer that
        # leaves before its submission is taken is caught by its closed channel).  Deterministic
        # mode takes them by request id: the order in which an engine frees blocks is visible later
        aborts = [m for m in batch if isinstance(m, Abort)]
        if self.config.deterministic:
            aborts.sort(key=lambda m: m.request_id)
        for msg in aborts:
            self._abort(msg.request_id, now)
        subs = sorted((m for m in batch if isinstance(m, Submission)), key=_order_key)
        for sub in subs:
            rank = sub.dp_rank if sub.dp_rank is not None else self.pick_rank()
            engine = self.engines[rank]
            rid = sub.request.request_id
            if rid in self._streams:
                sub.outputs.close()  # duplicate id: the API layer makes ids unique, so a bug
                continue
            self._streams[rid] = sub.outputs
            self._owner[rid] = engine
            if sub.final_only:
                self._final_only.add(rid)
            try:
                outs = engine.add_request(sub.request, now)
            except ValueError:
                del self._streams[rid], self._owner[rid]
                self._final_only.discard(rid)
                sub.outputs.close()
                continue
            self._dispatch(engine, outs)

    def _abort(self, request_id: str, now: float) -> None:
        engine = self._owner.pop(request_id, None)
        stream = self._streams.pop(request_id, None)
        self._final_only.discard(request_id)
        if stream is not None:
            stream.close()
        if engine is not None:
            self._dispatch(engine, engine.abort(request_id, now))

    def _dispatch(self, engine: Engine, outputs: list[EngineOutput]) -> None:
        gone: list[str] = []
        final_only = self._final_only
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None or (out.finish_reason is None and out.request_id in final_only):
                continue
            try:
                stream.send_nowait(out)
            except trio.BrokenResourceError:
                gone.append(out.request_id)
                continue
            if out.finish_reason is not None:
                stream.close()
                del self._streams[out.request_id], self._owner[out.request_id]
                final_only.discard(out.request_id)
        for request_id in gone:  # the consumer went away: abort like vLLM on disconnect
            self._abort(request_id, trio.current_time())


class _IdleWaits:
    """The clusters' own ``wait_all_tasks_blocked`` calls in one Trio run (see the module docstring).

    ``waiting`` counts the waits that Trio has not woken yet: a waiter that is still registered runs
    before the clock may jump.  Trio wakes *every* waiter of the smallest cushion at once, and all
    of ours use cushion 0, so the first of our waiters to return knows that every wait of its
    ``epoch`` was woken with it: it starts a new epoch and resets the count.
    """

    __slots__ = ("epoch", "waiting")

    def __init__(self) -> None:
        self.epoch = 0
        self.waiting = 0


_IDLE_WAITS: trio.lowlevel.RunVar[_IdleWaits] = trio.lowlevel.RunVar("sim_cluster_idle_waits")


def _idle_waits() -> _IdleWaits:
    try:
        return _IDLE_WAITS.get()
    except LookupError:
        waits = _IdleWaits()
        _IDLE_WAITS.set(waits)
        return waits


async def _wait_all_tasks_blocked() -> None:
    """``trio.testing.wait_all_tasks_blocked()``, recorded in this run's ``_IdleWaits``."""
    waits = _idle_waits()
    epoch = waits.epoch
    waits.waiting += 1
    # Imported here, not at the top: only deterministic (virtual-time) runs wait, and trio.testing
    # imports pytest when it is installed, which a daemon or relay process should not pay for.
    from trio.testing import wait_all_tasks_blocked

    try:
        await wait_all_tasks_blocked()
    except BaseException:
        if waits.epoch == epoch:  # left (cancelled) without being woken
            waits.waiting -= 1
        raise
    if waits.epoch == epoch:  # the first of this epoch's waiters to run: all of them were woken
        waits.epoch += 1
        waits.waiting = 0


async def wait_until_idle() -> None:
    """Return once every task of the run is blocked, counted as one of this run's idle waits (the
    quiet-events check then sees the caller): for other actors of a deterministic virtual-time
    run that order same-instant inputs by content (the scheduler actor, docs/architecture.md §7)."""
    await _wait_all_tasks_blocked()


def _missed_input(now: float, t: float) -> NoReturn:
    raise RuntimeError(
        f"simulated cluster: an input arrived at or after {now!r} but before {t!r}, the time the engines had "
        "been advanced to without a wake-up (quiet events, docs/simulator.md §4): a task the check cannot see "
        "ran in between, e.g. one waiting in trio.testing.wait_all_tasks_blocked outside the simulator; "
        "use per_step_wakeups=True"
    )


def _order_key(sub: Submission) -> tuple[Any, ...]:
    return sub.order_key


async def run_sim_cluster(
    cfg: SimServerShape | SimConfig,
    *,
    worker_index: int = 0,
    cost: CostModel | None = None,
    configure: Callable[[SimConfig], SimConfig] | None = None,
    task_status: trio.TaskStatus[SimCluster] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one simulated server's engines; ``task_status.started(cluster)`` once it accepts work.

    ``cfg`` is a ``SimServerShape`` (e.g. the daemon's ``EmbeddedConfig``; this server is worker
    ``worker_index`` of it) or a ready ``SimConfig``; ``configure`` may adjust the derived
    ``SimConfig`` (e.g. ``deterministic=True``).
    """
    config = cfg if isinstance(cfg, SimConfig) else SimConfig.from_shape(cfg, worker_index=worker_index, cost=cost)
    if configure is not None:
        config = configure(config)
    cluster = SimCluster(config)
    await cluster.run(task_status=task_status)
