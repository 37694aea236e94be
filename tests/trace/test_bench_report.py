"""report.md rendering, ratios and the optional plots."""

from __future__ import annotations

import os
import sys

import pytest

from bench.markdown import render_report
from bench.plots import write_plots


def _report(jct: float, hit: float, preempt: float, rps: float, router_p90: float | None = None) -> dict:
    rep = {
        "tasks": {"completed": 10},
        "requests": {"failed": 0},
        "jct_seconds": {"mean": jct, "p50": jct, "p90": jct * 1.5, "p99": jct * 2},
        "throughput": {"requests_per_second": rps, "output_tokens_per_second": rps * 100},
        "cache": {"token_hit_ratio": hit},
        "preemptions": preempt,
        "queue_wait_seconds": {"router": None, "backend": {"count": 4, "cdf": [[0.5, 0.5], [1.0, 1.0]], "p90": 0.9}},
        "samples": {"jct_seconds": [jct * 0.5, jct, jct * 1.5]},
        "scheduling": {"cross_rank_migrations": 0, "force_resumes": 0, "segment_yields": 0},
    }
    if router_p90 is not None:
        rep["queue_wait_seconds"]["router"] = {
            "count": 2,
            "p50": 0.1,
            "p90": router_p90,
            "cdf": [[0.1, 0.5], [1.0, 1.0]],
        }
    return rep


REPORTS = {
    "native": _report(100.0, 0.6, 70, 2.0),
    "agentd": _report(70.0, 0.72, 3, 3.0, 0.4),
    "vllm-router-ps": _report(80.0, 0.70, 4, 2.5, 0.6),
}


def test_report_md_side_by_side_and_ratios() -> None:
    text = render_report(REPORTS, title="t", context=["- ctx"])
    lines = text.splitlines()
    assert "| metric | native | agentd | vllm-router-ps |" in lines
    assert "| JCT mean (s) | 100.00 | 70.00 | 80.00 |" in lines
    assert "| token cache hit | 0.600 | 0.720 | 0.700 |" in lines
    assert "| preemptions | 70 | 3 | 4 |" in lines
    assert "| router queue wait p90 (s) | - | 0.400 | 0.600 |" in lines
    native = lines.index("### Against `native`")
    ps = lines.index("### Against `vllm-router-ps`")
    assert "| JCT mean (s) ratio | 0.700 | 0.800 |" in lines[native:ps]
    assert "| token cache hit difference | +0.120 | +0.100 |" in lines[native:ps]
    assert "| JCT mean (s) ratio | 1.250 | 0.875 |" in lines[ps:]
    assert "| requests/s ratio | 0.800 | 1.200 |" in lines[ps:]


