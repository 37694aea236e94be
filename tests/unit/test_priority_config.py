"""``[priority]`` and ``[tenants]``: structure, field rules, worker policies (docs/config.md)."""

from __future__ import annotations

import tomllib

import pytest

from actors.core.config import PriorityConfig as CorePriorityConfig
from daemon.config import PriorityRule
from daemon.config_loading import ConfigError, config_from_dict, config_warnings, dump_config
from daemon.http.priority import PriorityInfo, engine_priority

GOOD = """
[routing]
worker_urls = ["http://w0:8000", "http://w1:8000"]

[priority]
max_abs_priority = 100
default_worker_policy = "fcfs"
worker_policies = { "http://w1:8000/" = "priority" }

tenant_weights = { acme = 2.0 }

[priority.batch]
max_running_per_rank = 2

[[priority.rules]]
tenant = "eval"
set_class = "batch"

[[priority.rules]]
header = "x-team=search"
max_class = "agent"
max_priority = 10

[tenants]
header = "x-tenant"
use_openai_user = false
metrics_top_k = 3
metrics_tenants = ["acme"]
"""


def test_sections_load_and_dump() -> None:
    cfg = config_from_dict(tomllib.loads(GOOD))
    assert cfg.priority.max_abs_priority == 100
    assert cfg.priority.rules == (
        PriorityRule(tenant="eval", set_class="batch"),
        PriorityRule(header="x-team=search", max_class="agent", max_priority=10),
    )
    assert cfg.priority_workers() == frozenset({"http://w1:8000"})
    core = cfg.priority.core()  # the scheduler's part, as the core's own type
    assert type(core) is CorePriorityConfig
    assert core.batch.max_running_per_rank == 2 and core.weight("acme") == 2.0
    assert cfg.tenants.header == "x-tenant" and cfg.tenants.metrics_tenants == ("acme",)
    dumped = dump_config(cfg)
    assert dumped["priority"]["rules"][1]["max_priority"] == 10
    assert dumped["tenants"]["use_openai_user"] is False


def test_defaults_send_priority_to_no_external_worker() -> None:
    cfg = config_from_dict({"routing": {"worker_urls": ["http://w0:8000"]}})
    assert cfg.priority_workers() == frozenset()
    raw = {"routing": {"worker_urls": ["http://w0:8000"]}, "priority": {"default_worker_policy": "priority"}}
    every = config_from_dict(raw)
    assert every.priority_workers() == frozenset({"http://w0:8000"})


def test_auto_workers_are_sent_priority_while_detected() -> None:
    raw = {
        "routing": {"worker_urls": ["http://w0:8000", "http://w1:8000"]},
        "priority": {"worker_policies": {"http://w1:8000": "auto"}},
    }
    cfg = config_from_dict(raw)
    assert cfg.priority_workers() == cfg.priority_detect_workers() == frozenset({"http://w1:8000"})


def test_embedded_workers_follow_their_simulated_policy() -> None:
    assert config_from_dict({}).priority_workers() == frozenset()
    cfg = config_from_dict({"embedded": {"scheduling_policy": "priority", "num_workers": 2}})
    assert cfg.priority_workers() == frozenset(cfg.worker_urls())


