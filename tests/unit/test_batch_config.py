"""The ``[batch_jobs]`` section: defaults, rules, the seed's JSON shape and the CLI (docs/config.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from actors.core.config import BatchJobsConfig, problems
from daemon.cli import main
from daemon.config import AgentdConfig
from daemon.config_loading import ConfigError, config_from_dict, dump_config, load_config

SEED = "scheduler_config.batch_job_sched_config"
ENABLES = "requires enable_program_scheduling = true"


def errors_of(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    return info.value.lines


def test_defaults_are_the_seeds_plus_agentds() -> None:
    b = BatchJobsConfig()
    assert (b.enabled, b.max_jobs, b.reserve_margin_blocks, b.reserve_max_blocks) == (False, 20, 2, 8)
    assert (b.low_available_tokens_threshold, b.short_decode_token_threshold) == (4096, 32)
    assert (b.block_size_tokens, b.max_wait_seconds) == (16, 30.0)
    assert (b.guaranteed_kv_share, b.max_decode_slowdown, b.engine_queue_requests) == (0.25, 1.0, 48)
    assert AgentdConfig().batch_jobs == b
    assert config_from_dict({}).batch_jobs == b
    assert problems(b) == []


def test_dump_config_shows_the_section() -> None:
    assert dump_config(config_from_dict({}))["batch_jobs"] == {
        "enabled": False,
        "max_jobs": 20,
        "reserve_margin_blocks": 2,
        "reserve_max_blocks": 8,
        "low_available_tokens_threshold": 4096,
        "short_decode_token_threshold": 32,
        "block_size_tokens": 16,
        "max_wait_seconds": 30.0,
        "guaranteed_kv_share": 0.25,
        "max_decode_slowdown": 1.0,
        "engine_queue_requests": 48,
    }


def test_toml_section_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text(
        "enable_program_scheduling = true\n"
        "[batch_jobs]\nenabled = true\nmax_jobs = 0\nreserve_max_blocks = 12\nmax_wait_seconds = 5\n"
    )
    b = load_config(path).batch_jobs
    assert (b.enabled, b.max_jobs, b.reserve_max_blocks, b.max_wait_seconds) == (True, 0, 12, 5.0)
    assert isinstance(b.max_wait_seconds, float)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("max_jobs", -1, "must be an integer >= 0"),
        ("reserve_margin_blocks", -1, "must be an integer >= 0"),
        ("reserve_max_blocks", 0, "must be an integer > 0"),
        ("low_available_tokens_threshold", 0, "must be an integer > 0"),
        ("short_decode_token_threshold", -3, "must be an integer > 0"),
        ("block_size_tokens", 0, "must be an integer > 0"),
        ("max_wait_seconds", 0.0, "must be finite and > 0"),
        ("max_wait_seconds", float("inf"), "must be finite and > 0"),
        ("engine_queue_requests", -1, "must be an integer >= 0"),
    ],
)
def test_each_rule_names_field_rule_and_value(field: str, value: Any, rule: str) -> None:
    assert errors_of({"batch_jobs": {field: value}}) == [f"batch_jobs.{field}: {rule} (got {value!r})"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("enabled", "yes", "must be true or false (got 'yes')"),
        ("max_jobs", 1.5, "must be an integer (got 1.5)"),
        ("max_jobs", "20", "must be an integer (got '20')"),
        ("reserve_max_blocks", True, "must be an integer (got True)"),
        ("max_wait_seconds", "30", "must be a number (got '30')"),
        ("engine_queue_requests", 4.0, "must be an integer (got 4.0)"),
    ],
)
def test_wrong_types_are_not_coerced(field: str, value: Any, message: str) -> None:
    assert errors_of({"batch_jobs": {field: value}}) == [f"batch_jobs.{field}: {message}"]


def test_unknown_keys_and_a_non_table_are_errors() -> None:
    assert errors_of({"batch_jobs": {"max_job": 3}}) == [
        "batch_jobs.max_job: unknown key (not a configuration field; did you mean max_jobs?)"
    ]
    assert errors_of({"batch_jobs": 5}) == ["batch_jobs: must be a table/object (got 5)"]


def test_every_problem_is_reported_at_once() -> None:
    lines = errors_of({"batch_jobs": {"max_jobs": -1, "reserve_max_blocks": 0, "x": 1}})
    assert lines == [
        "batch_jobs.x: unknown key (not a configuration field)",
        "batch_jobs.max_jobs: must be an integer >= 0 (got -1)",
        "batch_jobs.reserve_max_blocks: must be an integer > 0 (got 0)",
    ]


def test_enabled_requires_program_scheduling() -> None:
    assert errors_of({"batch_jobs": {"enabled": True}}) == [
        f"batch_jobs.enabled: {ENABLES} (batch jobs share the Program scheduler's ledger) "
        "(got enable_program_scheduling=False)"
    ]
    cfg = config_from_dict({"enable_program_scheduling": True, "batch_jobs": {"enabled": True}})
    assert cfg.batch_jobs.enabled and cfg.program_scheduling is not None
    # disabled batch jobs need nothing
    assert config_from_dict({"batch_jobs": {"enabled": False, "max_jobs": 3}}).batch_jobs.max_jobs == 3


def test_seed_json_shape_maps_onto_batch_jobs(tmp_path: Path) -> None:
    seed = {"enabled": True, "max_jobs": 10, "reserve_margin_blocks": 4, "reserve_max_blocks": 12}
    seed |= {"low_available_tokens_threshold": 2048, "short_decode_token_threshold": 32}
    path = tmp_path / "seed.json"
    doc = {"enable_program_scheduling": True, "scheduler_config": {"batch_job_sched_config": seed}}
    path.write_text(json.dumps(doc))
    b = load_config(path).batch_jobs
    assert b == BatchJobsConfig(**seed)
    assert "scheduler_config" not in dump_config(load_config(path))


def test_seed_shape_in_toml(tmp_path: Path) -> None:
    path = tmp_path / "seed.toml"
    path.write_text("[scheduler_config.batch_job_sched_config]\nmax_jobs = 7\n")
    assert load_config(path).batch_jobs.max_jobs == 7


def test_seed_shape_errors_name_the_path_used() -> None:
    raw = {"scheduler_config": {"batch_job_sched_config": {"max_jobs": -1, "enabled": 1, "bar": 2}, "x": 1}}
    assert errors_of(raw) == [
        "scheduler_config.x: unknown key (only batch_job_sched_config is read)",
        f"{SEED}.bar: unknown key (not a configuration field)",
        f"{SEED}.enabled: must be true or false (got 1)",
        f"{SEED}.max_jobs: must be an integer >= 0 (got -1)",
    ]
    assert errors_of({"scheduler_config": [1]}) == ["scheduler_config: must be a table/object (got [1])"]
    assert errors_of({"scheduler_config": {"batch_job_sched_config": "on"}}) == [
        f"{SEED}: must be a table/object (got 'on')"
    ]
    enabled_alone = errors_of({"scheduler_config": {"batch_job_sched_config": {"enabled": True}}})
    assert len(enabled_alone) == 1 and enabled_alone[0].startswith(f"{SEED}.enabled: {ENABLES}")


def test_both_shapes_conflict() -> None:
    raw = {"batch_jobs": {"max_jobs": 3}, "scheduler_config": {"batch_job_sched_config": {"max_jobs": 4}}}
    assert errors_of(raw) == [f"batch_jobs: given twice, as batch_jobs and as {SEED}; give only one of them"]


def test_empty_scheduler_config_is_accepted() -> None:
    assert config_from_dict({"scheduler_config": {}}).batch_jobs == BatchJobsConfig()


def test_check_config_shows_the_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.toml"
    path.write_text("[batch_jobs]\nmax_jobs = 5\n")
    assert main(["check-config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["batch_jobs"]["max_jobs"] == 5


def test_check_config_exits_2_naming_the_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[batch_jobs]\nenabled = true\nreserve_max_blocks = 0\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"agentd: invalid configuration ({path}):"
    assert [line.strip() for line in err[1:]] == [
        "batch_jobs.reserve_max_blocks: must be an integer > 0 (got 0)",
        f"batch_jobs.enabled: {ENABLES} (batch jobs share the Program scheduler's ledger) "
        "(got enable_program_scheduling=False)",
    ]
