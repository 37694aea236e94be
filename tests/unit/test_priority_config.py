"""``[priority]`` and ``[tenants]``: structure, field rules, worker policies (docs/config.md)."""

from __future__ import annotations

import tomllib

import pytest

from actors.core.config import PriorityConfig as CorePriorityConfig
from daemon.config import PriorityRule
from daemon.config_loading import ConfigError, config_from_dict, config_warnings, dump_config

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
        ({"priority": {"max_abs_priority": 0}}, "priority.max_abs_priority: must be an integer > 0"),
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
        ({"tenants": {"header": "X-Tenant"}}, "tenants.header: must be a lower-case header name"),
        ({"tenants": {"metrics_top_k": -1}}, "tenants.metrics_top_k: must be an integer >= 0"),
        ({P: {"batch": {"max_kv_share": 0}}}, "priority.batch.max_kv_share: must be finite and within (0, 1]"),
        ({P: {"class_order": ["batch", "agent", "interactive"]}}, "priority.class_order: must list"),
    ],
)
def test_bad_fields_are_named(raw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert any(line.startswith(needle) for line in err.value.lines), err.value.lines


def test_interactive_scheduling_without_the_scheduler_warns() -> None:
    cfg = config_from_dict({"priority": {"interactive_scheduling": True}})
    assert [w.event for w in config_warnings(cfg)] == ["interactive_scheduling_without_scheduler"]
    on = config_from_dict({"priority": {"interactive_scheduling": True}, "enable_program_scheduling": True})
    assert "interactive_scheduling_without_scheduler" not in [w.event for w in config_warnings(on)]
