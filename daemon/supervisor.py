"""The supervisor: one root nursery, start order, signals and the graceful shutdown deadline.

``run_daemon(cfg, ...)`` owns the per-daemon ``CollectorRegistry``, the single
``httpx.AsyncClient`` and every long-lived task.  Start order (each step is ready before the
next begins, via ``nursery.start``):

1. registry, metrics, the httpx client (in embedded mode: the in-process simulated cluster and
   a client whose ``http://embedded-sim*`` URLs are mounted on its transport - no sockets);
2. the health actor (first round of ``/health`` checks done before it reports started);
3. Program scheduling when ``cfg.program_scheduling`` is set
   (``daemon.program_dispatch.run_program_scheduling``);
4. the Batch API executor when ``batch_api.enabled`` (``daemon.batch_executor``; it resumes the
   unfinished batches of an existing database before it reports started);
5. the HTTP server last (and the extra ``/metrics`` listener when configured), so no request
   can arrive before the actors are up.

Then ``task_status.started(DaemonHandles)``.  Shutdown: ``handles.shutdown`` is set (by
SIGINT/SIGTERM when ``handle_signals``; a second signal cancels at once) -> hypercorn stops
accepting and drains in-flight requests until ``server.shutdown_grace_seconds`` have passed ->
the root nursery cancels the actors -> ``run_daemon`` returns.  Any actor crash tears the whole
daemon down (one-cancels-all); there are no restart loops.  Without HTTP (``serve_http=False``,
used by ``agentd simulate`` under MockClock) requests go through ``handles.handle(...)``.
"""

from __future__ import annotations

import logging
import random
import signal
from collections.abc import Callable
from functools import partial

import attrs
import httpx
import trio
from prometheus_client import CollectorRegistry

from actors.fairness_metrics import FairnessBook, FairnessGaugeCollector, FairnessMetrics, TenantLabels
from actors.logevents import get_logger, log_event
from daemon.batch_executor import BatchService, run_batch_executor
from daemon.config import AgentdConfig
from daemon.config_loading import config_warnings
from daemon.dataplane import resolve_processes
from daemon.dataplane.processes import DataPlane, listening_socket
from daemon.dataplane.scheduler_side import DataPlaneHub, ViewCollector
from daemon.dispatch import Dispatcher, NativeDispatcher
from daemon.h1client import relay_hub
from daemon.handles import DaemonHandles
from daemon.health import HealthBoard, run_health_checks
from daemon.hostnames import host_policy
from daemon.http.app import create_app
from daemon.http.edge import Edge, EdgeCollector
from daemon.http.hostguard import guard
from daemon.http.metrics_route import metrics_asgi_app
from daemon.http.proxy import OutcomeReports, ProgramRoute, ProxyEngine
from daemon.http.serve import ServerState
from daemon.http.serve import serve_http as serve_asgi
from daemon.metrics import BatchApiMetrics, ProxyMetrics, build_registry
from daemon.models import ModelDirectory, run_model_discovery
from daemon.program_dispatch import ProgramDispatcher, run_program_scheduling
from daemon.request_ids import REQUEST_ID_SEED, RequestIds
from daemon.security import Security, load_security, unauthenticated_listener, worker_api_key, worker_ssl_context
from daemon.upstream import UpstreamTransport, client_kwargs, upstream_limits, upstream_timeouts
from sim.api import wall_clock_epoch
from sim.cluster import SimCluster, SimConfig, run_sim_cluster, wait_until_idle
from sim.transport import SimTransport

logger = get_logger("supervisor")
ClientFactory = Callable[[AgentdConfig], httpx.AsyncClient]
TransportFactory = Callable[[AgentdConfig], httpx.AsyncBaseTransport]
SimConfigure = Callable[[SimConfig], SimConfig]


def default_transport(cfg: AgentdConfig) -> httpx.AsyncBaseTransport:
    """Connection-pooling HTTP/1.1 transport to real workers (TLS per ``[worker_tls]``, the key of
    ``[worker_auth]``)."""
    return UpstreamTransport(
        upstream_limits(cfg.routing.keepalive_expiry_seconds), worker_ssl_context(cfg.worker_tls), worker_api_key(cfg)
    )


