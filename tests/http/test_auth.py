"""API keys, the admin split, tenant-scoped Program identity (docs/operations.md §10)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from http_fakes import DaemonApp, MiniWorker, http_config

from daemon.auth import MISSING_KEY_MESSAGE, Authenticator, AuthFileError, read_key_file
from daemon.config import AuthConfig
from daemon.config_loading import ConfigError, config_from_dict
from daemon.handles import DaemonHandles
from daemon.http.app import create_app
from daemon.http.proxy import parse_request
from daemon.redact import redact
from daemon.security import load_security
from daemon.supervisor import run_daemon

CHAT = {"model": "mini", "messages": [{"role": "user", "content": "hi"}]}
ALPHA, BETA, ROOT = "sk-alpha-0123456789", "sk-beta-9876543210", "sk-root-admin"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


AUTH = AuthConfig(api_keys=(f"team-a:{sha(ALPHA)}", f"team-b:{sha(BETA)}"), admin_keys=(sha(ROOT),))


@pytest.fixture
async def secured() -> AsyncIterator[DaemonApp]:
    worker = MiniWorker()
    cfg = attrs.evolve(http_config(), auth=AUTH)
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(run_daemon, cfg, transport_factory=worker.transport, serve_http=False, rng=random.Random(0))
        )
        yield DaemonApp(handles, create_app(handles), worker)
        handles.request_shutdown()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_a_request_without_or_with_a_wrong_key_is_a_json_401(secured: DaemonApp) -> None:
    client = secured.app.test_client()
    for headers in ({}, bearer("sk-wrong"), {"authorization": "Basic abc"}, bearer("")):
        response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert response.status_code == 401
        error = (await response.get_json())["error"]
        assert error["code"] == "invalid_api_key"
        # whole, not cut by the redaction of bearer tokens (found by the session-25 walk)
        assert error["message"] == MISSING_KEY_MESSAGE == redact(MISSING_KEY_MESSAGE)
        assert response.headers["www-authenticate"] == "Bearer"
    assert secured.worker.seen == []
    for path in ("/v1/models", "/v1/batches"):
        assert (await client.get(path)).status_code == 401


async def test_a_valid_key_is_served_and_never_forwarded(secured: DaemonApp) -> None:
    client = secured.app.test_client()
    ok = await client.post("/v1/chat/completions", json=CHAT, headers=bearer(ALPHA))
    assert ok.status_code == 200
    also = await client.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": BETA})
    assert also.status_code == 200
    for request in secured.worker.seen:
        assert "authorization" not in request.headers and "x-api-key" not in request.headers
    assert (await client.get("/health")).status_code == 200  # load balancers need no key


async def test_admin_routes_need_the_admin_key_on_the_public_listener(secured: DaemonApp) -> None:
    client = secured.app.test_client()
    for path in ("/metrics", "/scheduling/diagnostics", "/dashboard", "/scheduling/dashboard.json"):
        assert (await client.get(path, headers=bearer(ALPHA))).status_code == 401, path
        assert (await client.get(path, headers=bearer(ROOT))).status_code == 200, path
    # an admin key is not a client key
    assert (await client.post("/v1/chat/completions", json=CHAT, headers=bearer(ROOT))).status_code == 401


async def test_the_admin_listener_split(daemon_app: DaemonApp) -> None:
    public = create_app(daemon_app.handles, role="public").test_client()
    admin = create_app(daemon_app.handles, role="admin").test_client()
    assert (await public.get("/metrics")).status_code == 404
    assert (await public.get("/scheduling/diagnostics")).status_code == 404
    assert (await public.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert (await admin.get("/metrics")).status_code == 200
    assert (await admin.get("/dashboard")).status_code == 200
    assert (await admin.post("/v1/chat/completions", json=CHAT)).status_code == 404
    assert (await admin.get("/health")).status_code == 200


def test_the_principal_namespaces_program_identity() -> None:
    body = {
        **CHAT,
        "vllm_xargs": {"agentic_context": {"program_id": "task-a:lead", "task_id": "task-a", "parent_program_id": "p"}},
    }
    raw = json.dumps(body).encode()
    key = "vllm_xargs.agentic_context"
    plain = parse_request("r1", "chat", raw, {}, key)
    scoped_a = parse_request("r2", "chat", raw, {}, key, principal="team-a")
    scoped_b = parse_request("r3", "chat", raw, {}, key, principal="team-b")
    assert plain.principal is None and scoped_a.principal == "team-a"
    assert plain.identity is not None and scoped_a.identity is not None and scoped_b.identity is not None
    assert plain.identity.identity.program_id == "task-a:lead"
    a, b = scoped_a.identity.identity, scoped_b.identity.identity
    assert (a.program_id, a.task_id, a.parent_program_id) == ("team-a/task-a:lead", "team-a/task-a", "team-a/p")
    assert a.program_id != b.program_id and a.placement_key != b.placement_key


def test_constant_time_lookup_maps_keys_to_tenants() -> None:
    auth = Authenticator.from_config(AUTH)
    assert auth.tenant_of(ALPHA) == "team-a" and auth.tenant_of(BETA) == "team-b"
    assert auth.tenant_of("sk-nope") is None and auth.tenant_of(None) is None
    assert auth.is_admin(ROOT) and not auth.is_admin(ALPHA)
    assert not Authenticator.from_config(AuthConfig()).enabled


def test_key_file_and_config_rules(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# team keys\n\nteam-c:{sha('sk-c')}\n")
    assert read_key_file(str(keys)) == (f"team-c:{sha('sk-c')}",)
    cfg = config_from_dict({"auth": {"api_keys_file": str(keys)}})
    assert load_security(cfg).authenticator.tenant_of("sk-c") == "team-c"
    keys.write_text("team-c:not-a-digest\n")
    with pytest.raises(AuthFileError, match="line 1"):
        read_key_file(str(keys))
    with pytest.raises(ConfigError) as info:
        load_security(cfg)
    assert info.value.lines[0].startswith("auth.api_keys_file: line 1")
    keys.write_text("# no keys yet\n\n")  # authentication on, every request a 401: refused at start
    with pytest.raises(ConfigError) as info:
        load_security(cfg)
    assert info.value.lines == [
        f'auth.api_keys_file: {str(keys)!r} holds no key: add one "<tenant>:<sha256 hex of the key>" line per '
        "client, or leave it unset to serve without authentication"
    ]
    both = config_from_dict({"auth": {"api_keys_file": str(keys), "api_keys": [f"team-d:{sha('sk-d')}"]}})
    assert load_security(both).authenticator.tenant_of("sk-d") == "team-d"  # the inline key is enough
    with pytest.raises(ConfigError) as info:
        config_from_dict({"auth": {"api_keys": ["no-digest"], "admin_keys": ["xyz"]}})
    assert [line.split(":")[0] for line in info.value.lines] == ["auth.api_keys", "auth.admin_keys"]


def test_worker_tls_settings_load_at_start(tmp_path: Path) -> None:
    import ssl

    from daemon.config import WorkerTlsConfig
    from daemon.security import worker_ssl_context

    assert worker_ssl_context(WorkerTlsConfig()) is None  # httpx's default verification
    insecure = worker_ssl_context(WorkerTlsConfig(verify=False))
    assert insecure is not None and insecure.verify_mode == ssl.CERT_NONE
    cfg = config_from_dict({"worker_tls": {"ca_file": str(tmp_path / "missing.pem")}})
    with pytest.raises(ConfigError) as info:
        load_security(cfg)
    assert info.value.lines[0].startswith("worker_tls.ca_file: cannot read ")
    with pytest.raises(ConfigError) as info:
        config_from_dict({"worker_tls": {"client_key_file": "k.pem"}})
    assert info.value.lines == [
        "worker_tls.client_key_file: needs worker_tls.client_cert_file (got client_cert_file='')"
    ]


class ModelsSpy(MiniWorker):
    def __init__(self) -> None:
        super().__init__()
        self.models_authorization: list[str | None] = []

    async def handler(self, request: Any) -> Any:
        if request.url.path == "/v1/models":
            self.models_authorization.append(request.headers.get("authorization"))
        return await super().handler(request)


async def test_the_models_route_never_forwards_an_agentd_key() -> None:
    worker = ModelsSpy()
    cfg = attrs.evolve(http_config(), auth=AUTH)
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(run_daemon, cfg, transport_factory=worker.transport, serve_http=False, rng=random.Random(0))
        )
        client = create_app(handles).test_client()
        worker.models_authorization.clear()  # the start-up discovery's read
        response = await client.get("/v1/models", headers=bearer(ALPHA))
        assert response.status_code == 200
        assert worker.models_authorization == [None]
        handles.request_shutdown()
