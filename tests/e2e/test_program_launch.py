"""The seed document's production launch command works as ``agentd start ...``, and the same
JSON in a TOML file gives the same configuration and the same behaviour."""

from __future__ import annotations

import json
import random
from functools import partial
from pathlib import Path

import attrs
import httpx
import trio
from test_program_scheduling import ProgramWorker, chat

from daemon.cli import build_parser
from daemon.config import AdminConfig, AgentdConfig, AuthConfig, PrometheusConfig, ServerConfig
from daemon.config_loading import load_config, overrides_from_args
from daemon.supervisor import run_daemon

REPO = Path(__file__).resolve().parents[2]


def seed_command_config(host: str = "0.0.0.0", port: str = "3001", prometheus_port: str = "29000") -> AgentdConfig:
    program_json = json.dumps(
        json.loads((REPO / "configs" / "program-scheduling.json").read_text()), separators=(",", ":")
    )
    argv = [
        "start",
        "--host",
        host,
        "--port",
        port,
        "--worker-urls",
        "http://worker-0:8000",
        "http://worker-1:8000",
        "--intra-node-data-parallel-size",
        "2",
        "--policy",
        "consistent_hash",
        "--prometheus-host",
        host,
        "--prometheus-port",
        prometheus_port,
        "--enable-program-scheduling",
        "--program-scheduling-config-json",
        program_json,
    ]
    args = build_parser().parse_args(argv)
    return load_config(getattr(args, "config", None), overrides_from_args(args))


def test_program_launch_command_and_toml_give_the_same_config() -> None:
    from_cli = seed_command_config()
    from_toml = load_config(str(REPO / "configs" / "production.toml"))
    # the file is the seed's launch plus what a public listener needs (docs/operations.md §10)
    assert from_toml.auth.enabled and from_toml.admin.port == 3002 and from_toml.prometheus.host == "127.0.0.1"
    assert attrs.evolve(from_toml, auth=from_cli.auth, admin=from_cli.admin, prometheus=from_cli.prometheus) == from_cli
    assert from_cli.program_scheduling is not None and from_toml.program_scheduling is not None
    assert from_cli.program_scheduling == from_toml.program_scheduling
    assert from_cli.program_scheduling.explicit_coefficients == from_toml.program_scheduling.explicit_coefficients
    assert from_cli.program_scheduling.global_queue is True
    assert from_cli.program_scheduling.token_capacity_per_dp_rank == 266864
    assert [t.target_id for t in from_cli.targets()] == [
        "http://worker-0:8000@0",
        "http://worker-0:8000@1",
        "http://worker-1:8000@0",
        "http://worker-1:8000@1",
    ]


async def _run_and_probe(cfg: AgentdConfig) -> tuple[dict, str, list[tuple[str, int | None]]]:
    worker = ProgramWorker(("http://worker-0:8000", "http://worker-1:8000"), dp=2)
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, cfg, client_factory=worker.client, rng=random.Random(0)))
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=30) as client:
            assert (await client.get("/health")).status_code == 200
            r = await client.post("/v1/chat/completions", json=chat("hello", "task-a:lead"))
            assert r.status_code == 200
            diag = (await client.get("/scheduling/diagnostics")).json()
        async with httpx.AsyncClient(timeout=30) as client:
            metrics = (await client.get(handles.metrics_url + "/metrics")).text
        handles.shutdown.set()
    return diag, metrics, [(s.name, s.rank) for s in worker.seen]


async def test_program_launch_command_runs_and_toml_behaves_the_same() -> None:
    local = {
        "server": ServerConfig(host="127.0.0.1", port=0),
        "prometheus": PrometheusConfig("127.0.0.1", 0),
        "auth": AuthConfig(),  # no key file on a test machine; keys are tested in tests/http/test_auth.py
        "admin": AdminConfig(),
    }
    cli_cfg = attrs.evolve(seed_command_config(), **local)
    toml_cfg = attrs.evolve(load_config(str(REPO / "configs" / "production.toml")), **local)
    cli_diag, cli_metrics, cli_seen = await _run_and_probe(cli_cfg)
    toml_diag, _, toml_seen = await _run_and_probe(toml_cfg)
    assert [r["target_id"] for r in cli_diag["ranks"]] == [
        "http://worker-0:8000@0",
        "http://worker-0:8000@1",
        "http://worker-1:8000@0",
        "http://worker-1:8000@1",
    ]
    assert cli_diag["global_queue"] is True and cli_diag["resume_order"] == "mru"
    assert all(r["configured_token_capacity"] == 266864 for r in cli_diag["ranks"])
    assert "vllm_router_agent_aware_transitions_total{" in cli_metrics
    # same binding for the same Program, same configuration summary
    assert cli_seen == toml_seen
    assert cli_diag["configuration"] == toml_diag["configuration"]
