"""Helpers (and the ``event_log`` fixture) for the Program-scheduling actor tests: a controllable
fake vLLM worker (served by httpx.MockTransport, so no real I/O) and a way to drive the
ProgramDispatcher without HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import httpx
import trio
from prometheus_client import CollectorRegistry

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, RoutingConfig
from daemon.dispatch import Outcome, ProxyRequest, Usage
from daemon.http.identity import parse_identity
from daemon.http.requests import PromptSize
from daemon.program_dispatch import ProgramDispatcher, run_program_scheduling


@attrs.define
class FakeWorkers:
    """Per-engine gauges served on ``<url>/metrics``; ``failing`` URLs answer 500."""

    kv: dict[tuple[str, int], float] = attrs.field(factory=dict)
    waiting: dict[tuple[str, int], int] = attrs.field(factory=dict)
    running: dict[tuple[str, int], int] = attrs.field(factory=dict)
    failing: set[str] = attrs.field(factory=set)
    scrapes: list[tuple[float, str]] = attrs.field(factory=list)
    dp_size: int = 2

    def handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}" + (f":{request.url.port}" if request.url.port else "")
        self.scrapes.append((trio.current_time(), base))
        if request.url.path != "/metrics":
            return httpx.Response(404)
        if base in self.failing:
            return httpx.Response(500, text="boom")
        lines = []
        for e in range(self.dp_size):
            lines.append(f'vllm:kv_cache_usage_perc{{engine="{e}"}} {self.kv.get((base, e), 0.0)}')
            lines.append(f'vllm:num_requests_running{{engine="{e}"}} {self.running.get((base, e), 0)}')
            lines.append(f'vllm:num_requests_waiting{{engine="{e}"}} {self.waiting.get((base, e), 0)}')
        return httpx.Response(200, text="\n".join(lines) + "\n")


@attrs.define
class FakeHealth:
    """A health board whose healthy workers the test sets."""

    targets: tuple[Any, ...]
    unhealthy_urls: set[str] = attrs.field(factory=set)

    def healthy_targets(self) -> tuple[Any, ...]:
        return tuple(t for t in self.targets if t.worker_url not in self.unhealthy_urls)

    def unhealthy_reason(self) -> str:
        return ",".join(sorted(self.unhealthy_urls))


def daemon_config(workers: tuple[str, ...] = ("http://w0:8000",), dp: int = 2, **ps: Any) -> AgentdConfig:
    return AgentdConfig(
        routing=RoutingConfig(worker_urls=workers, intra_node_data_parallel_size=dp),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(**ps),
    )


_counter = 0


def program_request(
    program_id: str, *, tokens: int = 100, endpoint: str = "chat", exact_tokens: int | None = None, **ctx: Any
) -> ProxyRequest:
    """A chat request whose prompt text is ``4 * tokens`` bytes (``tokens`` at the default 0.25
    tokens per byte), or given as ``exact_tokens`` token ids."""
    global _counter
    _counter += 1
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "vllm_xargs": {"agentic_context": {"program_id": program_id, **ctx}},
    }
    identity = parse_identity(body, {})
    assert identity is not None
    return ProxyRequest(
        request_id=f"agentd-{_counter}",
        endpoint=endpoint,
        body=body,
        headers={},
        model="m",
        stream=False,
        prompt=PromptSize(text_bytes=4 * tokens, exact_tokens=exact_tokens),
        routing_text="x",
        identity=identity,
    )


def ok(prompt: int = 100, cached: int | None = 0, completion: int = 10) -> Outcome:
    return Outcome(True, Usage(prompt, cached, completion), None, None, None)


@asynccontextmanager
async def program_scheduling(
    cfg: AgentdConfig, workers: FakeWorkers | None = None, health: Any = None, settle: Any = None
) -> AsyncIterator[tuple[ProgramDispatcher, CollectorRegistry, FakeWorkers]]:
    workers = workers or FakeWorkers(dp_size=cfg.routing.intra_node_data_parallel_size)
    registry = CollectorRegistry()
    async with httpx.AsyncClient(transport=httpx.MockTransport(workers.handler)) as client:
        async with trio.open_nursery() as nursery:
            dispatcher = await nursery.start(
                partial(run_program_scheduling, cfg, client, registry, health=health, settle=settle)
            )
            yield dispatcher, registry, workers
            nursery.cancel_scope.cancel()
