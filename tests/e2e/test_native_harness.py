"""``bench.proxy_overhead --harness native``: wrk as the load generator, nginx as the fake worker.

The harness exists so that the benchmark's own processes leave the cores to the proxy
(docs/benchmarks.md §10.14).  These tests check that its nginx answers byte for byte what the
Python fake worker answers, that a run measures every cell with wrk (counts, latency, where each
connection went) and that a machine without the tools gets exit 2 naming the option.  The runs
need wrk and nginx (``./scripts/test.sh`` installs wrk as root and fetches nginx's binary into
``.venv/bin``); without them those tests are skipped and say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bench import wrk
from bench.harness import free_port, wait_listening
from bench.proxy_overhead import MODELS, REPLY, WORKER_METRICS

ROOT = Path(__file__).resolve().parents[2]
needs_tools = pytest.mark.skipif(
    wrk.tools() is None, reason=f"wrk and nginx are not on PATH ({wrk.INSTALL_HINT}, or ./scripts/test.sh)"
)


def test_the_scripts_closing_line_is_read_and_a_missing_one_stops_the_bench() -> None:
    out = "Running 1s test @ http://x\n  2 threads\nAGENTD-WRK 1234 1000512 0 1 0 2 0 812.250 790 2210\n"
    assert wrk.parse_done(out) == {
        "requests": 1234,
        "duration_s": 1.000512,
        "errors": {"connect": 0, "read": 1, "write": 0, "status": 2, "timeout": 0},
        "mean_us": 812.25,
        "p50_us": 790,
        "p99_us": 2210,
    }
    with pytest.raises(SystemExit, match="wrk printed no summary line"):
        wrk.parse_done("Running 1s test\n")


@needs_tools
def test_nginx_answers_what_the_python_worker_answers(tmp_path: Path) -> None:
    tools = wrk.tools()
    assert tools is not None
    port = free_port()
    proc = wrk.start_worker(tools[1], port, tmp_path / "nginx", REPLY, MODELS, WORKER_METRICS)
    try:
        wait_listening(port, proc, "nginx")
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/metrics") as r:
            assert (r.read(), r.headers["content-type"]) == (WORKER_METRICS, "text/plain; version=0.0.4")
        with urllib.request.urlopen(base + "/v1/models") as r:
            assert (r.read(), r.headers["content-type"]) == (MODELS, "application/json")
        body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "' + b"x" * 300_000 + b'"}]}'
        post = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST")
        with urllib.request.urlopen(post) as r:
            assert (r.status, r.read()) == (200, REPLY)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@needs_tools
def test_a_native_run_measures_every_cell_with_wrk(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    argv = ["--harness", "native", "--seconds", "1", "--concurrency", "3", "--bodies", "1"]
    argv += ["--identity", "free,program", "--processes", "1", "--no-router", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.proxy_overhead", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "harness native" in done.stdout
    run = json.loads(out.read_text())
    assert run["harness"] == "native"
    for mode in ("free", "program"):
        cells = run["results"][mode]["1"]
        assert set(cells) == {"direct", "agentd"}
        for cell in cells.values():
            assert cell["c1_requests"] > 0 and 0 < cell["c1_p50_ms"] <= cell["c1_p99_ms"]
            assert cell["c3_rps"] > 0 and cell["cpu_us_per_request"] > 0
            # every one of wrk's three connections found, each held by the process that serves it
            assert sum(p["connections"] for p in cell["c3_processes"]) == 3
            assert cell["c3_unattributed_connections"] == 0
            assert cell["c3_loadgen_cpu_share"] > 0
        assert cells["agentd"]["added_p50_ms"] == pytest.approx(
            cells["agentd"]["c1_p50_ms"] - cells["direct"]["c1_p50_ms"]
        )


def test_without_wrk_and_nginx_the_native_harness_exits_2_naming_the_option(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))  # neither tool on it (nginx is also looked for in /usr/sbin)
    done = subprocess.run(
        [sys.executable, "-m", "bench.proxy_overhead", "--harness", "native", "--no-router"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"--harness native: needs wrk and nginx on PATH ({wrk.INSTALL_HINT})"
