"""The reference router's launch command carried over to ``agentd start`` (docs/operations.md §13.10).

The session-28 walk ran vllm-router 0.1.17 and agentd with the same flags in front of one recording
worker.  The reference's behaviour is encoded here as expectations (the binary is not installed in
CI): its ``--help`` lists the 71 flags of :data:`REFERENCE_FLAGS`; its ``--api-key`` is the key it
sends to the workers; its Prometheus listener binds 127.0.0.1 unless ``--prometheus-host`` says
otherwise; it answers the Kubernetes probes ``/liveness`` and ``/readiness``.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from native_fakes import read_line, reap, stop_process

from daemon import cli
from daemon.config_loading import load_config_from_args
from daemon.reference_flags import MAPPED, UNSUPPORTED

ROOT = Path(__file__).resolve().parents[2]

# Every flag of `vllm-router --help` (0.1.17), but --help.
REFERENCE_FLAGS = (  # noqa: SIM905 (the list as the help prints it)
    "--api-key --balance-abs-threshold --balance-rel-threshold --cache-threshold --cb-failure-threshold "
    "--cb-success-threshold --cb-timeout-duration-secs --cb-window-duration-secs --cors-allowed-origins --decode "
    "--decode-policy --decode-selector --disable-circuit-breaker --disable-retries --enable-igw "
    "--enable-program-scheduling --eviction-interval-secs --health-check-endpoint --health-check-interval-secs "
    "--health-check-timeout-secs --health-failure-threshold --health-success-threshold --host "
    "--intra-node-data-parallel-size --kv-aware-session-affinity-ttl-secs --kv-connector --kv-event-block-size "
    "--kv-event-model --kv-event-replay-source --kv-event-source --kv-penalty-disk --kv-penalty-external "
    "--kv-penalty-host --log-dir --log-level --max-concurrent-requests --max-payload-size --max-tree-size --mini-lb "
    "--pd-kv-events --policy --port --prefill --prefill-policy --prefill-selector --program-scheduling-config-json "
    "--prometheus-host --prometheus-port --queue-size --queue-timeout-secs --rate-limit-tokens-per-second "
    "--request-id-headers --request-timeout-secs --retry-backoff-multiplier --retry-initial-backoff-ms "
    "--retry-jitter-factor --retry-max-backoff-ms --retry-max-retries --router-temperature --selector "
    "--service-discovery --service-discovery-namespace --service-discovery-port --vllm-discovery-address "
    "--vllm-pd-disaggregation --wasm-middleware --wasm-middleware-route --wasm-middleware-sha256 "
    "--worker-startup-check-interval --worker-startup-timeout-secs --worker-urls"
).split()

# The flags whose agentd field has the reference's meaning, besides the ones of the seed's launch.
SAME_MEANING = {
    "--api-key": ("worker_auth", "api_key", "sk-w", "***"),
    "--request-timeout-secs": ("routing", "request_timeout_seconds", "1800", 1800.0),
    "--health-check-interval-secs": ("routing", "health_check_interval_seconds", "60", 60.0),
    "--health-check-timeout-secs": ("routing", "health_check_timeout_seconds", "5", 5.0),
    "--health-failure-threshold": ("routing", "health_failures_to_eject", "4", 4),
    "--health-success-threshold": ("routing", "health_successes_to_restore", "3", 3),
    "--max-payload-size": ("server", "max_body_bytes", "536870912", 536870912),
    "--max-concurrent-requests": ("limits", "max_in_flight_requests", "32768", 32768),
    "--queue-size": ("limits", "max_queued_requests", "100", 100),
    "--queue-timeout-secs": ("limits", "queue_timeout_seconds", "60", 60.0),
    "--log-level": ("server", "log_level", "critical", "critical"),
}


def _known_flags(command: str) -> set[str]:
    parser = cli.build_parser(command)
    [sub] = [a for a in parser._actions if a.dest == "command"]
    return {option for action in sub.choices[command]._actions for option in action.option_strings}


def _check_config(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(["check-config", "--worker-urls", "http://worker-0:8000", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("command", ["start", "check-config"])
def test_every_flag_of_the_reference_help_is_known(command: str) -> None:
    """Each flag is either mapped, refused naming itself, or ignored with a warning; none is left to
    argparse's bare "unrecognized arguments" (all 55 below were, before session 28)."""
    assert len(REFERENCE_FLAGS) == 71
    assert [f for f in REFERENCE_FLAGS if f not in _known_flags(command)] == []
    verdicts = {m.flag for m in MAPPED} | {u.flag for u in UNSUPPORTED}
    assert verdicts <= set(REFERENCE_FLAGS) and len(verdicts) == len(MAPPED) + len(UNSUPPORTED)