def client_on(cfg: AgentdConfig, transport: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
    r = cfg.routing
    kwargs = client_kwargs(r.request_timeout_seconds, r.connect_timeout_seconds, r.keepalive_expiry_seconds)
    kwargs.pop("limits")
    return httpx.AsyncClient(transport=transport, **kwargs)


async def _start_embedded(
    root: trio.Nursery, cfg: AgentdConfig, configure: SimConfigure | None
) -> dict[str, SimCluster]:
    """One simulated server per embedded worker URL, each with ``cfg.embedded.dp_size`` ranks."""
    clusters: dict[str, SimCluster] = {}
    for index, url in enumerate(cfg.worker_urls()):
        clusters[url] = await root.start(
            partial(run_sim_cluster, cfg.embedded, worker_index=index, configure=configure)
        )
    e = cfg.embedded
    log_event(
        logger,
        logging.INFO,
        "embedded_mode",
        workers=",".join(clusters),
        dp_size=e.dp_size,
        model=e.model,
        num_gpu_blocks=e.num_gpu_blocks,
        block_size=e.block_size,
        time_scale=e.time_scale,
        message="no worker_urls configured: serving from the in-process simulated vLLM cluster",
    )
    return clusters


async def _watch_signals(shutdown: trio.Event, root: trio.CancelScope, edge: Edge) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if shutdown.is_set():
                log_event(logger, logging.WARNING, "shutdown_forced", signal=signal.Signals(signum).name)
                root.cancel()
                return
            edge.note_shutdown()  # the grace period counts from here (docs/operations.md §10.4)
            log_event(logger, logging.INFO, "shutdown_requested", signal=signal.Signals(signum).name)
            shutdown.set()


def _log_startup(cfg: AgentdConfig) -> None:
    for warning in config_warnings(cfg):
        log_event(logger, logging.WARNING, warning.event, message=warning.message, **dict(warning.fields))


@attrs.frozen(eq=False)
class Upstream:
    """How the daemon reaches its workers: the client, the proxy's raw transport, embedded ranks."""

    client: httpx.AsyncClient
    transport: httpx.AsyncBaseTransport | None
    embedded: dict[str, SimCluster] | None


async def _open_upstream(
    root: trio.Nursery,
    cfg: AgentdConfig,
    client_factory: ClientFactory | None,
    transport_factory: TransportFactory | None,
    sim_configure: SimConfigure | None,
    real_clock: bool,
) -> Upstream:
    """Step 1: the workers - the embedded simulated cluster, a given client, or a pooled transport."""
    if cfg.embedded_mode:
        embedded = await _start_embedded(root, cfg, sim_configure)
        # A daemon serving HTTP runs on the real clock: the embedded backend's `created` is then a
        # Unix time, as vLLM's; in-process (agentd simulate, MockClock) it stays virtual seconds.
        transport: httpx.AsyncBaseTransport = SimTransport(
            embedded, created_epoch=wall_clock_epoch() if real_clock else 0.0
        )
        return Upstream(client_on(cfg, transport), transport, embedded)
    if client_factory is not None:
        return Upstream(client_factory(cfg), None, None)
    transport = transport_factory(cfg) if transport_factory is not None else default_transport(cfg)
    if isinstance(transport, UpstreamTransport):  # idle connections closed at their expiry (docs/operations.md §11.2)
        root.start_soon(transport.run_reaper)
    return Upstream(client_on(cfg, transport), transport, None)


async def _start_dispatchers(
    root: trio.Nursery,
    cfg: AgentdConfig,
    upstream: Upstream,
    registry: CollectorRegistry,
    metrics: ProxyMetrics,
    rng: random.Random | None,
) -> tuple[HealthBoard, NativeDispatcher, ProgramDispatcher | None]:
    """Steps 2-3: the health actor (first round done), the native dispatcher, Program scheduling."""
    targets = cfg.targets()
    r = cfg.routing
    board = HealthBoard(
        targets,
        failures_to_eject=r.health_failures_to_eject,
        successes_to_restore=r.health_successes_to_restore,
        outlier_failures=r.outlier_consecutive_failures,
        metrics=metrics,
    )
    await root.start(
        run_health_checks,
        board,
        upstream.client,
        cfg.routing.health_check_interval_seconds,
        cfg.routing.health_check_timeout_seconds,
        metrics,
    )
    native = NativeDispatcher(targets, cfg.routing.policy, board, rng or random.Random())
    program = None
    if cfg.program_scheduling is not None:
        # deterministic virtual time (agentd simulate): the scheduler handles same-instant messages
        # in an explicit order, not in task wake order (docs/architecture.md §7)
        embedded = upstream.embedded or {}
        deterministic = any(c.config.deterministic for c in embedded.values())
        settle = wait_until_idle if deterministic else None
        program = await root.start(
            partial(run_program_scheduling, health=board, settle=settle), cfg, upstream.client, registry
        )
    return board, native, program


def build_engine(
    cfg: AgentdConfig,
    *,
    client: httpx.AsyncClient,
    transport: httpx.AsyncBaseTransport | None,
    native: Dispatcher,
    metrics: ProxyMetrics,
    program: ProgramRoute | None,
    outcomes: OutcomeReports,
    ids: RequestIds,
    models: ModelDirectory,
    fairness: FairnessBook,
) -> ProxyEngine:
    """The proxy engine of one process: this one's, and each relay process's (docs/operations.md
    §13) - every option taken from the configuration is set here, once for both."""
    return ProxyEngine(
        client=client,
        native=native,
        metrics=metrics,
        agentic_context_forwarding=cfg.routing.agentic_context_forwarding,
        workers_force_include_usage=cfg.routing.workers_force_include_usage,
        program=program,
        transport=transport,
        timeouts=upstream_timeouts(cfg.routing, embedded=cfg.embedded_mode),
        outcomes=outcomes,
        ids=ids,
        hint_caps=cfg.client_hints,
        models=models,
        priority=cfg.priority,
        tenants=cfg.tenants,
        priority_workers=cfg.priority_workers(),
        detect_workers=cfg.priority_detect_workers(),
        unpinned_workers=cfg.unpinned_workers(),
        fairness=fairness,
        stream_coalesce_seconds=cfg.server.stream_coalesce_ms / 1000,
        retry_after_seconds=cfg.limits.retry_after_seconds,
    )


# After the drain deadline the answers to the requests still running (a JSON 503, an error event
# and [DONE]) get this long to reach their clients before the connections are cut.
DRAIN_ANSWER_SECONDS = 2.0


def _server_state(cfg: AgentdConfig) -> ServerState:
    limits = cfg.limits
    return ServerState(
        max_connections=limits.max_connections,
        max_connections_per_client=limits.max_connections_per_client,
        client_write_timeout_seconds=limits.client_write_timeout_seconds,
        retry_after_seconds=limits.retry_after_seconds,
    )


async def _serve(servers: trio.Nursery, cfg: AgentdConfig, handles: DaemonHandles, security: Security) -> DaemonHandles:
    """Step 4: the HTTP server, the admin and ``/metrics`` listeners; the handles with their URLs.

    Drain (docs/operations.md §10.4): the edge's drain task and every listener watch
    ``handles.shutdown``; requests still running at ``shutdown_grace_seconds`` are answered by
    the edge, and the listeners cut what is left :data:`DRAIN_ANSWER_SECONDS` later."""
    grace = cfg.server.shutdown_grace_seconds
    hard = grace + DRAIN_ANSWER_SECONDS
    shutdown = handles.shutdown
    edge = handles.edge
    assert edge is not None
    servers.start_soon(edge.run_drain, shutdown, grace)
    auth = security.authenticator
    split = cfg.admin.port is not None
    processes = resolve_processes(cfg.server.data_plane_processes, embedded=cfg.embedded_mode)
    data_plane = None
    if processes > 1:  # relay processes on the port, this process schedules (docs/operations.md §13)
        data_plane = _data_plane(cfg, processes, handles)
        handles = attrs.evolve(handles, data_plane=data_plane)
    # the relays' views against the scheduler's (docs/operations.md §13.3): always 0 with one process
    handles.registry.register(
        ViewCollector(
            None if data_plane is None else data_plane.hub,
            None if data_plane is None else data_plane.restarts_count,
        )
    )
    app = create_app(handles, role="public" if split else "all", edge=edge, auth=auth)
    allowed = cfg.server.allowed_hosts
    # the internal listener behind relays answers what the relays forward: the public listener's names
    public_hosts = host_policy(allowed, cfg.server.host)
    state = handles.server_state
    if data_plane is not None:
        # the internal listener carries the relays' forwarded routes: at most one per client connection
        # of each relay, whose caps are per relay (docs/operations.md §13.1); capped at the public cap,
        # it refused the fourth concurrent upload of max_connections = 3 with relays that had room
        state.max_connections = cfg.limits.max_connections * processes
        state.max_connections_per_client = 0  # every connection here comes from a relay (127.0.0.1)
    http_url = await servers.start(
        partial(serve_asgi, state=state, hard_grace_seconds=hard, http1=cfg.server.http1_implementation),
        guard(app, public_hosts, f"server.host {cfg.server.host!r}"),
        # with relays this listener is internal: the relays forward every non-proxy route to it
        cfg.server.host if data_plane is None else "127.0.0.1",
        cfg.server.port if data_plane is None else 0,
        grace,
        shutdown.wait,
    )
    if data_plane is not None:
        await servers.start(data_plane.run, http_url, shutdown)
        http_url = data_plane.public_url
    admin_url = None
    admin_app = None
    if split:
        admin_app = create_app(handles, role="admin", edge=edge, auth=auth)
        admin_url = await servers.start(
            partial(
                serve_asgi, hard_grace_seconds=hard, http1=cfg.server.http1_implementation, listen_field="admin.port"
            ),
            guard(admin_app, host_policy(allowed, cfg.admin.host), f"admin.host {cfg.admin.host!r}"),
            cfg.admin.host,
            cfg.admin.port,
            grace,
            shutdown.wait,
        )
    metrics_url = None
    if cfg.prometheus.port is not None:
        host = cfg.prometheus.bind_host
        metrics_app = metrics_asgi_app(
            handles.registry, None if data_plane is None else data_plane.relay_metrics.families
        )
        metrics_url = await servers.start(
            partial(serve_asgi, http1=cfg.server.http1_implementation, listen_field="prometheus.port"),
            guard(metrics_app, host_policy(allowed, host), f"prometheus.host {host!r}"),
            host,
            cfg.prometheus.port,
            grace,
            shutdown.wait,
        )
    handles = attrs.evolve(handles, http_url=http_url, metrics_url=metrics_url, admin_url=admin_url)
    app.handles = handles
    if admin_app is not None:
        admin_app.handles = handles
    log_event(
        logger,
        logging.INFO,
        "daemon_listening",
        url=http_url,
        metrics_url=metrics_url,
        admin_url=admin_url,
        authentication=auth.enabled,
        targets=len(handles.targets),
        embedded=cfg.embedded_mode,
        policy=cfg.routing.policy,
        program_scheduling=handles.program_dispatcher is not None,
        data_plane_processes=processes,
    )
    exposed = unauthenticated_listener(cfg, security)
    if exposed is not None:
        log_event(logger, logging.WARNING, exposed.event, **dict(exposed.fields), message=exposed.message)
    return handles


def _data_plane(cfg: AgentdConfig, processes: int, handles: DaemonHandles) -> DataPlane:
    """The relay processes' manager: the public socket bound, the hub over this process's
    scheduler, health board, model directory and native in-flight counts (started by ``_serve``)."""
    program = handles.program_dispatcher
    models = handles.engine.models
    native = handles.native_dispatcher
    hub = DataPlaneHub(
        handles.targets,
        handles.health,
        program if isinstance(program, ProgramDispatcher) else None,
        models=None if models is None else (lambda: dict(models.models)),
        own_in_flight=lambda: [native.in_flight(t) for t in handles.targets],
    )
    sock, public_url = listening_socket(cfg.server.host, cfg.server.port)
    return DataPlane(cfg, processes, hub, sock, public_url)


async def run_daemon(
    cfg: AgentdConfig,
    *,
    client_factory: ClientFactory | None = None,
    transport_factory: TransportFactory | None = None,
    serve_http: bool = True,
    rng: random.Random | None = None,
    handle_signals: bool = False,
    sim_configure: SimConfigure | None = None,
    batch_executor: bool | None = None,
    task_status: trio.TaskStatus[DaemonHandles] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run agentd until ``handles.shutdown`` is set (or a signal when ``handle_signals``).

    Upstream: ``transport_factory(cfg)`` builds the transport to external workers (default: a
    pooled HTTP/1.1 transport; tests pass an ``httpx.MockTransport``) and the proxy sends straight
    to it; ``client_factory(cfg)`` instead supplies a whole ``httpx.AsyncClient`` (the proxy then
    goes through the client layer, slower).  In embedded mode the transport is the simulated
    cluster's ``SimTransport``.  ``rng`` seeds the ``random``/``power_of_two`` policies (default: an
    unseeded Random).  ``sim_configure`` adjusts each embedded simulated server's ``SimConfig``
    (``agentd simulate`` passes ``deterministic=True`` for virtual time).  ``batch_executor``: run
    the Batch API's executor (default: only when serving HTTP, so ``agentd simulate`` never resumes
    batches of the database); the routes exist whenever ``batch_api.enabled``.
    """
    _log_startup(cfg)
    relays = serve_http and resolve_processes(cfg.server.data_plane_processes, embedded=cfg.embedded_mode) > 1
    if relays and (client_factory is not None or transport_factory is not None):
        raise ValueError(
            "server.data_plane_processes > 1 runs relay processes that reach the workers themselves: "
            "client_factory/transport_factory cannot cross a process boundary"
        )
    security = load_security(cfg)
    registry = build_registry()
    targets = cfg.targets()
    metrics = ProxyMetrics(registry, [t.target_id for t in targets])
    shutdown = trio.Event()
    edge = Edge(cfg.limits)
    async with trio.open_nursery() as root:
        if handle_signals:
            root.start_soon(_watch_signals, shutdown, root.cancel_scope, edge)
        upstream = await _open_upstream(root, cfg, client_factory, transport_factory, sim_configure, serve_http)
        relay_hub()  # the streaming relay's task and epoll set live as long as the daemon (docs/benchmarks.md §10.1.1)
        async with upstream.client:
            board, native, program = await _start_dispatchers(root, cfg, upstream, registry, metrics, rng)
            models = ModelDirectory(targets, cfg.served_models())
            if not cfg.embedded_mode:  # embedded simulated workers serve their configured model
                await root.start(
                    run_model_discovery,
                    models,
                    upstream.client,
                    cfg.routing.health_check_interval_seconds,
                    cfg.routing.health_check_timeout_seconds,
                )
            ps = cfg.program_scheduling
            fairness = FairnessBook(
                TenantLabels(cfg.tenants.metrics_top_k, cfg.tenants.metrics_tenants),
                FairnessMetrics(registry),
                label_scheduler_tenants=relays,
            )
            registry.register(FairnessGaugeCollector(fairness))
            if program is not None:
                fairness.scheduler_view = program.fairness_view
            engine = build_engine(
                cfg,
                client=upstream.client,
                transport=upstream.transport,
                native=native,
                metrics=metrics,
                program=None
                if program is None or ps is None
                else ProgramRoute(
                    ps.program_scheduling_enable_key,
                    program,
                    program.batch,
                    program.interactive if cfg.priority.interactive_scheduling else None,
                ),
                outcomes=board,
                # seeded for deterministic runs (tests, agentd simulate); else uuid4 (daemon/request_ids.py)
                ids=RequestIds(None if rng is None else random.Random(REQUEST_ID_SEED)),
                models=models,
                fairness=fairness,
            )
            batches = None
            executing = False
            if cfg.batch_api.enabled:
                batches = BatchService(cfg.batch_api, BatchApiMetrics(registry))
                executing = serve_http if batch_executor is None else batch_executor
                if executing:
                    await root.start(run_batch_executor, batches, engine)
            handles = DaemonHandles(
                config=cfg,
                targets=targets,
                registry=registry,
                client=upstream.client,
                health=board,
                native_dispatcher=native,
                program_dispatcher=program,
                engine=engine,
                metrics=metrics,
                embedded=upstream.embedded,
                shutdown=shutdown,
                batches=batches,
                edge=edge,
                server_state=_server_state(cfg),
            )
            registry.register(EdgeCollector(edge, lambda: handles.server_state))
            async with trio.open_nursery() as servers:
                # its lines in flight get the grace too (docs/operations.md §10.4)
                if batches is not None and executing:
                    servers.start_soon(batches.drain, shutdown, cfg.server.shutdown_grace_seconds)
                if serve_http:
                    handles = await _serve(servers, cfg, handles, security)
                task_status.started(handles)
                if not serve_http:
                    await shutdown.wait()
            log_event(logger, logging.INFO, "daemon_stopped")
            root.cancel_scope.cancel()
