"""The body agentd forwards: splicing the client's bytes (a body with a layout) gives the same JSON
value as re-encoding the decoded body (the same request without one), for arbitrary agent bodies,
every forwarding mode, priority and stock workers, and streams with or without usage."""

from __future__ import annotations

import json
import random
from typing import Any

import attrs
import httpx
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from actors.core.config import BackendTarget
from daemon.dispatch import NativeDispatcher
from daemon.http.errors import ApiError
from daemon.http.proxy import ProgramRoute, ProxyEngine
from daemon.metrics import ProxyMetrics

TARGET = BackendTarget(worker_url="http://w:1", dp_rank=0, target_id="http://w:1@0", index=0)


class Lease:
    target = TARGET
    attempt = 0

    def __init__(self, wants_usage: bool) -> None:
        self.wants_usage = wants_usage


class Health:
    def healthy_targets(self) -> tuple[BackendTarget, ...]:
        return (TARGET,)


# One client for every engine: these tests never send, and building a client loads the system's CA
# certificates (about 30 ms, which was most of each example's time).
CLIENT = httpx.AsyncClient()


def make_engine(mode: str, priority_worker: bool) -> ProxyEngine:
    native = NativeDispatcher([TARGET], "round_robin", Health(), random.Random(0))  # type: ignore[arg-type]
    return ProxyEngine(
        client=CLIENT,
        native=native,
        metrics=ProxyMetrics(CollectorRegistry(), [TARGET.target_id]),
        agentic_context_forwarding=mode,
        program=ProgramRoute("vllm_xargs.agentic_context", native),
        priority_workers=frozenset({TARGET.worker_url}) if priority_worker else frozenset(),
    )


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
SCALAR = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | TEXT
CONTEXT = st.fixed_dictionaries(
    {"program_id": st.sampled_from(["p1", "é-agent", 'q"uote'])},
    optional={"step_id": st.integers(0, 9), "priority": st.integers(-5, 5), "note": TEXT},
)
XARGS = st.dictionaries(st.sampled_from(["top_k", "seed", "x"]), SCALAR, max_size=2).flatmap(
    lambda rest: st.one_of(st.just(rest), CONTEXT.map(lambda c: {**rest, "agentic_context": c}))
)
OPTIONAL = {
    "stream": st.booleans(),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"include_usage": st.booleans()})),
    "priority": st.integers(-3, 3),
    "vllm_xargs": XARGS,
    "temperature": st.floats(0, 2),
    "metadata": st.dictionaries(TEXT, SCALAR, max_size=3),
}


@st.composite
def agent_bodies(draw: st.DrawFn, pad: bool = True) -> bytes:
    messages = draw(
        st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": TEXT}),
            min_size=1,
            max_size=4,
        )
    )
    body: dict[str, Any] = {"model": "m", "messages": messages}
    for key in draw(st.permutations(list(OPTIONAL))):
        if draw(st.booleans()):
            body[key] = draw(OPTIONAL[key])
    if pad:  # over MIN_LAYOUT_BYTES: the body keeps its layout
        body["messages"].append({"role": "user", "content": "x" * 2100})
    styles: list[dict[str, Any]] = [{}, {"ensure_ascii": False}, {"separators": (",", ":")}, {"indent": 1}]
    style = draw(st.sampled_from(styles))
    return json.dumps(body, **style).encode()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=agent_bodies(),
    mode=st.sampled_from(["strip", "json_string", "unchanged"]),
    priority_worker=st.booleans(),
    wants_usage=st.booleans(),
)
def test_spliced_body_equals_the_re_encoded_body(
    raw: bytes, mode: str, priority_worker: bool, wants_usage: bool
) -> None:
    engine = make_engine(mode, priority_worker)
    try:
        req = engine.build_request("chat", raw, {"content-type": "application/json"})
    except ApiError as error:  # body and context priorities that disagree: a 400, nothing forwarded
        assert error.param == "priority"
        reject()
    assert req.layout is not None
    lease: Any = Lease(wants_usage)
    spliced, inject = engine._outgoing_body(req, lease, raw)
    reencoded, inject_too = engine._outgoing_body(attrs.evolve(req, layout=None), lease, None)
    assert inject == inject_too
    assert json.loads(spliced) == json.loads(reencoded)
    if spliced != raw:  # an edit was made: by splicing (this body is over MIN_LAYOUT_BYTES, keys unique)
        engine.metrics.batch.flush()  # (a scrape flushes it: actors/metric_batch.py)
        assert engine.metrics.body_rewrites.labels("raw")._value.get() == 1


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=agent_bodies(pad=False),
    mode=st.sampled_from(["strip", "json_string", "unchanged"]),
    priority_worker=st.booleans(),
    wants_usage=st.booleans(),
)
def test_a_small_body_is_spliced_when_its_one_edit_is_its_last_member(
    raw: bytes, mode: str, priority_worker: bool, wants_usage: bool
) -> None:
    """Under MIN_LAYOUT_BYTES (no layout): one edited member that ends the body (an agent SDK's
    ``vllm_xargs``, a ``priority`` stripped for a stock worker) is spliced, anything else
    re-encoded; the same JSON value either way (docs/benchmarks.md §10.2.7)."""
    engine = make_engine(mode, priority_worker)
    try:
        req = engine.build_request("chat", raw, {"content-type": "application/json"})
    except ApiError as error:
        assert error.param == "priority"
        reject()
    assert req.layout is None
    lease: Any = Lease(wants_usage)
    sent, inject = engine._outgoing_body(req, lease, raw)
    reencoded, inject_too = engine._outgoing_body(req, lease, None)
    assert inject == inject_too
    assert json.loads(sent) == json.loads(reencoded)
    if sent == raw:
        return
    engine.metrics.batch.flush()
    spliced = engine.metrics.body_rewrites.labels("raw")._value.get()
    small = engine.metrics.body_rewrites.labels("reencode_small")._value.get()
    assert (spliced, small) in ((1, 0), (0, 1))
    if spliced:  # the body's last member was the one edited: what precedes it keeps its bytes
        last = list(req.body)[-1]
        assert last in ("vllm_xargs", "priority", "stream_options")
        kept = raw[: raw.rfind(json.dumps(last).encode())].rstrip(b" \t\n\r")
        assert sent.startswith(kept[:-1] if kept.endswith(b",") else kept)


def test_an_agent_sdk_body_is_spliced_below_the_layout_size() -> None:
    """The overhead bench's 1 KB agent body (``vllm_xargs`` last, as an SDK's extra body puts it):
    the agentic context is cut out of the client's bytes, the conversation left as written."""
    from bench.proxy_overhead import agent_body, program_context

    engine = make_engine("strip", False)
    raw = agent_body(1, program_context(0))
    req = engine.build_request("chat", raw, {"content-type": "application/json"})
    assert req.layout is None
    sent, _ = engine._outgoing_body(req, Lease(False), raw)  # type: ignore[arg-type]
    expected = {k: v for k, v in json.loads(raw).items() if k != "vllm_xargs"}
    assert json.loads(sent) == expected
    assert raw.startswith(sent[:-1])  # the same bytes up to the cut member
    engine.metrics.batch.flush()
    assert engine.metrics.body_rewrites.labels("raw")._value.get() == 1
