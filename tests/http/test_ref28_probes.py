"""The reference router's Kubernetes probes (docs/operations.md §13.10): ``/liveness`` answers while
the process serves; ``/readiness`` follows worker rotation (503 once no worker is in it)."""

from __future__ import annotations

from http_fakes import DaemonApp

from daemon.health import run_health_round


async def test_readiness_follows_rotation_and_liveness_does_not(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    ready = await client.get("/readiness")
    assert (ready.status_code, await ready.get_json()) == (
        200,
        {"status": "ready", "healthy_workers": 1, "total_workers": 1},
    )
    daemon_app.worker.healthy = False
    for _ in range(daemon_app.handles.config.routing.health_failures_to_eject):  # explicit rounds, no waiting
        await run_health_round(daemon_app.handles.health, daemon_app.handles.client, 1.0)
    not_ready = await client.get("/readiness")
    assert (not_ready.status_code, await not_ready.get_json()) == (
        503,
        {"status": "not_ready", "healthy_workers": 0, "total_workers": 1},
    )
    live = await client.get("/liveness")
    assert (live.status_code, await live.get_data()) == (200, b"OK")
    assert live.headers["content-type"] == "text/plain; charset=utf-8"
