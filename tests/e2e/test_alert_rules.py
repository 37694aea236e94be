"""configs/grafana/agentd-alerts.yml: the alerting rules (docs/operations.md §6.1) select only
series agentd exports, match and group only on labels those series carry, name in their
annotations only labels the alert keeps, and point their runbooks at sections that exist.  With
``promtool`` installed (Debian's ``prometheus`` package) the rules are also checked and their unit
tests (configs/grafana/agentd-alerts.test.yml) run; without it that part is skipped."""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from test_grafana_dashboard import PROMETHEUS_SYNTHETIC, body, exported_names, metric_names, sim_config
from test_walk31_grafana_labels import exposition_labels, label_problems, registry_labels

from daemon.supervisor import run_daemon

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "configs" / "grafana" / "agentd-alerts.yml"
TESTS = ROOT / "configs" / "grafana" / "agentd-alerts.test.yml"
_ANNOTATION_LABEL = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")


def load_rules(text: str) -> list[dict[str, str]]:
    """The rules of the file as ``{alert, expr, for, severity, summary, description, runbook_url}``
    (a reader for this file's own layout: ``expr: |`` blocks and one-line ``key: value`` fields)."""
    rules: list[dict[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("- alert:"):
            rules.append({"alert": stripped.split(":", 1)[1].strip()})
        elif rules and stripped == "expr: |":
            indent = len(line) - len(line.lstrip())
            block = []
            while i + 1 < len(lines) and (
                not lines[i + 1].strip() or len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent
            ):
                i += 1
                block.append(lines[i].strip())
            rules[-1]["expr"] = " ".join(b for b in block if b)
        elif rules and ":" in stripped and not stripped.startswith("#"):
            key, value = (part.strip() for part in stripped.split(":", 1))
            if key in ("for", "severity", "summary", "description", "runbook_url") and value:
                rules[-1][key] = value.strip("'\"")
        i += 1
    return rules


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def test_the_rules_file_reads_as_expected() -> None:
    rules = load_rules(RULES.read_text())
    assert len(rules) == RULES.read_text().count("- alert:") >= 12
    for rule in rules:
        assert {"expr", "severity", "summary", "description", "runbook_url"} <= set(rule), rule
        assert rule["severity"] in ("critical", "warning"), rule
        metric_names(rule["expr"])  # a misspelt PromQL function raises


def test_every_runbook_points_at_an_existing_section() -> None:
    for rule in load_rules(RULES.read_text()):
        path, _, anchor = rule["runbook_url"].partition("#")
        target = ROOT / path
        assert target.is_file(), rule
        if anchor:
            assert anchor in heading_anchors(target.read_text()), rule


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)
def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    for argv in (["promtool", "check", "rules", str(RULES)], ["promtool", "test", "rules", str(TESTS)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


async def test_every_series_and_label_the_rules_use_is_exported() -> None:
    # over a real socket: the edge's and the data plane's collectors belong to the serving daemon
    cfg = sim_config()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg))
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=30) as client:
                assert (await client.post("/v1/chat/completions", json=body("alerts"))).status_code == 200
                await handles.program_dispatcher.wait_diagnostics(lambda d: d["ranks"][0]["observation_fresh"])
                text = (await client.get("/metrics")).text
            labels = {**exposition_labels(text), **registry_labels(handles.registry)}
            handles.request_shutdown()
            nursery.cancel_scope.cancel()
    names = exported_names(text)
    problems: dict[str, list[str]] = {}
    for rule in load_rules(RULES.read_text()):
        expr = rule["expr"]
        for name in sorted(metric_names(expr) - names - PROMETHEUS_SYNTHETIC):
            problems.setdefault(rule["alert"], []).append(f"{name}: not exported")
        # the annotations' $labels.X must be labels of the alert's series
        legend = " ".join("{{" + n + "}}" for n in _ANNOTATION_LABEL.findall(rule["summary"] + rule["description"]))
        problems_here = label_problems(expr, legend, labels)
        if problems_here:
            problems.setdefault(rule["alert"], []).extend(problems_here)
    assert problems == {}
