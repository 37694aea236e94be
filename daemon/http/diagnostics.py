"""``GET /health``, the probes ``GET /liveness`` and ``GET /readiness``, and ``GET /scheduling/diagnostics``.

``/health``: 200 ``{"status": "ok", ...}`` once the daemon is serving and at least one target
is healthy; 503 ``{"status": "unavailable", "reason": ...}`` naming each worker's last verdict
otherwise.

``/liveness`` and ``/readiness``: the reference router's Kubernetes probes, with its answers
(docs/operations.md §13.10): ``/liveness`` 200 ``OK`` while the process serves; ``/readiness`` 200
``{"status": "ready", "healthy_workers", "total_workers"}`` with at least one worker in rotation,
else 503 ``{"status": "not_ready", ...}``.  Like ``/health`` they need no key and the public and
admin listeners both serve them (:data:`PROBE_PATHS`; the ``[prometheus]`` listener serves only
``/metrics``).

``/scheduling/diagnostics``: the Program scheduling snapshot (the reference router's document,
docs/operations.md "Reference"; from ``program_dispatcher.diagnostics()``) when Program scheduling is on, else
``{"enabled": false}``; in both cases merged with a ``proxy`` section owned by the proxy:
targets with health and in-flight counts, the native policy and its lease statistics, and each
worker's served models (model pools).
Snapshots are built on demand, never on the request hot path.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs
from quart import Blueprint, Response

from daemon.invariants import capacity_invariants
from daemon.redact import redact_url

if TYPE_CHECKING:
    from daemon.handles import DaemonHandles


# Served on the public and admin listeners without an API key (a probe carries none).
PROBE_PATHS = frozenset({"/health", "/liveness", "/readiness"})


def readiness_payload(handles: DaemonHandles) -> tuple[int, dict[str, Any]]:
    """The reference's ``/readiness``: ready while at least one worker is in rotation."""
    workers = {t.worker_url for t in handles.targets}
    healthy = {t.worker_url for t in handles.health.healthy_targets()}
    payload = {"healthy_workers": len(healthy), "total_workers": len(workers)}
    return (200, {"status": "ready", **payload}) if healthy else (503, {"status": "not_ready", **payload})


def health_payload(handles: DaemonHandles) -> tuple[int, dict[str, Any]]:
    healthy = handles.health.healthy_targets()
    payload: dict[str, Any] = {
        "healthy_targets": len(healthy),
        "targets": len(handles.targets),
        "embedded": handles.config.embedded_mode,
    }
    if healthy:
        return 200, {"status": "ok", **payload}
    return 503, {
        "status": "unavailable",
        "reason": f"no healthy targets are available: {handles.health.unhealthy_reason()}",
        **payload,
    }


def proxy_section(handles: DaemonHandles) -> dict[str, Any]:
    board = handles.health
    native = handles.native_dispatcher
    targets = []
    for target in handles.targets:
        worker = board.worker(target.worker_url)
        targets.append(
            {
                "target_id": target.target_id,
                "base_url": redact_url(target.worker_url),
                "dp_rank": target.shown_dp_rank,  # null at DP size 1, as the reference
                "healthy": worker.healthy,
                "health_reason": worker.reason,
                # a connect timeout awaiting its confirming probe: out of rotation while a peer is
                # in it (docs/operations.md §11.3)
                "suspect": worker.suspect,
                # the worker's /metrics has other engines but not this rank's: out of rotation
                # while another rank is in it (docs/operations.md §11.3)
                "engine_missing": board.engine_missing(target),
                "health_checked_at": worker.checked_at,
                "consecutive_health_failures": worker.consecutive_failures_count,
                "consecutive_health_successes": worker.consecutive_successes_count,
                "consecutive_request_failures": worker.outlier_failures_count,
                "native_in_flight_requests": native.in_flight(target),
                "priority_mode": handles.engine.priority_mode(target.worker_url),  # docs/priority.md §5.4
            }
        )
    return {
        "policy": handles.config.routing.policy,
        "embedded": handles.config.embedded_mode,
        "health_rounds": board.rounds_count,
        "native": attrs.asdict(native.statistics()),
        **_edge_section(handles),
        "targets": targets,
        # served models per worker (model pools, docs/operations.md §12); null = unknown: any model
        "models": [] if handles.engine.models is None else handles.engine.models.document(),
    }


def _edge_section(handles: DaemonHandles) -> dict[str, Any]:
    """The public listener's limits and drain state (docs/operations.md §10)."""
    out: dict[str, Any] = {}
    if handles.edge is not None:
        out["edge"] = attrs.asdict(handles.edge.statistics())
    state = handles.server_state
    if state is not None:
        out["connections"] = {
            "open": state.open_connections,
            "max": state.max_connections,
            "rejected_count": state.rejected_connections,
            "max_per_client": state.max_connections_per_client,
            "rejected_per_client_count": state.rejected_client_connections,
            "clients": len(state.per_client),
            "write_timeouts_count": state.write_timeouts,
        }
    return out


def diagnostics_payload(handles: DaemonHandles) -> dict[str, Any]:
    program = handles.program_dispatcher
    section: dict[str, Any]
    if program is not None and hasattr(program, "diagnostics"):
        section = dict(program.diagnostics())
    else:
        section = {"enabled": False}
    section["proxy"] = proxy_section(handles)
    section["invariants"] = capacity_invariants(handles)  # docs/operations.md §11
    if handles.engine.fairness is not None:  # per class and tenant (docs/priority.md §5.6)
        section["fairness"] = handles.engine.fairness.diagnostics()
    if handles.data_plane is not None:  # relay processes (docs/operations.md §13)
        section["data_plane"] = handles.data_plane.diagnostics()
    return section


def diagnostics_blueprint(handles: DaemonHandles) -> Blueprint:
    bp = Blueprint("diagnostics", __name__)

    @bp.get("/health")
    async def health() -> Response:
        status, payload = health_payload(handles)
        return Response(json.dumps(payload), status=status, content_type="application/json")

    @bp.get("/liveness")
    async def liveness() -> Response:
        return Response("OK", status=200, content_type="text/plain; charset=utf-8")

    @bp.get("/readiness")
    async def readiness() -> Response:
        status, payload = readiness_payload(handles)
        return Response(json.dumps(payload), status=status, content_type="application/json")

    @bp.get("/scheduling/diagnostics")
    async def diagnostics() -> Response:
        body = redact_url(json.dumps(diagnostics_payload(handles), default=str))  # no worker credentials
        return Response(body, status=200, content_type="application/json")

    return bp