def test_the_reference_api_key_is_the_workers_key_and_is_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """``--api-key`` was taken as an abbreviation of agentd's ``--api-keys-file``: exit 2 with
    ``auth.api_keys_file: cannot read 'sk-…'``, the workers' key printed in the error."""
    code, out, err = _check_config(["--api-key", "sk-walk-secret"], capsys)
    assert code == 0, err
    assert json.loads(out)["worker_auth"]["api_key"] == "***"
    assert "sk-walk-secret" not in out + err


def test_a_prefix_of_a_flag_is_not_that_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _check_config(["--api-keys", "/etc/agentd/api-keys"], capsys)
    assert code == 2
    assert "unrecognized arguments: --api-keys" in err


@pytest.mark.parametrize(("flag", "given"), [(f, v) for f, (_, _, v, _) in SAME_MEANING.items()])
def test_a_flag_with_the_reference_meaning_sets_its_field(
    flag: str, given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    section, key, _, expected = SAME_MEANING[flag]
    code, out, err = _check_config([flag, given], capsys)
    assert code == 0, err
    assert json.loads(out)[section][key] == expected
    assert "reference_flag_ignored" not in err


def test_a_short_request_timeout_bounds_the_whole_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reference's ``--request-timeout-secs`` is one bound: 30 lowers agentd's first-byte and
    stream-idle timeouts (60 s by default) instead of failing their ``<= request_timeout_seconds``
    rule; a value the file sets is kept (and checked)."""
    code, out, err = _check_config(["--request-timeout-secs", "30"], capsys)
    assert code == 0, err
    routing = json.loads(out)["routing"]
    assert (routing["request_timeout_seconds"], routing["first_byte_timeout_seconds"]) == (30.0, 30.0)
    assert routing["stream_idle_timeout_seconds"] == 30.0
    config = tmp_path / "agentd.toml"
    config.write_text("[routing]\nfirst_byte_timeout_seconds = 20.0\n")
    code, out, err = _check_config(["--config", str(config), "--request-timeout-secs", "30"], capsys)
    assert code == 0, err
    assert json.loads(out)["routing"]["first_byte_timeout_seconds"] == 20.0


def test_the_health_check_endpoint_is_only_agentds(capsys: pytest.CaptureFixture[str]) -> None:
    assert _check_config(["--health-check-endpoint", "/health"], capsys)[0] == 0
    code, _, err = _check_config(["--health-check-endpoint", "/ready"], capsys)
    assert code == 2
    assert "  --health-check-endpoint: agentd checks GET /health on each worker; another path is not supported" in err


def test_refused_flags_exit_2_with_one_line_each_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--mini-lb", "--log-dir", "/var/log/router", "--cors-allowed-origins", "http://ui:3000"]
    argv += ["--policy", "kv_aware"]
    code, out, err = _check_config(argv, capsys)
    assert (code, out) == (2, "")
    lines = err.splitlines()[-4:]
    flags = [line.split(":")[0].strip() for line in lines]
    assert flags == ["--policy", "--mini-lb", "--log-dir", "--cors-allowed-origins"]
    assert lines[0].startswith("  --policy: the reference router's kv_aware policy has no agentd equivalent")
    assert lines[2].startswith("  --log-dir: not supported by agentd: agentd writes no log files")
    assert all(line.endswith("(docs/operations.md §13.10)") for line in lines[1:])


@pytest.mark.parametrize("flag", [u.flag for u in UNSUPPORTED if u.refused])
def test_every_refused_flag_is_a_configuration_error(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    [unsupported] = [u for u in UNSUPPORTED if u.flag == flag]
    argv = [flag] if unsupported.nargs is None else [flag, "x"]
    code, _, err = _check_config(argv, capsys)
    assert code == 2
    assert err.splitlines()[-1].startswith(f"  {flag}: not supported by agentd: ")


def test_a_configuration_error_names_the_flag_that_set_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--port", "99999", "--enable-program-scheduling", "--program-scheduling-config-json", '{"global_queu": 1}']
    code, _, err = _check_config(argv, capsys)
    assert code == 2
    assert "  server.port (--port): must be a port number within [0, 65535] (got 99999)" in err
    assert "  program_scheduling.global_queu (--program-scheduling-config-json): unknown key" in err


def test_the_metrics_listener_binds_loopback_unless_its_host_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """The reference's ``--prometheus-host`` defaults to 127.0.0.1; agentd bound ``--host`` (0.0.0.0
    in the seed's launch without the flag: /metrics on every interface)."""
    code, out, err = _check_config(["--host", "0.0.0.0", "--prometheus-port", "29000"], capsys)
    assert code == 0, err
    cfg = load_config_from_args(None, cli.build_parser("start").parse_args(["start", "--prometheus-port", "29000"]))
    assert cfg.prometheus.bind_host == "127.0.0.1"
    given = ["start", "--host", "0.0.0.0", "--prometheus-host", "10.0.0.5", "--prometheus-port", "29000"]
    assert load_config_from_args(None, cli.build_parser("start").parse_args(given)).prometheus.bind_host == "10.0.0.5"


def _api_keys(tmp_path: Path) -> Path:
    path = tmp_path / "api-keys"
    path.write_text(f"team-a:{hashlib.sha256(b'client-key').hexdigest()}\n")
    return path


async def test_agentd_start_with_reference_flags_warns_binds_metrics_to_loopback_and_answers_the_probes(
    tmp_path: Path,
) -> None:
    """``agentd start`` with the reference's flags (embedded workers, so no worker is needed):
    each ignored flag is one ``reference_flag_ignored`` warning naming it; ``--prometheus-port``
    without ``--prometheus-host`` listens on 127.0.0.1 as the reference's (it was the public
    ``--host``); ``/liveness`` and ``/readiness`` answer without a key, on the public and the admin
    listener (they were 404, and a 401 with keys)."""
    config = tmp_path / "agentd.toml"
    config.write_text("[embedded]\ndp_size = 2\ntime_scale = 100.0\n")
    cmd = [
        sys.executable,
        "-m",
        "daemon",
        "start",
        "--config",
        str(config),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--prometheus-port",
        "0",
        "--api-keys-file",
        str(_api_keys(tmp_path)),
        "--admin-port",
        "0",
        "--log-format",
        "json",
        "--disable-retries",
        "--worker-startup-timeout-secs",
        "600",
        "--cache-threshold",
        "0.3",
    ]
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        with trio.fail_after(180):
            banner = json.loads(await read_line(proc.stdout))
        assert banner["event"] == "daemon_listening"
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", banner["metrics_url"]), banner
        public = banner["url"].replace("0.0.0.0", "127.0.0.1")
        with trio.fail_after(180):
            events = []
            while not any(e.get("event") == "daemon_listening" for e in events):
                events.append(json.loads(await read_line(proc.stderr)))
        admin = next(e for e in events if e.get("event") == "daemon_listening")["admin_url"]
        ignored = [e["flag"] for e in events if e.get("event") == "reference_flag_ignored"]
        assert ignored == ["--worker-startup-timeout-secs", "--cache-threshold", "--disable-retries"]
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(f"{public}/v1/models")).status_code == 401  # keys are on
            for base in (public, admin):
                live = await client.get(f"{base}/liveness")
                assert (live.status_code, live.text) == (200, "OK")
                ready = await client.get(f"{base}/readiness")
                assert ready.status_code == 200
                assert ready.json() == {"status": "ready", "healthy_workers": 1, "total_workers": 1}
        assert await stop_process(proc) == 0
    finally:
        await reap(proc)
