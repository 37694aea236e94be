"""Tenants, request classes and priorities in the trace format, replay and report (docs/traces.md,
"Tenants and classes"), and the adversarial scenarios built from them (bench/fairness/scenarios.py)."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from trace_fake_worker import FakeWorker

from bench.fairness.scenarios import KINDS, ClusterSize, build, subset, truncate
from bench.replay import ReplayOptions
from bench.report import measured_replay
from bench.trace.format import TraceError, dumps_trace, read_trace

URL = "http://worker"


def _trace(lines: list[dict], meta: dict | None = None):
    text = json.dumps({"meta": meta}) + "\n" if meta is not None else ""
    text += "".join(json.dumps(line) + "\n" for line in lines)
    return read_trace(io.StringIO(text))


def _rec(sid: str, turn: int, delta: int, out: int, **extra: object) -> dict:
    return {"session_id": sid, "turn": turn, "input_delta": delta, "output_length": out, **extra}


def test_tenant_and_class_fields_round_trip_and_default_to_absent() -> None:
    trace = _trace(
        [
            _rec("a", 0, 10, 5, tenant="acme"),
            _rec("i", 0, 10, 5, tenant="web", request_class="interactive", priority=-3),
            _rec("b", 0, 10, 5, job="j", request_class="batch"),
            _rec("c", 0, 10, 5),
        ]
    )
    assert [r.klass for r in trace.records] == ["agent", "interactive", "batch", "agent"]
    assert [r.tenant for r in trace.records] == ["acme", "web", "default", "default"]
    text = dumps_trace(trace)
    assert read_trace(io.StringIO(text)) == trace
    last = json.loads(text.splitlines()[-1])
    assert "tenant" not in last and "request_class" not in last  # older traces keep their bytes


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tenant": ""}, "field 'tenant' must not be empty"),
        ({"tenant": 3}, "field 'tenant' must be str"),
        ({"request_class": "vip"}, "field 'request_class' must be one of"),
        ({"request_class": "batch"}, "needs a 'job' exactly when it is 'batch'"),
        ({"request_class": "interactive", "job": "j"}, "needs a 'job' exactly when it is 'batch'"),
    ],
)
def test_bad_tenant_or_class_names_the_field(extra: dict, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        _trace([_rec("a", 0, 10, 5, **extra)])


def test_tenant_and_class_are_per_session() -> None:
    with pytest.raises(TraceError, match="line 2: field 'tenant' must be the same on every turn"):
        _trace([_rec("a", 0, 10, 5, tenant="x"), _rec("a", 1, 10, 5, tenant="y")])
    with pytest.raises(TraceError, match="field 'request_class' must be the same on every turn"):
        _trace([_rec("a", 0, 10, 5), _rec("a", 1, 10, 5, request_class="interactive")])


async def test_replay_sends_tenant_class_and_priority_and_reports_them(autojump_clock) -> None:
    worker = FakeWorker()
    trace = _trace(
        [
            _rec("a", 0, 10, 5, tenant="acme", priority=2),
            _rec("a", 1, 10, 5, tenant="acme", priority=2, pre_gap_ms=100.0, role="tool"),
            _rec("i", 0, 10, 4, tenant="web", request_class="interactive", priority=-3, timestamp=50.0),
            _rec("b", 0, 10, 2, job="j", tenant="acme", priority=5, stream=False),
            _rec("c", 0, 10, 3),
        ],
        meta={"arrival": "closed_loop", "concurrency": 1},
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        report = await measured_replay(trace, client, URL, ReplayOptions(), worker_metrics=[], router_metrics=[])
    sent = {h["x-request-id"]: (h, b) for h, b in zip(worker.headers, worker.bodies, strict=True)}
    h, b = sent["a-t0"]
    assert h["x-agentd-tenant"] == "acme" and b["user"] == "acme"
    assert b["vllm_xargs"]["agentic_context"]["priority"] == -2  # agentd's convention: larger first
    assert "priority" not in b and "x-agentd-class" not in h
    h, b = sent["i-t0"]
    assert h["x-agentd-class"] == "interactive" and "x-session-id" not in h
    assert "vllm_xargs" not in b and b["priority"] == -3 and b["user"] == "web" and b["stream"] is True
    h, b = sent["b-t0#job_name[j]#"]
    assert h["x-agentd-class"] == "batch" and b["priority"] == 5 and b["user"] == "acme"
    h, b = sent["c-t0"]
    assert "x-agentd-tenant" not in h and "user" not in b and "priority" not in b
    assert b["vllm_xargs"]["agentic_context"]["priority"] == 0

    # the interactive root starts at its timestamp (open loop), outside the closed loop of 1
    assert report["tasks"] == {"planned": 2, "completed": 2, "failed": 0}  # the agent tasks a and c
    tenants = report["tenants"]
    assert set(tenants) == {"acme", "web", "default"}
    assert tenants["acme"]["requests"] == 3 and tenants["acme"]["tasks"] == {"completed": 1, "failed": 0}
    assert tenants["acme"]["jct_seconds"]["mean"] == pytest.approx(0.15 + 0.1 + 0.15)
    assert tenants["web"]["ttft_seconds"]["p90"] == pytest.approx(0.11)  # first token after 0.1 + 0.01 s
    assert tenants["web"]["jct_seconds"] == {"count": 0}
    assert tenants["default"]["service_tokens"] > 0
    classes = report["classes"]
    assert {k: v["requests"] for k, v in classes.items()} == {"agent": 3, "batch": 1, "interactive": 1}


async def test_report_has_no_tenant_sections_for_a_single_tenant_trace(autojump_clock) -> None:
    worker = FakeWorker()
    trace = _trace([_rec("a", 0, 10, 5)])
    async with httpx.AsyncClient(transport=httpx.MockTransport(worker.handler)) as client:
        report = await measured_replay(trace, client, URL, ReplayOptions(), worker_metrics=[], router_metrics=[])
    assert "tenants" not in report and "classes" not in report


CLUSTER = ClusterSize(ranks=2, kv_tokens_per_rank=65_536)


@pytest.mark.parametrize("kind", KINDS)
def test_scenarios_are_deterministic_and_hold_victim_and_adversary(kind: str) -> None:
    s = build(kind, CLUSTER, seed=3)
    assert dumps_trace(s.trace) == dumps_trace(build(kind, CLUSTER, seed=3).trace)
    tenants = {r.tenant for r in s.trace.records}
    assert tenants == {s.victim, s.adversary}
    assert {r.tenant for r in s.alone.records} == {s.victim}
    victim_sessions = s.sessions_of(s.victim)
    assert list(s.alone.sessions()) == victim_sessions
    assert s.trace.meta.arrival == "poisson" and all(
        recs[0].timestamp is not None for recs in s.trace.sessions().values() if recs[0].parent_session_id is None
    )
    # it survives a round trip through the file format
    assert read_trace(io.StringIO(dumps_trace(s.trace))) == s.trace


def test_flood_is_far_more_than_fits_and_the_light_tenant_well_under_half() -> None:
    s = build("flood", CLUSTER, seed=0)
    flood, light = len(s.sessions_of("flood")), len(s.sessions_of("light"))
    assert flood >= 2 * light * 4 and light >= 3
    urgent = build("priority-flood", CLUSTER, seed=0)
    assert {r.priority for r in urgent.trace.records if r.tenant == "flood"} == {-10}
    assert {r.priority for r in urgent.trace.records if r.tenant == "light"} == {0}
    hogs = build("hogs", CLUSTER, seed=0)
    assert min(r.input_length for r in hogs.trace.records if r.tenant == "hog") >= 0.45 * 65_536 - 1
    mixed = build("interactive-under-batch", CLUSTER, seed=0)
    assert {r.klass for r in mixed.trace.records} == {"interactive", "batch"}


@pytest.mark.parametrize("kind", ["flood", "hogs", "priority-flood"])
def test_agent_roots_are_written_in_start_order(kind: str) -> None:
    """The replay starts open-loop agent roots in file order, each at its timestamp: the adversary
    "at t = 0" must come before the light tenant's later roots, or it starts after the last one."""
    s = build(kind, CLUSTER, seed=0)
    starts = [recs[0].timestamp or 0.0 for recs in s.trace.sessions().values() if recs[0].parent_session_id is None]
    assert starts == sorted(starts) and starts[0] == 0.0
    first = next(iter(s.trace.sessions().values()))[0]
    assert first.tenant == s.adversary


