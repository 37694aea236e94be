"""Configuration: golden error files, defaults, aliases, CLI flags and the calibration warning."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from actors.core.config import COEFFICIENT_FIELDS, ProgramSchedulingConfig
from daemon.cli import main
from daemon.config import AgentdConfig
from daemon.config_loading import (
    ConfigError,
    add_router_flags,
    config_from_dict,
    config_warnings,
    dump_config,
    load_config,
    overrides_from_args,
)

ROOT = Path(__file__).resolve().parents[2]
INVALID = sorted((ROOT / "configs" / "invalid").glob("*.toml"))
VALID = sorted((ROOT / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_config_invalid_golden(path: Path) -> None:
    expected = path.with_suffix(".expected").read_text().splitlines()
    with pytest.raises(ConfigError) as info:
        load_config(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    assert info.value.lines == expected


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_config_check_config_cli_exits_2_with_the_lines(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["check-config", str(path.relative_to(ROOT))]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("agentd: invalid configuration")
    assert [line.strip() for line in err[1:]] == path.with_suffix(".expected").read_text().splitlines()


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_config_shipped_examples_are_valid(path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = path.read_text()
    if "/etc/agentd/api-keys" in text:  # check-config reads the key file (as start does): give it one
        keys = tmp_path / "api-keys"
        keys.write_text("team-a:" + "0" * 64 + "\n")
        copy = tmp_path / path.name
        copy.write_text(text.replace("/etc/agentd/api-keys", str(keys)))
        if not Path("/etc/agentd/api-keys").exists():
            assert main(["check-config", str(path)]) == 2
            assert "auth.api_keys_file: cannot read" in capsys.readouterr().err
        path = copy
    assert main(["check-config", str(path)]) == 0
    effective = json.loads(capsys.readouterr().out)
    assert effective["server"]["port"] == load_config(path).server.port


def test_config_defaults_match_the_seed_contract() -> None:
    ps = ProgramSchedulingConfig()
    assert ps.program_scheduling_enable_key == "vllm_xargs.agentic_context"
    assert (ps.binding_only, ps.global_queue, ps.resume_order) == (False, False, "mru")
    assert ps.cross_rank_headroom_ratio == 1.2 and ps.hash_virtual_nodes == 160
    assert ps.token_capacity_per_dp_rank is None and ps.max_active_programs_per_target == 64
    assert (ps.metrics_interval_seconds, ps.admission_waiting_request_threshold) == (1.0, 1)
    assert (ps.queue_timeout_seconds, ps.force_resume_timeout_seconds, ps.paused_retention_ttl_seconds) == (
        600.0,
        300.0,
        1800.0,
    )
    assert (ps.shared_prefix_freshness_warmup_seconds, ps.shared_prefix_freshness_kv_turnovers) == (100.0, 2.0)
    assert (ps.decode_buffer_tokens, ps.max_acting_ttl_seconds) == (100, 10.0)
    assert (ps.high_watermark_ratio, ps.low_watermark_ratio) == (1.0, 1.0)
    assert (ps.max_segment_rounds, ps.stats_window_size, ps.enable_batch_gain_admission) == (14, 100, True)
    assert ps.prefill_cost_model.intercept_seconds == 0.06600061907132926
    assert ps.decode_throughput_model.context_step_seconds_per_token == 1.420458414996201e-7


def test_config_enable_flag_alone_gives_all_defaults() -> None:
    cfg = load_config(None, {"enable_program_scheduling": True})
    assert cfg.program_scheduling == ProgramSchedulingConfig()
    assert load_config(None).program_scheduling is None


def test_config_deprecated_alias_is_accepted_warned_and_never_emitted() -> None:
    cfg = config_from_dict(
        {"enable_program_scheduling": True, "program_scheduling": {"token_capacity_per_target": 5000}}
    )
    assert cfg.program_scheduling is not None and cfg.program_scheduling.token_capacity_per_dp_rank == 5000
    assert [w.event for w in config_warnings(cfg)][0] == "deprecated_config_alias"
    dumped = dump_config(cfg)["program_scheduling"]
    assert dumped["token_capacity_per_dp_rank"] == 5000 and "token_capacity_per_target" not in dumped


def test_config_targets_are_worker_major_url_at_rank() -> None:
    cfg = config_from_dict(
        {"routing": {"worker_urls": ["http://a:1/", "http://b:2"], "intra_node_data_parallel_size": 2}}
    )
    assert [t.target_id for t in cfg.targets()] == ["http://a:1@0", "http://a:1@1", "http://b:2@0", "http://b:2@1"]
    assert [t.index for t in cfg.targets()] == [0, 1, 2, 3]
    assert not cfg.embedded_mode
    embedded = AgentdConfig()
    assert embedded.embedded_mode and [t.target_id for t in embedded.targets()] == [
        "http://embedded-sim@0",
        "http://embedded-sim@1",
    ]


def _router_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_router_flags(parser)
    return parser.parse_args(argv)


def test_config_router_flags_match_the_same_json_in_toml(tmp_path: Path) -> None:
    ps_json = (ROOT / "configs" / "program-scheduling.json").read_text()
    args = _router_args(
        [
            "--host",
            "0.0.0.0",
            "--port",
            "3001",
            "--worker-urls",
            "http://worker-0:8000",
            "http://worker-1:8000",
            "--intra-node-data-parallel-size",
            "2",
            "--policy",
            "consistent_hash",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            "29000",
            "--api-keys-file",
            "/etc/agentd/api-keys",
            "--admin-host",
            "127.0.0.1",
            "--admin-port",
            "3002",
            "--enable-program-scheduling",
            "--program-scheduling-config-json",
            json.dumps(json.loads(ps_json)),
        ]
    )
    from_flags = load_config(None, overrides_from_args(args))
    from_file = load_config(ROOT / "configs" / "production.toml")
    assert from_flags == from_file
    assert from_flags.program_scheduling is not None
    assert from_flags.program_scheduling.explicit_coefficients == frozenset(COEFFICIENT_FIELDS)


def test_config_json_without_enable_is_an_error() -> None:
    args = _router_args(["--program-scheduling-config-json", "{}"])
    with pytest.raises(ConfigError) as info:
        overrides_from_args(args)
    assert info.value.lines == [
        "program_scheduling_config_json: requires enable_program_scheduling (pass --enable-program-scheduling)"
    ]


def test_config_bad_json_names_the_option() -> None:
    with pytest.raises(ConfigError) as info:
        overrides_from_args(_router_args(["--enable-program-scheduling", "--program-scheduling-config-json", "{nope"]))
    assert info.value.lines[0].startswith("program_scheduling_config_json: is not valid JSON")


def test_config_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[server]\nport = 4000\nhost = "0.0.0.0"\n[routing]\npolicy = "random"\n')
    cfg = load_config(path, overrides_from_args(_router_args(["--port", "0", "--policy", "round_robin"])))
    assert (cfg.server.host, cfg.server.port, cfg.routing.policy) == ("0.0.0.0", 0, "round_robin")


def test_config_json_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"enable_program_scheduling": True, "program_scheduling": {"global_queue": True}}))
    cfg = load_config(path)
    assert cfg.program_scheduling is not None and cfg.program_scheduling.global_queue


def test_config_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml")
    assert info.value.lines[0].startswith("config: cannot read")


def _calibration(cfg: AgentdConfig) -> dict[str, object] | None:
    for w in config_warnings(cfg):
        if w.event == "program_scheduling_reference_calibration":
            return dict(w.fields)
    return None


def test_config_calibration_warning_lists_exactly_the_defaulted_fields() -> None:
    cfg = config_from_dict(
        {
            "routing": {"worker_urls": ["http://w:8000"]},
            "enable_program_scheduling": True,
            "program_scheduling": {
                "prefill_cost_model": {"intercept_seconds": 0.1, "decode_throughput_alpha": 0.2},
                "decode_throughput_model": {"fixed_step_seconds": 0.02},
            },
        }
    )
    fields = _calibration(cfg)
    assert fields is not None
    assert fields["defaulted_fields"] == ",".join(
        [
            "prefill_cost_model.linear_seconds_per_1k_tokens",
            "prefill_cost_model.quadratic_seconds_per_1k_tokens_squared",
            "decode_throughput_model.batch_step_seconds_per_request",
            "decode_throughput_model.context_step_seconds_per_token",
        ]
    )
    # Effective values: intercept 0.1 explicit -> 0.1 + 0.05702024*50 + 0.00440573*2500 = 13.9652 s;
    # fixed 0.02 explicit -> 4 / (0.02 + 0.00041928*4 + 1.4204584e-7*200000) = 4 / 0.0500863 = 79.86 tok/s.
    assert fields["reference_prefill_seconds"] == pytest.approx(13.9653, abs=1e-3)
    assert fields["reference_decode_throughput_tokens_per_second"] == pytest.approx(79.862, abs=0.01)


def test_config_calibration_warning_reference_figures_with_all_defaults() -> None:
    workers = {"routing": {"worker_urls": ["http://w:8000"]}}
    fields = _calibration(load_config(None, {"enable_program_scheduling": True, **workers}))
    assert fields is not None
    assert fields["defaulted_fields"] == ",".join(COEFFICIENT_FIELDS)
    # 0.066 + 0.05702*50 + 0.0044057*2500 = 13.931 s ; 4 / (0.010635 + 0.001677 + 0.028409) = 98.23 tok/s
    assert fields["reference_prefill_seconds"] == pytest.approx(13.93, rel=0.01)
    assert fields["reference_decode_throughput_tokens_per_second"] == pytest.approx(98.23, rel=0.01)


def test_config_calibration_warning_not_in_embedded_mode() -> None:
    """The embedded simulated ranks run the reference cost model: its defaults are their calibration."""
    assert _calibration(load_config(None, {"enable_program_scheduling": True})) is None


def test_config_calibration_warning_suppressed_when_all_seven_given_or_binding_only() -> None:
    all_seven = json.loads((ROOT / "configs" / "program-scheduling.json").read_text())
    assert _calibration(config_from_dict({"enable_program_scheduling": True, "program_scheduling": all_seven})) is None
    assert (
        _calibration(
            config_from_dict({"enable_program_scheduling": True, "program_scheduling": {"binding_only": True}})
        )
        is None
    )


def _field_paths(cls: type, prefix: str = "") -> list[str]:
    import attrs

    out: list[str] = []
    for a in attrs.fields(attrs.resolve_types(cls)):
        if a.name in ("explicit_coefficients", "deprecated_inputs"):
            continue
        t = a.type
        inner = t if isinstance(t, type) and attrs.has(t) else None
        if inner is None:
            args = [x for x in getattr(t, "__args__", ()) if x is not type(None)]
            inner = args[0] if len(args) == 1 and isinstance(args[0], type) and attrs.has(args[0]) else None
        if inner is not None and a.name not in ("server", "routing", "prometheus", "embedded", "program_scheduling"):
            out += _field_paths(inner, f"{prefix}{a.name}.")
        elif inner is not None:
            out += _field_paths(inner, "")
        else:
            out.append(prefix + a.name)
    return out


def test_config_every_field_is_documented() -> None:
    doc = (ROOT / "docs" / "config.md").read_text()
    missing = [p for p in _field_paths(AgentdConfig) if f"`{p}`" not in doc]
    assert missing == []


def test_config_warns_when_keepalive_expiry_is_not_below_the_workers_idle_timeout() -> None:
    def events(**routing: object) -> list[str]:
        cfg = config_from_dict({"routing": {"worker_urls": ["http://w0:8000"], **routing}})
        return [w.event for w in config_warnings(cfg)]

    assert "keepalive_expiry_not_below_worker_idle_timeout" not in events()  # 4 s by default
    assert "keepalive_expiry_not_below_worker_idle_timeout" in events(keepalive_expiry_seconds=5.0)
    assert events(keepalive_expiry_seconds=5.0, worker_urls=[]) == []  # embedded workers: no sockets


def test_config_data_plane_processes_is_validated_and_defaults_to_one_process(tmp_path: Path) -> None:
    assert AgentdConfig().server.data_plane_processes == 1
    path = tmp_path / "c.toml"
    path.write_text("[server]\ndata_plane_processes = 2\n")
    assert load_config(path).server.data_plane_processes == 2
    path.write_text("[server]\ndata_plane_processes = -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = info.value.lines
    assert any("server.data_plane_processes" in line and "within [0, 64]" in line for line in lines), lines


def test_config_relay_processes_in_embedded_mode_warn() -> None:
    cfg = config_from_dict({"server": {"data_plane_processes": 2}})
    [warning] = [w for w in config_warnings(cfg) if w.event == "data_plane_processes_embedded"]
    assert "no effect in embedded mode" in warning.message
    with_workers = config_from_dict({"server": {"data_plane_processes": 2}, "routing": {"worker_urls": ["http://w:1"]}})
    assert not [w for w in config_warnings(with_workers) if w.event == "data_plane_processes_embedded"]


@pytest.mark.parametrize("name", ["defaults", *[p.name for p in VALID]])
def test_check_config_output_loads_again_as_the_same_configuration(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    args = ["check-config"]
    if name != "defaults":
        text = (ROOT / "configs" / name).read_text()
        keys = tmp_path / "api-keys"
        keys.write_text("team-a:" + "0" * 64 + "\n")
        copy = tmp_path / name
        copy.write_text(text.replace("/etc/agentd/api-keys", str(keys)))
        args.append(str(copy))
    assert main(args) == 0
    first = capsys.readouterr().out
    effective = tmp_path / "effective.json"
    effective.write_text(first)
    # the printed settings are a configuration file of their own (the admin listener's host
    # without its port would not load: it is left out while the listener is off)
    assert main(["check-config", str(effective)]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out) == json.loads(first)