def test_plots_written_when_matplotlib_is_available(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    names = write_plots(REPORTS, str(tmp_path))
    assert names == ["jct_cdf.png", "queue_wait_cdf.png", "cache_hit.png"]
    for name in names:
        with open(os.path.join(tmp_path, name), "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_skipped_without_matplotlib(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert write_plots(REPORTS, str(tmp_path)) == []
    assert os.listdir(tmp_path) == []


def test_queue_wait_from_a_histogram_delta_in_trace_seconds() -> None:
    from bench.report import parse_metrics, queue_wait_summary

    name = "vllm_router_agent_aware_queue_wait_seconds"
    before = parse_metrics(
        f'# TYPE {name} histogram\n{name}_bucket{{target="a",le="0.1"}} 1\n{name}_bucket{{target="a",le="1.0"}} 1\n'
        f'{name}_bucket{{target="a",le="+Inf"}} 1\n{name}_sum{{target="a"}} 0.05\n{name}_count{{target="a"}} 1\n'
    )
    after = parse_metrics(
        f'# TYPE {name} histogram\n{name}_bucket{{target="a",le="0.1"}} 3\n{name}_bucket{{target="a",le="1.0"}} 5\n'
        f'{name}_bucket{{target="a",le="+Inf"}} 5\n{name}_sum{{target="a"}} 1.25\n{name}_count{{target="a"}} 5\n'
    )
    out = queue_wait_summary([before], [after], name, scale=2.0)
    assert out["kind"] == "histogram" and out["count"] == 4
    assert out["mean"] == 2.0 * 1.2 / 4
    assert out["cdf"] == [[0.2, 0.5], [2.0, 1.0]]
    # p90: rank 3.6 of 4 lies in (0.1, 1.0] holding ranks 2..4 -> 0.1 + 0.9 * 1.6 / 2, in trace seconds
    assert out["p90"] == 2.0 * (0.1 + 0.9 * 1.6 / 2)


def test_queue_wait_from_the_reference_routers_summary() -> None:
    from bench.report import parse_metrics, queue_wait_summary

    name = "vllm_router_agent_aware_queue_wait_seconds"
    text = f"# TYPE {name} summary\n"
    for target, count, p50, p90 in (("a", 3, 0.1, 0.4), ("b", 1, 0.5, 0.8)):
        text += (
            f'{name}{{target="{target}",quantile="0.5"}} {p50}\n{name}{{target="{target}",quantile="0.9"}} {p90}\n'
            f'{name}_sum{{target="{target}"}} {count * p50}\n{name}_count{{target="{target}"}} {count}\n'
        )
    out = queue_wait_summary([None], [parse_metrics(text)], name, scale=1.0)
    assert out["kind"] == "summary" and out["count"] == 4
    assert out["p50"] == (3 * 0.1 + 1 * 0.5) / 4
    assert out["p90"] == (3 * 0.4 + 1 * 0.8) / 4
    assert out["p99"] is None


def test_parse_metrics_reads_samples_and_names_a_bad_line() -> None:
    from bench.report import parse_metrics

    snap = parse_metrics('# TYPE a counter\na_total{engine="0",m="x\\"y"} 12\nb NaN\nc_bucket{le="+Inf"} 3 1700\n')
    assert snap["a_total"] == {(("engine", "0"), ("m", 'x"y')): 12.0}
    assert snap["c_bucket"] == {(("le", "+Inf"),): 3.0}
    with pytest.raises(ValueError, match="metrics line 2: bad value 'twelve'"):
        parse_metrics("a 1\nb twelve\n")


def test_time_split_of_the_root_program_and_its_recomputed_tokens() -> None:
    from bench.replay import ReplayResult, RequestResult, TaskResult
    from bench.report import time_split

    reqs = (
        RequestResult("a", 0, 0.0, 2.0, 0.5, True, 200, None, 100, 0, 10),
        # the previous prompt + output held 110 tokens; 40 were cached: 70 recomputed
        RequestResult("a", 1, 3.0, 4.0, 3.25, True, 200, None, 150, 40, 10),
        RequestResult("a.sub0", 0, 2.1, 2.9, 2.2, True, 200, None, 50, 0, 5),  # a subagent: not counted
    )
    result = ReplayResult(0.0, 4.0, reqs, (TaskResult("a", 0.0, 4.0, True, 3),), 3, 1)
    split = time_split(result, 2.0)  # time scale 2: trace seconds are twice the run's
    assert split == {
        "programs": 1,
        "first_token": (0.5 + 0.25) * 2,
        "decode": (1.5 + 0.75) * 2,
        "between_turns": (4.0 - 0.75 - 2.25) * 2,
        "recomputed_prompt_tokens": 70,
    }
    assert time_split(ReplayResult(0.0, 1.0, (), (), 0, 0), 1.0) is None


def test_server_time_split_per_task_from_agentd_counters_and_its_report_rows() -> None:
    from bench.report import parse_metrics, server_time_split

    def text(queue: float, decode: float, acting: float, cached: float) -> str:
        return (
            "# TYPE agentd_program_time_seconds counter\n"
            f'agentd_program_time_seconds_total{{part="queue"}} {queue}\n'
            f'agentd_program_time_seconds_total{{part="decode"}} {decode}\n'
            f'agentd_program_time_seconds_total{{part="prefill"}} 0\n'
            "# TYPE agentd_program_recomputed_tokens counter\n"
            f'agentd_program_recomputed_tokens_total{{cause="acting_ttl"}} {acting}\n'
            'agentd_program_recomputed_tokens_total{cause="migration"} 0\n'
            "# TYPE agentd_program_prompt_tokens counter\n"
            f'agentd_program_prompt_tokens_total{{kind="cached"}} {cached}\n'
        )

    before, after = parse_metrics(text(1.0, 2.0, 100, 50)), parse_metrics(text(5.0, 10.0, 900, 450))
    out = server_time_split([before], [after], tasks=4, scale=2.0)
    assert out is not None and out["tasks"] == 4
    # (5 - 1) s of queue over 4 tasks, in trace seconds at time scale 2
    assert out["seconds_per_task"] == {
        "queue": 2.0,
        "prefill": 0.0,
        "recompute": 0.0,
        "decode": 4.0,
        "between_turns": 0.0,
    }
    assert out["recomputed_tokens_per_task"] == {"acting_ttl": 200.0, "migration": 0.0}
    assert out["prompt_tokens_per_task"] == {"cached": 100.0}
    assert server_time_split([None], [parse_metrics("x 1\n")], tasks=4, scale=1.0) is None  # not agentd
    assert server_time_split([before], [after], tasks=0, scale=1.0) is None
    reports = {name: dict(rep) for name, rep in REPORTS.items()}
    reports["agentd"]["server_time_split"] = out
    lines = render_report(reports, title="t").splitlines()
    assert "| server: decode per task (s) | - | 4.0 | - |" in lines
    assert "| server: recomputed tokens per task, acting_ttl | - | 200 | - |" in lines


def test_time_split_plot_has_the_client_and_the_server_view(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    reports = {name: dict(rep) for name, rep in REPORTS.items()}
    for rep in reports.values():
        rep["time_split_seconds"] = {"first_token": 5.0, "decode": 40.0, "between_turns": 20.0}
    parts = {"queue": 1.0, "prefill": 2.0, "recompute": 3.0, "decode": 40.0, "between_turns": 20.0}
    reports["agentd"]["server_time_split"] = {"seconds_per_task": parts}
    names = write_plots(reports, str(tmp_path))
    assert names[-1] == "time_split.png"
    with open(os.path.join(tmp_path, "time_split.png"), "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_command_names_a_bad_report_argument(tmp_path, capsys) -> None:
    from bench.plots import main

    assert main(["--out", str(tmp_path), "agentd.json"]) == 2
    assert "expected SYSTEM=REPORT.json, got 'agentd.json'" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), f"agentd={tmp_path / 'missing.json'}"]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[]")
    assert main(["--out", str(tmp_path), f"agentd={tmp_path / 'list.json'}"]) == 2
    assert "is not a JSON report object" in capsys.readouterr().err
