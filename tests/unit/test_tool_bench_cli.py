"""``python -m bench.tool_bench``: rows' configurations and bad input (docs/benchmarks.md §9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.tool_bench import POINTS, main, system_config


def test_tool_bench_rows_carry_their_program_scheduling_field() -> None:
    point = POINTS["coding-long"]
    assert system_config(point, "agentd").program_scheduling.cross_rank_move_cost == "context"
    moved = system_config(point, "agentd-move-resident").program_scheduling
    assert moved.cross_rank_move_cost == "resident"
    assert moved.tool_retention.enabled  # the rest is the agentd row's
    assert not system_config(point, "agentd-no-tool-ttl").program_scheduling.tool_retention.enabled
    assert system_config(point, "native").enable_program_scheduling is False
    # --ps-config-json merges into every agentd row, over the row's own field
    merged = system_config(point, "agentd-no-tool-ttl", {"cross_rank_move_cost": "resident"}).program_scheduling
    assert merged.cross_rank_move_cost == "resident" and not merged.tool_retention.enabled


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{", "--ps-config-json: not valid JSON"),
        ("[1]", "--ps-config-json: must be a JSON object"),
        (
            '{"cross_rank_move_cost": "nearest"}',
            "--ps-config-json: program_scheduling.cross_rank_move_cost: must be one of",
        ),
    ],
)
def test_tool_bench_bad_ps_config_json_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    assert main(["--out", str(tmp_path), "--ps-config-json", value]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing ran
