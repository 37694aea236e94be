"""A relay process: ``python -m daemon.dataplane.relay_main`` (docs/operations.md §13).

Started only by the scheduler process (:mod:`daemon.dataplane.processes`), never by hand: it reads
its :class:`RelaySpec` (the daemon's configuration, its index, the inherited file descriptors of
its data-plane socket and of the public listening socket, the scheduler's internal URL) as a
pickle on stdin, written by its parent.

It connects its proxy to the scheduler (``Hello``, then the first snapshot), serves the public
socket until SIGTERM, the scheduler's ``STOP_SIGNAL`` or the end of the scheduler's socket, then
drains exactly like the single-process daemon (docs/operations.md §10.4) and exits 0.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import signal
import socket
import sys
import traceback
from functools import partial
from typing import Any

import httpx
import trio
from prometheus_client import generate_latest

from actors.fairness_metrics import FairnessBook, FairnessGaugeCollector, FairnessMetrics, TenantLabels
from actors.logevents import get_logger, log_event
from daemon.config import AgentdConfig
from daemon.dataplane.balance import AcceptBoard, BalancedListener
from daemon.dataplane.link import Link
from daemon.dataplane.processes import STOP_SIGNAL, RelaySpec
from daemon.dataplane.relay import (
    RemoteOutcomes,
    RemoteProgramDispatcher,
    SnapshotView,
    forward_to_scheduler,
    forwarding_client,
    read_scheduler_frames,
    run_load_reports,
)
from daemon.dataplane.wire import Hello
from daemon.dispatch import NativeDispatcher
from daemon.heap import settle_heap
from daemon.hostnames import host_policy
from daemon.http.app import AsgiSink, canonical_scope, lowercase_method, serve_proxy_asgi
from daemon.http.edge import Edge, EdgeCollector
from daemon.http.hostguard import guard
from daemon.http.lifespan import answer_lifespan
from daemon.http.proxy import ProgramRoute, ProxyEngine, send_error
from daemon.http.requests import ENDPOINTS
from daemon.http.serve import ServerState, serve_http
from daemon.logs import capture_process_output, configure_logging
from daemon.metrics import ProxyMetrics, build_registry
from daemon.models import ModelDirectory
from daemon.request_ids import RequestIds
from daemon.security import load_security
from daemon.upstream import UpstreamTransport

logger = get_logger("relay")
FIRST_SNAPSHOT_SECONDS = 30.0
DRAIN_ANSWER_SECONDS = 2.0  # as the supervisor's (docs/operations.md §10.4)


class RelayApp:
    """The relay's ASGI app: proxy routes here, everything else from the scheduler process."""

    def __init__(
        self,
        engine: ProxyEngine,
        cfg: AgentdConfig,
        edge: Edge,
        auth: Any,
        scheduler_url: str,
        client: httpx.AsyncClient,
    ) -> None:
        self.engine = engine
        self.cfg = cfg
        self.edge = edge
        self.auth = auth
        self.scheduler_url = scheduler_url
        self.client = client  # forwarding_client(): run_relay runs its reaper and closes it

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        method = scope["method"]
        if method != method.upper():
            # case-sensitive (RFC 9110 §9.1), as the scheduler process's app: before, "post" was
            # not the proxy route's POST here and was forwarded, and httpx upper-cases a method,
            # so the scheduler process served it as POST (docs/operations.md §14)
            await send_error(AsgiSink(send), lowercase_method(method, path))
            return
        if not path.startswith("/") or "//" in path:
            # the proxy routes as the scheduler process's app recognises them (absolute-form,
            # repeated slashes): before, /v1//chat/completions was forwarded and served there
            scope, error = canonical_scope(scope)
            if error is not None:
                await send_error(AsgiSink(send), error)
                return
        endpoint = ENDPOINTS.get(scope["path"])
        if endpoint is not None and scope["method"] == "POST":
            cfg = self.cfg
            await serve_proxy_asgi(
                self.engine,
                cfg.server.max_body_bytes,
                endpoint,
                scope,
                receive,
                send,
                limits=cfg.limits,
                edge=self.edge,
                auth=self.auth,
            )
            return
        await forward_to_scheduler(
            self.client,
            self.scheduler_url,
            scope,
            receive,
            send,
            stall_seconds=self.cfg.limits.body_read_timeout_seconds,
        )