P = "priority"
R = "priority.rules"


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"priority": {"max_abs_priority": 0}}, "priority.max_abs_priority: must be an integer in [1, 10**18]"),
        # larger, the engine value band * (2M + 1) - p overflowed vLLM's int64 and every agent and
        # batch request got the worker's 400 about a priority it never sent (session-35 walk)
        ({P: {"max_abs_priority": 10**18 + 1}}, "priority.max_abs_priority: must be an integer in [1, 10**18]"),
        ({P: {"rules": [{"header": "bad header=x"}]}}, "priority.rules[0].header: must be null, NAME or NAME=VALUE"),
        ({P: {"rules": [{"header": "content-length"}]}}, "priority.rules[0].header: must be null, NAME or NAME=VALUE"),
        ({"tenants": {"header": "bad header"}}, "tenants.header: must be a lower-case HTTP header name"),
        ({"tenants": {"header": "x-t\u00e9"}}, "tenants.header: must be a lower-case HTTP header name"),
        ({"tenants": {"header": "content-length"}}, "tenants.header: must be a lower-case HTTP header name"),
        ({"tenants": {"metrics_top_k": 100_000_000}}, "tenants.metrics_top_k: must be an integer in [0, 1000]"),
        ({"tenants": {"metrics_tenants": [""]}}, "tenants.metrics_tenants: must be a list of tenant names"),
        ({"tenants": {"metrics_tenants": [" a"]}}, "tenants.metrics_tenants: must be a list of tenant names"),
        (
            {P: {"vtc_input_token_weight": 0, "vtc_output_token_weight": 0.0, "vtc_kv_token_second_weight": 0}},
            "priority.vtc_input_token_weight, vtc_output_token_weight, vtc_kv_token_second_weight: must not all be 0",
        ),
        ({"priority": {"default_worker_policy": "sjf"}}, "priority.default_worker_policy: must be one of"),
        ({"priority": {"worker_policies": {"w0": "priority"}}}, "priority.worker_policies: keys must be http"),
        ({P: {"worker_policies": {"http://w0:1": "lifo"}}}, "priority.worker_policies.http://w0:1: must be one of"),
        ({"priority": {"rules": [{"set_class": "agent"}]}}, "priority.rules[0].set_class: must be null or one of"),
        ({"priority": {"rules": [{"max_class": "vip"}]}}, "priority.rules[0].max_class: must be null or one of"),
        ({"priority": {"rules": [{"origin": "cli"}]}}, "priority.rules[0].origin: must be null or one of"),
        ({"priority": {"rules": [{"header": "=x"}]}}, "priority.rules[0].header: must be null, NAME or NAME=VALUE"),
        ({P: {"rules": [{}, {"min_priority": 3, "max_priority": 1}]}}, f"{R}[1].min_priority: must be <="),
        ({P: {"rules": [{"default_priority": 2_000_000}]}}, f"{R}[0].default_priority: must be within"),
        ({"priority": {"rules": [{"colour": "red"}]}}, "priority.rules[0].colour: unknown key"),
        ({"priority": {"rules": [{"max_priority": "10"}]}}, "priority.rules[0].max_priority: must be an integer"),
        ({"tenants": {"header": "X-Tenant"}}, "tenants.header: must be a lower-case HTTP header name"),
        ({"tenants": {"metrics_top_k": -1}}, "tenants.metrics_top_k: must be an integer in [0, 1000]"),
        ({P: {"batch": {"max_kv_share": 0}}}, "priority.batch.max_kv_share: must be finite and within (0, 1]"),
        ({P: {"class_order": ["batch", "agent", "interactive"]}}, "priority.class_order: must list"),
    ],
)
def test_bad_fields_are_named(raw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert any(line.startswith(needle) for line in err.value.lines), err.value.lines


def test_the_largest_bounds_are_accepted() -> None:
    cfg = config_from_dict(
        {
            "priority": {"max_abs_priority": 10**18, "fairness": "off", "vtc_input_token_weight": 0},
            "tenants": {"metrics_top_k": 1000, "metrics_tenants": ["alice", "zo\u00eb"], "header": "x-org_id"},
        }
    )
    top = engine_priority(PriorityInfo("batch", -(10**18)), 10**18)
    assert top == 2 * (2 * 10**18 + 1) + 10**18 < 2**63  # the last band's largest value fits vLLM's int64
    assert cfg.tenants.metrics_tenants == ("alice", "zo\u00eb")


def test_scheduler_only_priority_fields_without_the_scheduler_warn() -> None:
    cfg = config_from_dict({"priority": {"tenant_pause_share": True, "heavy_tenant_max_active_per_rank": 0}})
    (warning,) = config_warnings(cfg)
    assert warning.event == "priority_without_scheduler"
    assert dict(warning.fields)["fields"] == "tenant_pause_share,heavy_tenant_max_active_per_rank"
    edge_only = config_from_dict({"priority": {"max_abs_priority": 5, "rules": [{"default_priority": 1}]}})
    assert config_warnings(edge_only) == []  # the edge reads these without the scheduler
    on = config_from_dict({"priority": {"tenant_pause_share": True}, "enable_program_scheduling": True})
    assert "priority_without_scheduler" not in [w.event for w in config_warnings(on)]


@pytest.mark.parametrize(("reserved", "warned"), [(1, False), (2, True), (5, True)])
def test_reserving_every_rank_warns(reserved: int, warned: bool) -> None:
    cfg = config_from_dict(
        {
            "enable_program_scheduling": True,
            "embedded": {"num_workers": 1, "dp_size": 2},
            "priority": {"interactive_reserved_ranks": reserved},
        }
    )
    events = [w.event for w in config_warnings(cfg)]
    assert ("interactive_reserved_ranks_cover_every_rank" in events) is warned


def test_interactive_scheduling_without_the_scheduler_warns() -> None:
    cfg = config_from_dict({"priority": {"interactive_scheduling": True}})
    assert [w.event for w in config_warnings(cfg)] == ["interactive_scheduling_without_scheduler"]
    on = config_from_dict({"priority": {"interactive_scheduling": True}, "enable_program_scheduling": True})
    assert "interactive_scheduling_without_scheduler" not in [w.event for w in config_warnings(on)]
