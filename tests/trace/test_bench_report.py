"""report.md rendering, ratios and the optional plots."""

from __future__ import annotations

import os
import sys

import pytest

from daemon.benchkit.markdown import render_report
from daemon.benchkit.plots import write_plots


def _report(jct: float, hit: float, preempt: float, rps: float, router_p90: float | None = None) -> dict:
    rep = {
        "tasks": {"completed": 10}, "requests": {"failed": 0},
        "jct_seconds": {"mean": jct, "p50": jct, "p90": jct * 1.5, "p99": jct * 2},
        "throughput": {"requests_per_second": rps, "output_tokens_per_second": rps * 100},
        "cache": {"token_hit_ratio": hit}, "preemptions": preempt,
        "queue_wait_seconds": {"router": None, "backend": {"count": 4, "buckets": [[0.5, 2], [1.0, 4], ["+Inf", 4]],
                                                           "p90": 0.9}},
        "samples": {"jct_seconds": [jct * 0.5, jct, jct * 1.5]},
        "scheduling": {"cross_rank_migrations": 0, "force_resumes": 0, "segment_yields": 0},
    }
    if router_p90 is not None:
        rep["queue_wait_seconds"]["router"] = {"count": 2, "p50": 0.1, "p90": router_p90,
                                               "buckets": [[0.1, 1], [1.0, 2], ["+Inf", 2]]}
    return rep


REPORTS = {"native": _report(100.0, 0.6, 70, 2.0), "agentd": _report(70.0, 0.72, 3, 3.0, 0.4),
           "vllm-router-ps": _report(80.0, 0.70, 4, 2.5, 0.6)}


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
