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


def make_engine(mode: str, priority_worker: bool) -> ProxyEngine:
    native = NativeDispatcher([TARGET], "round_robin", Health(), random.Random(0))  # type: ignore[arg-type]
    return ProxyEngine(
        client=httpx.AsyncClient(),
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
def agent_bodies(draw: st.DrawFn) -> bytes:
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
    pad = "x" * 2100  # over MIN_LAYOUT_BYTES: the body keeps its layout
    body["messages"].append({"role": "user", "content": pad})
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
