"""Links agentd prints point at documentation that exists (docs audit, session 43).

The start-up calibration warning (docs/config.md, "Calibration warning") names the docs section
that explains the coefficients in its ``calibration_docs`` field: an operator following it must land
on that heading, so its anchor must be one GitHub derives from a heading of the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, RoutingConfig
from daemon.config_loading import config_warnings

ROOT = Path(__file__).resolve().parents[2]


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file (outside code fences)."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower().replace("`", "")
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def test_the_calibration_warning_links_an_existing_section() -> None:
    cfg = AgentdConfig(
        routing=RoutingConfig(worker_urls=("http://worker-0:8000",)),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(),
    )
    [warning] = [w for w in config_warnings(cfg) if w.event == "program_scheduling_reference_calibration"]
    link = dict(warning.fields)["calibration_docs"]
    path, _, anchor = link.partition("#")
    target = ROOT / path
    assert target.is_file(), link
    assert anchor in heading_anchors(target.read_text()), link