async def _watch_signals(shutdown: trio.Event, edge: Edge, root: trio.CancelScope) -> None:
    """SIGTERM (an operator, a process manager) and the scheduler process's ``STOP_SIGNAL`` drain;
    a second signal of the same kind cancels at once.  Both arrive together when the whole group or
    cgroup is signalled (systemd): that is one request to drain, not two.  SIGINT is ignored: a
    relay has a process group of its own and the scheduler process passes a Ctrl-C on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seen: set[int] = set()
    with trio.open_signal_receiver(signal.SIGTERM, STOP_SIGNAL) as signals:
        async for signum in signals:
            if signum in seen:
                root.cancel()
                return
            seen.add(signum)
            if shutdown.is_set():
                continue
            edge.note_shutdown()
            log_event(logger, logging.INFO, "relay_shutdown_requested", signal=signal.Signals(signum).name)
            shutdown.set()


def _engine(
    cfg: AgentdConfig, link: Link, view: SnapshotView, models: ModelDirectory, remote: RemoteProgramDispatcher | None
) -> tuple[ProxyEngine, NativeDispatcher, Any]:
    from daemon.supervisor import build_engine, client_on, default_transport

    targets = cfg.targets()
    registry = build_registry()
    metrics = ProxyMetrics(registry, [t.target_id for t in targets])
    native = NativeDispatcher(targets, cfg.routing.policy, view, random.Random())
    native.others_in_flight = view.others_in_flight  # load-aware policies see every process's load
    fairness = FairnessBook(
        TenantLabels(cfg.tenants.metrics_top_k, cfg.tenants.metrics_tenants), FairnessMetrics(registry)
    )
    registry.register(FairnessGaugeCollector(fairness))
    ps = cfg.program_scheduling
    transport = default_transport(cfg)
    engine = build_engine(
        cfg,
        client=client_on(cfg, transport),
        transport=transport,
        native=native,
        metrics=metrics,
        program=None
        if remote is None or ps is None
        else ProgramRoute(
            ps.program_scheduling_enable_key,
            remote,
            remote if cfg.batch_jobs.enabled else None,
            remote.interactive if cfg.priority.interactive_scheduling else None,
        ),
        outcomes=RemoteOutcomes(view, link),
        ids=RequestIds(),
        models=models,
        fairness=fairness,
    )
    return engine, native, registry


async def run_relay(spec: RelaySpec) -> None:
    """One relay process, until drained (see the module doc)."""
    cfg = spec.config
    control = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=spec.control_fd)))
    link = Link(control)
    listener = BalancedListener(
        socket.socket(fileno=spec.listen_fd), AcceptBoard(spec.board_fd, spec.processes), spec.index
    )
    targets = cfg.targets()
    models = ModelDirectory(targets, cfg.served_models())
    view = SnapshotView(targets, models)
    remote = RemoteProgramDispatcher(link, view) if cfg.program_scheduling is not None else None
    engine, native, registry = _engine(cfg, link, view, models, remote)
    edge = Edge(cfg.limits)
    shutdown = trio.Event()
    grace = cfg.server.shutdown_grace_seconds
    auth = load_security(cfg).authenticator
    limits = cfg.limits

    async def read_scheduler() -> None:
        await read_scheduler_frames(link, remote, view, lambda: generate_latest(registry).decode())
        if not shutdown.is_set():
            log_event(
                logger,
                logging.WARNING,
                "relay_scheduler_gone",
                relay=spec.index,
                message="the scheduler process's socket ended: refusing new work and draining",
            )
            edge.note_shutdown()
            shutdown.set()

    forward, forward_transport = forwarding_client()
    # the clients (their idle connections) and the scheduler's socket closed however the relay ends
    async with control, engine.client, forward, trio.open_nursery() as root:
        root.start_soon(_watch_signals, shutdown, edge, root.cancel_scope)
        root.start_soon(link.run_writer)
        root.start_soon(read_scheduler)
        # idle connections closed at their expiry, and at once when the peer closes them
        if isinstance(engine.transport, UpstreamTransport):  # to the workers (docs/operations.md §11.2)
            root.start_soon(engine.transport.run_reaper)
        root.start_soon(forward_transport.run_reaper)  # to the scheduler process (docs/operations.md §13.1)
        link.send(Hello(spec.index, os.getpid()))
        with trio.fail_after(FIRST_SNAPSHOT_SECONDS):
            await _first_of(view.first, shutdown)
        if not view.first.is_set():
            # the scheduler process ended (or a stop signal came) before the first snapshot: nothing
            # to drain.  Before, the relay kept its copy of the public listening socket until the
            # 30 s timeout above, then died with a traceback (docs/operations.md §13.2)
            await listener.aclose()
            log_event(logger, logging.INFO, "relay_stopped", relay=spec.index, pid=os.getpid())
            root.cancel_scope.cancel()
            return
        root.start_soon(run_load_reports, link, lambda: native._in_flight, remote)
        app = RelayApp(engine, cfg, edge, auth, spec.scheduler_url, forward)
        state = ServerState(
            max_connections=limits.max_connections,
            max_connections_per_client=limits.max_connections_per_client,
            client_write_timeout_seconds=limits.client_write_timeout_seconds,
            retry_after_seconds=limits.retry_after_seconds,
            connection_ended=listener.connection_closed,
        )
        registry.register(EdgeCollector(edge, lambda: state))  # summed over the relays (docs/operations.md §13.3)
        async with trio.open_nursery() as servers:
            servers.start_soon(edge.run_drain, shutdown, grace)
            url = await servers.start(
                partial(
                    serve_http,
                    state=state,
                    hard_grace_seconds=grace + DRAIN_ANSWER_SECONDS,
                    listener=listener,
                    http1=cfg.server.http1_implementation,
                ),
                guard(app, host_policy(cfg.server.allowed_hosts, cfg.server.host), f"server.host {cfg.server.host!r}"),
                cfg.server.host,
                cfg.server.port,
                grace,
                shutdown.wait,
            )
            log_event(logger, logging.INFO, "relay_listening", relay=spec.index, pid=os.getpid(), url=url)
        log_event(logger, logging.INFO, "relay_stopped", relay=spec.index, pid=os.getpid())
        link.close()
        with trio.move_on_after(1.0):  # let the last Finish/Release frames reach the scheduler
            await link.drained.wait()
        root.cancel_scope.cancel()


async def _first_of(*events: trio.Event) -> None:
    """Until one of ``events`` is set."""
    async with trio.open_nursery() as race:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            race.cancel_scope.cancel()

        for event in events:
            race.start_soon(wait, event)


class _RelayField(logging.Filter):
    """Every agentd event a relay logs names the relay (``relay=<index>``) after its own fields."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "agentd_event", None) is not None:
            fields = dict(getattr(record, "agentd_fields", None) or {})
            fields.setdefault("relay", self.index)
            record.agentd_fields = fields
        return True


def main() -> int:
    # a relay runs in a process group of its own (daemon/dataplane/processes.py): in a terminal with
    # `stty tostop` its log writes would stop it (SIGTTOU) as a background job's do
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    spec: RelaySpec = pickle.load(sys.stdin.buffer)
    root = configure_logging(spec.config.server.log_level, spec.config.server.log_format)
    for handler in root.handlers:
        handler.addFilter(_RelayField(spec.index))
    settle_heap()  # docs/operations.md §13.8
    if spec.config.server.log_format != "json":
        trio.run(run_relay, spec)
        return 0
    # json logs: library logs and warnings as JSON lines, and a crash as one `relay_crashed` line
    # rather than a raw traceback in the middle of the daemon's JSON stream (as `agentd start`'s
    # `daemon_crashed`, docs/operations.md §7.1)
    capture_process_output()
    try:
        trio.run(run_relay, spec)
    except Exception as exc:
        log_event(
            logger,
            logging.CRITICAL,
            "relay_crashed",
            error=_leaf_errors(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
        return 1
    return 0


def _leaf_errors(exc: BaseException) -> str:
    """``Type: message`` of the exceptions inside (nested) exception groups, ``; ``-joined."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_leaf_errors(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    raise SystemExit(main())
