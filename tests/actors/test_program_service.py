"""ProgramDispatcher and its token estimator, without HTTP."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from program_fakes import daemon_config, ok, program_request, program_scheduling
from prometheus_client import CollectorRegistry

from actors.program_metrics import ProgramMetrics
from daemon.program_dispatch import TokenEstimator


def test_token_estimator_momentum_feedback_matches_reference_vector() -> None:
    registry = CollectorRegistry()
    est = TokenEstimator(ProgramMetrics(registry))
    first = program_request("p", tokens=100)  # the proxy's static estimate of 400 bytes
    assert est.estimate("default", first) == 100
    est.feedback("default", first, 200)
    assert est.coefficients[("default", "chat")] == pytest.approx(0.275)
    assert est.estimate("default", program_request("p", tokens=200)) in (220, 221)  # 800 bytes
    est.feedback("default", first, None)
    # token-id prompts count exactly and teach nothing about tokens per byte
    ids = program_request("p", tokens=1000, exact_tokens=37)
    assert est.estimate("default", ids) == 37
    est.feedback("default", ids, 37)
    assert est.coefficients[("default", "chat")] == pytest.approx(0.275)
    get = registry.get_sample_value
    assert (
        get(
            "vllm_router_agent_aware_token_estimate_feedback_total",
            {"model_pool": "default", "endpoint": "chat", "outcome": "observed"},
        )
        == 2.0
    )
    assert (
        get(
            "vllm_router_agent_aware_token_estimate_feedback_total",
            {"model_pool": "default", "endpoint": "chat", "outcome": "missing"},
        )
        == 1.0
    )


def test_token_estimator_with_a_clock_applies_same_instant_feedback_in_content_order() -> None:
    """Deterministic virtual time: feedback reported at one instant (in task wake order) is applied
    sorted once the clock moves on, so both orders give the same coefficient; estimates made at
    that instant still see the previous one."""
    coefficients = []
    for order in ((200, 50), (50, 200)):
        now = [1.0]
        est = TokenEstimator(ProgramMetrics(CollectorRegistry()), clock=lambda now=now: now[0])
        req = program_request("p", tokens=100)  # 400 bytes
        for tokens in order:
            est.feedback("default", req, tokens)
        assert est.estimate("default", req) == 100  # the instant's feedback is not applied yet
        now[0] = 2.0
        assert est.estimate("default", req) != 100
        coefficients.append(est.coefficients[("default", "chat")])
    assert coefficients[0] == coefficients[1] == 0.9 * (0.9 * 0.25 + 0.1 * 0.125) + 0.1 * 0.5
    # without a clock (the daemon on a real clock) each feedback applies at once, in arrival order
    est = TokenEstimator(ProgramMetrics(CollectorRegistry()))
    est.feedback("default", program_request("p", tokens=100), 200)
    assert est.coefficients[("default", "chat")] == pytest.approx(0.275)


async def test_lease_finish_exactly_once(autojump_clock: trio.testing.MockClock) -> None:
    async with program_scheduling(daemon_config(token_capacity_per_dp_rank=10_000)) as (dispatcher, _, _):
        async with dispatcher.lease(program_request("p")) as lease:
            lease.finish(ok())
            with pytest.raises(RuntimeError, match="finished twice"):
                lease.finish(ok())
        diag = await dispatcher.wait_diagnostics(lambda d: d["dispatcher"]["completed_count"] == 1)
        assert diag["dispatcher"]["abandoned_count"] == 0
        assert diag["token_estimation"] == [
            {"model_pool": "default", "endpoint": "chat", "tokens_per_byte": pytest.approx(0.9 * 0.25 + 0.1 * 0.25)}
        ]
        channels = {c["name"]: c for c in diag["channels"]}
        assert channels["scheduler_inbox"]["max_buffer_size"] == 1024
        assert channels["program_actors"]["max_buffer_size"] == 4  # one timer per kind


async def test_lease_refuses_a_request_without_program_identity(autojump_clock: trio.testing.MockClock) -> None:
    async with program_scheduling(daemon_config()) as (dispatcher, _, workers):
        with pytest.raises(ValueError, match="Program identity"):
            async with dispatcher.lease(attrs.evolve(program_request("p"), identity=None)):
                raise AssertionError("unreachable")
        assert dispatcher.diagnostics()["dispatcher"]["submitted_count"] == 0
        assert workers.scrapes == []  # nothing started polling
