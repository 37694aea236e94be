"""``[worker_auth]``: the API key agentd presents to workers started with ``--api-key``
(docs/operations.md §10.5), over real loopback sockets with the daemon's own pooled transport.

The fake worker answers ``/v1/models`` and generation only with the right bearer token (as vLLM
does with ``--api-key``) and records the authorization header of every request.  No clock is
involved: the daemon's start reads every worker's model list before it reports started.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio

from daemon.cli import main
from daemon.config import AgentdConfig, RoutingConfig, ServerConfig, WorkerAuthConfig
from daemon.config_loading import config_from_dict, dump_config
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

WORKER_KEY = "wk-0123456789abcdef"


class KeyedWorker:
    """A minimal HTTP/1.1 worker over a socket that requires ``Authorization: Bearer WORKER_KEY``."""

    def __init__(self) -> None:
        self.authorizations: list[tuple[str, str | None]] = []  # (path, authorization header)

    async def serve(self, stream: trio.SocketStream) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
            length = int(headers.get("content-length", "0"))
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            self.authorizations.append((path, headers.get("authorization")))
            if path in ("/health", "/metrics"):
                status, body = 200, b""
            elif headers.get("authorization") != f"Bearer {WORKER_KEY}":
                status, body = 401, json.dumps({"error": "Unauthorized"}).encode()
            elif path == "/v1/models":
                status, body = 200, json.dumps({"object": "list", "data": [{"id": "keyed-model"}]}).encode()
            else:
                answer = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": {}}
                status, body = 200, json.dumps(answer).encode()
            reason = {200: "OK", 401: "Unauthorized"}[status]
            await stream.send_all(
                f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )


@asynccontextmanager
async def keyed_daemon(worker_auth: WorkerAuthConfig) -> AsyncIterator[tuple[DaemonHandles, KeyedWorker]]:
    worker = KeyedWorker()
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, worker.serve, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        cfg = AgentdConfig(
            server=ServerConfig(port=0),
            routing=RoutingConfig(worker_urls=(f"http://127.0.0.1:{port}",), policy="round_robin"),
            worker_auth=worker_auth,
        )
        handles: DaemonHandles = await nursery.start(partial(run_daemon, cfg, serve_http=False, rng=random.Random(0)))
        yield handles, worker
        handles.request_shutdown()
        nursery.cancel_scope.cancel()


async def test_the_worker_key_reaches_every_worker_request_and_replaces_the_clients(tmp_path: Path) -> None:
    key_file = tmp_path / "worker.key"
    key_file.write_text(f"{WORKER_KEY}\n")
    async with keyed_daemon(WorkerAuthConfig(api_key_file=str(key_file))) as (handles, worker):
        assert handles.engine.models is not None
        url = handles.config.worker_urls()[0]
        assert handles.engine.models.models[url] == frozenset({"keyed-model"})  # read with the key
        body = json.dumps({"model": "keyed-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = handles.build_request("chat", body, {"authorization": "Bearer client-key"})
        sink = await handles.handle_collect(req)
        assert sink.status == 200, sink.body
        assert {auth for _, auth in worker.authorizations} == {f"Bearer {WORKER_KEY}"}
        assert {path for path, _ in worker.authorizations} >= {"/health", "/v1/models", "/v1/chat/completions"}


async def test_without_a_worker_key_a_keyed_worker_lists_no_models() -> None:
    async with keyed_daemon(WorkerAuthConfig()) as (handles, worker):
        assert handles.engine.models is not None
        assert handles.engine.models.unknown() == handles.config.worker_urls()  # 401: list unknown
        assert all(auth is None for _, auth in worker.authorizations)


def test_the_worker_key_is_never_printed_and_bad_settings_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_from_dict({"worker_auth": {"api_key": WORKER_KEY}})
    assert dump_config(cfg)["worker_auth"] == {"api_key": "***", "api_key_file": ""}
    config = tmp_path / "agentd.toml"
    config.write_text(f'[worker_auth]\napi_key = "{WORKER_KEY}"\n')
    assert main(["check-config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert WORKER_KEY not in out + err and '"api_key": "***"' in out
    for section, field in (
        (f'api_key = "{WORKER_KEY}"\napi_key_file = "/x"\n', "worker_auth.api_key:"),
        ('api_key = "two words"\n', "worker_auth.api_key:"),
        (f'api_key_file = "{tmp_path / "absent"}"\n', "worker_auth.api_key_file:"),
    ):
        config.write_text("[worker_auth]\n" + section)
        assert main(["check-config", str(config)]) == 2
        out, err = capsys.readouterr()
        assert f"  {field}" in err, err
        assert WORKER_KEY not in out + err and "two words" not in err
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    config.write_text(f'[worker_auth]\napi_key_file = "{empty}"\n')
    assert main(["check-config", str(config)]) == 2
    assert "worker_auth.api_key_file:" in capsys.readouterr().err
    assert attrs.fields(WorkerAuthConfig).api_key.default == ""


def test_check_config_masks_a_worker_urls_user_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The running daemon shows http://***@host everywhere; check-config printed the password (and a
    problem about such a URL named it in full) until the session-35 walk."""
    url = "http://user:secretpw@127.0.0.1:8350"
    config = tmp_path / "agentd.toml"
    config.write_text(
        f'[routing]\nworker_urls = ["{url}"]\n[routing.served_models]\n"{url}" = ["m"]\n'
        f'[priority.worker_policies]\n"{url}" = "priority"\n'
    )
    assert main(["check-config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "secretpw" not in out + err and out.count("http://***@127.0.0.1:8350") == 3
    config.write_text(f'[routing]\nworker_urls = ["{url}"]\n[routing.served_models]\n"http://u2:pw2@w:1" = ["m"]\n')
    assert main(["check-config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert "pw2" not in out + err and "http://***@w:1" in err
