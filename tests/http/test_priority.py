"""Class, priority and tenant resolution at the edge (daemon/http/priority.py, docs/priority.md §5)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.config import PriorityRule, PrioritySection, TenantsConfig
from daemon.http.errors import ApiError
from daemon.http.priority import (
    AGENT,
    BATCH,
    INTERACTIVE,
    PriorityInfo,
    batch_job_for,
    client_priority,
    engine_priority,
    resolve,
)


def res(
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    *,
    identity: bool = False,
    batch: bool = False,
    principal: str | None = None,
    origin: str = "http",
    rules: tuple[PriorityRule, ...] = (),
    tenants: TenantsConfig | None = None,
    max_abs: int = 1000,
) -> PriorityInfo:
    return resolve(
        body=body or {},
        headers=headers or {},
        has_identity=identity,
        batch=batch,
        principal=principal,
        origin=origin,
        priority=PrioritySection(max_abs_priority=max_abs, rules=rules),
        tenants=tenants or TenantsConfig(),
    )


def ctx(priority: Any) -> dict[str, Any]:
    return {"vllm_xargs": {"agentic_context": {"program_id": "p", "priority": priority}}}


def test_both_conventions_map_to_larger_runs_first() -> None:
    assert client_priority({}, 10) is None
    assert client_priority({"priority": 3}, 10) == -3  # vLLM: lower first
    assert client_priority({"priority": -3}, 10) == 3
    assert client_priority(ctx(5), 10) == 5  # agentic_context: larger first
    assert client_priority({"vllm_xargs": {"agentic_context": '{"priority": 7}'}}, 10) == 7
    assert client_priority({**ctx(4), "priority": -4}, 10) == 4  # the same order in both
    assert client_priority({"priority": None}, 10) is None


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"priority": "high"}, "priority", "invalid_priority"),
        ({"priority": True}, "priority", "invalid_priority"),
        ({"priority": 1.5}, "priority", "invalid_priority"),
        ({"priority": 11}, "priority", "invalid_priority"),
        ({"priority": -11}, "priority", "invalid_priority"),
        (ctx(11), "vllm_xargs.agentic_context.priority", "invalid_priority"),
        (ctx("x"), "vllm_xargs.agentic_context.priority", "invalid_priority"),
        ({**ctx(4), "priority": 4}, "priority", "conflicting_priority"),
    ],
)
def test_bad_priorities_are_a_400_naming_the_field(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ApiError) as err:
        client_priority(body, 10)
    assert err.value.status == 400 and err.value.param == param and err.value.code == code
    assert param in err.value.message


def test_tenant_precedence_principal_header_user_default() -> None:
    both = {"user": "u1"}
    hdr = {"x-agentd-tenant": "h1"}
    assert (res(both, hdr, principal="key-t").tenant, res(both, hdr, principal="key-t").tenant_source) == (
        "key-t",
        "principal",
    )
    assert res(both, hdr).tenant == "h1" and res(both, hdr).tenant_source == "header"
    assert res(both).tenant == "u1" and res(both).tenant_source == "user"
    assert res().tenant == "default" and res().tenant_source == "default"
    no_user = TenantsConfig(use_openai_user=False, header="x-team")
    assert res(both, {"x-team": " t2 "}, tenants=no_user).tenant == "t2"
    assert res(both, hdr, tenants=no_user).tenant == "default"


def test_bad_tenant_inputs_are_a_400_naming_the_field() -> None:
    with pytest.raises(ApiError) as err:
        res({"user": 7})
    assert err.value.param == "user"
    with pytest.raises(ApiError) as err:
        res({"user": "x" * 300})
    assert err.value.param == "user"
    with pytest.raises(ApiError) as err:
        res({}, {"x-agentd-tenant": "caf\u00e9"})
    assert err.value.param == "x-agentd-tenant"


@pytest.mark.parametrize(
    ("body", "headers", "param", "needle"),
    [
        # the header given twice arrives joined with ", ": it named a tenant "alice, bob"
        ({}, {"x-agentd-tenant": "alice, bob"}, "x-agentd-tenant", "must name one tenant"),
        # the user field was taken whole: a NUL reached the /metrics label as a raw byte
        ({"user": "a\u0000b"}, {}, "user", "U+0000 at index 1"),
        ({"user": "new\nline"}, {}, "user", "U+000A at index 3"),
        ({"user": "a\u202eb"}, {}, "user", "U+202E at index 1"),
        ({"user": "a\u0085b"}, {}, "user", "U+0085 at index 1"),
    ],
)
def test_unshowable_tenants_are_a_400_naming_the_field(
    body: dict[str, Any], headers: dict[str, str], param: str, needle: str
) -> None:
    with pytest.raises(ApiError) as err:
        res(body, headers)
    assert (err.value.status, err.value.param) == (400, param) and needle in err.value.message
    assert err.value.code in ("invalid_tenant", "invalid_user")


def test_unicode_user_names_are_tenants() -> None:
    for name in ("zo\u00eb\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u5f20\u4e09"):
        assert res({"user": name}).tenant == name  # a joiner inside an emoji is not a control


def test_class_from_the_request() -> None:
    assert res().request_class == INTERACTIVE
    assert res(batch=True).request_class == BATCH
    assert res(identity=True).request_class == AGENT
    assert res(identity=True, batch=True).request_class == AGENT


def test_rules_force_and_cap_the_class_first_match_wins() -> None:
    rules = (
        PriorityRule(tenant="eval", set_class=BATCH),
        PriorityRule(header="x-team=search", max_class=AGENT, max_priority=5),
        PriorityRule(origin="batch_api", default_priority=-7),
        PriorityRule(model="big", max_class=BATCH, min_priority=-2),
        PriorityRule(max_priority=100),  # matches everything else
    )
    assert res({"user": "eval"}, rules=rules) == PriorityInfo(BATCH, 0, "eval", "user", 0)
    # a client asking for interactive under an agent cap becomes batch (the only identity-free class below)
    capped = res({"priority": -50}, {"x-team": "search", "x-agentd-class": "interactive"}, rules=rules)
    assert capped.request_class == BATCH and capped.priority == 5 and capped.rule == 1
    assert res({}, {"x-team": "other"}, rules=rules).rule == 4
    # a Program request stays agent class, only its priority is capped
    program = res(ctx(50), {"x-team": "search"}, identity=True, rules=rules)
    assert program.request_class == AGENT and program.priority == 5
    assert res(origin="batch_api", batch=True, rules=rules).priority == -7  # a default, not a cap
    assert res({"priority": -3}, origin="batch_api", batch=True, rules=rules).priority == 3
    big = res({"model": "big", "priority": 9}, rules=rules)
    assert big.request_class == BATCH and big.priority == -2
    assert res({"priority": -500}, rules=rules).priority == 100
    # a rule never raises the class: a batch request stays batch under an interactive cap
    assert res(batch=True, rules=(PriorityRule(max_class=INTERACTIVE),)).request_class == BATCH


def test_batch_job_follows_the_class() -> None:
    assert batch_job_for(PriorityInfo(BATCH), None) == "__default__"
    assert batch_job_for(PriorityInfo(BATCH), "j") == "j"
    assert batch_job_for(PriorityInfo(INTERACTIVE), "j") is None
    assert batch_job_for(PriorityInfo(AGENT), "j") is None


def test_engine_priority_keeps_bands_and_order() -> None:
    m = 10
    assert engine_priority(PriorityInfo(INTERACTIVE, 3), m) == -3
    values = [
        engine_priority(PriorityInfo(cls, p), m)
        for cls in (INTERACTIVE, AGENT, BATCH)
        for p in (m, 0, -m)  # larger first inside a class
    ]
    assert values == sorted(values) and len(set(values)) == len(values)  # lower runs first in vLLM
    assert engine_priority(PriorityInfo(BATCH, 0), m, (BATCH, INTERACTIVE, AGENT)) == 0


@given(
    st.sampled_from([INTERACTIVE, AGENT, BATCH]),
    st.integers(-50, 50),
    st.sampled_from([INTERACTIVE, AGENT, BATCH]),
    st.integers(-50, 50),
    st.permutations([INTERACTIVE, AGENT, BATCH]),
)
def test_engine_order_is_the_router_order(c1: str, p1: int, c2: str, p2: int, bands: list[str]) -> None:
    """vLLM runs lower values first; the router runs earlier bands first, then larger priorities."""
    e1 = engine_priority(PriorityInfo(c1, p1), 50, bands)
    e2 = engine_priority(PriorityInfo(c2, p2), 50, bands)
    router = (bands.index(c1), -p1) < (bands.index(c2), -p2)
    assert (e1 < e2) == router and (e1 == e2) == ((c1, p1) == (c2, p2))
