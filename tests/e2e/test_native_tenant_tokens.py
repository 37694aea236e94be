"""A tenant's tokens on the native path (docs/priority.md §5.6), over real sockets.

With Program scheduling off every request takes a native policy, whose leases need no usage.  Before
session 45 a non-streamed answer's usage was never read there, so `agentd_tenant_tokens_total`,
`agentd_tenant_service_share` and the diagnostics' tenant token counts saw only streams whose client
asked for usage: a tenant sending plain requests looked as if it used nothing.  The answer's usage
member is now read after the answer is written (streams without usage still add no tokens: the
relay does not inject it on the native path)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import httpx
import trio

sys.path.append(str(Path(__file__).resolve().parents[1] / "faults"))

from fault_env import BUDGET_SECONDS
from fault_worker import Act, FaultWorker

from daemon.config import AgentdConfig, AuthConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

KEYS = {"team-a": "sk-native-a", "team-b": "sk-native-b"}
CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}]}


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _tokens(metrics: str, tenant: str, kind: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("agentd_tenant_tokens_total{") and f'tenant="{tenant}"' in line and f'kind="{kind}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_plain_answers_add_their_usage_to_the_tenant(tmp_path: Path) -> None:
    cfg = AgentdConfig(
        server=ServerConfig(host="127.0.0.1", port=0, shutdown_grace_seconds=1.0),
        routing=RoutingConfig(worker_urls=("http://127.0.0.1:1",), health_check_interval_seconds=3600.0),
        auth=AuthConfig(api_keys=tuple(f"{t}:{_digest(k)}" for t, k in KEYS.items()), admin_keys=(_digest("adm"),)),
    )
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act(events=3)  # usage: 5 prompt tokens, 3 completion tokens
        cfg = AgentdConfig(
            server=cfg.server,
            routing=RoutingConfig(worker_urls=(worker.url,), health_check_interval_seconds=3600.0),
            auth=cfg.auth,
        )
        handles = await nursery.start(run_daemon, cfg)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:

            async def ask(tenant: str, **extra: object) -> None:
                answer = await client.post(
                    "/v1/chat/completions",
                    json={**CHAT, **extra},
                    headers={"authorization": f"Bearer {KEYS[tenant]}"},
                )
                assert answer.status_code == 200, answer.text

            await ask("team-a")
            await ask("team-a")
            await ask("team-b", stream=True)  # a stream without usage: still nothing to count
            await ask("team-b", stream=True, stream_options={"include_usage": True})
            metrics = (await client.get("/metrics", headers={"authorization": "Bearer adm"})).text
            assert _tokens(metrics, "team-a", "prompt") == 10
            assert _tokens(metrics, "team-a", "completion") == 6
            assert _tokens(metrics, "team-b", "prompt") == 5
            assert _tokens(metrics, "team-b", "completion") == 3
            doc = (await client.get("/scheduling/diagnostics", headers={"authorization": "Bearer adm"})).json()
            tenants = doc["fairness"]["tenants"]
            assert tenants["team-a"]["prompt_tokens"] == 10 and tenants["team-a"]["completion_tokens"] == 6
            assert tenants["team-a"]["completed"] == 2
        nursery.cancel_scope.cancel()