def test_subset_and_truncate_keep_a_valid_trace() -> None:
    s = build("flood", CLUSTER, seed=0)
    keep = s.sessions_of("light")[:2] + s.sessions_of("flood")[:3]
    small = subset(s.trace, keep)
    assert list(small.sessions()) == [sid for sid in s.trace.sessions() if sid in keep] and small.meta.programs == 5
    short = truncate(small, 2)
    assert max(r.turn for r in short.records) == 1
    assert all(recs[-1].finish_reason == "stop" for recs in short.sessions().values())


def test_tenant_section_reads_the_routers_per_tenant_wait_and_counter() -> None:
    from bench.replay import ReplayResult, RequestResult
    from bench.report import build_report, parse_metrics

    req = RequestResult("a", 0, 0.0, 1.0, 0.5, True, 200, tenant="acme", klass="agent", prompt_tokens=10)
    result = ReplayResult(0.0, 1.0, (req,), (), 1, 1)
    before = parse_metrics('agentd_class_queue_wait_seconds_count{class="agent",tenant="acme"} 1\n')
    after = parse_metrics(
        'agentd_class_queue_wait_seconds_count{class="agent",tenant="acme"} 3\n'
        'agentd_class_queue_wait_seconds_sum{class="agent",tenant="acme"} 0.5\n'
        'agentd_class_queue_wait_seconds_count{class="interactive",tenant="acme"} 2\n'
        'agentd_class_queue_wait_seconds_sum{class="interactive",tenant="acme"} 0.3\n'
        'agentd_tenant_virtual_counter{tenant="acme"} 42\n'
    )
    report = build_report(result, time_scale=2.0, router_before=[before], router_after=[after])
    acme = report["tenants"]["acme"]
    assert acme["router_queue_wait_mean_seconds"] == pytest.approx(0.8 / 4 * 2.0)  # trace seconds
    assert acme["virtual_counter"] == 42.0
