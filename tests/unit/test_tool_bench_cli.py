"""``python -m bench.tool_bench``: rows' configurations and bad input (docs/benchmarks.md §9)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import tool_bench
from bench.tool_bench import POINTS, Point, main, render_seeds, seed_ratios, system_config


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


def _jct(mean: float) -> dict[str, Any]:
    return {"jct_seconds": {"mean": mean}}


def test_seed_ratios_give_each_seed_and_their_mean_geomean_and_spread() -> None:
    by_seed = {
        1: {"native": _jct(100.0), "agentd": _jct(90.0), "agentd-move-resident": _jct(81.0)},
        2: {"native": _jct(200.0), "agentd": _jct(220.0), "agentd-move-resident": _jct(242.0)},
        3: {"native": _jct(50.0)},  # a seed where the agentd rows did not run counts for nobody
    }
    ratios = seed_ratios(by_seed, ["native", "agentd", "agentd-move-resident"])
    assert list(ratios) == ["agentd / native", "agentd-move-resident / native", "agentd-move-resident / agentd"]
    moved = ratios["agentd-move-resident / agentd"]
    assert moved["per_seed"] == {1: pytest.approx(0.9), 2: pytest.approx(1.1)}
    assert moved["mean"] == pytest.approx(1.0)
    assert moved["geomean"] == pytest.approx(math.sqrt(0.99))
    assert (moved["min"], moved["max"]) == (pytest.approx(0.9), pytest.approx(1.1))
    assert moved["sd"] == pytest.approx(math.sqrt(0.02))
    assert ratios["agentd-move-resident / native"]["per_seed"] == {1: pytest.approx(0.81), 2: pytest.approx(1.21)}
    # the floor is a reference like native; without native, floor and agentd rows are divided by it
    assert [*seed_ratios(by_seed | {1: by_seed[1] | {"floor": _jct(80.0)}}, ["floor", "agentd"])] == ["agentd / floor"]


def test_render_seeds_tables_per_seed_and_over_the_seeds() -> None:
    point = Point("swe-short", 48, 1, 4500, 32)
    by_seed = {
        2: {"agentd": _jct(220.0), "agentd-move-resident": _jct(242.0)},
        1: {"agentd": _jct(90.0), "agentd-move-resident": _jct(81.0)},
    }
    text = render_seeds({"thrash": by_seed}, ["native", "agentd", "agentd-move-resident"], {"thrash": point})
    assert "## thrash: swe-short x48, trace seeds 1,2, 4500 blocks/rank, concurrency 32" in text
    lines = text.splitlines()
    start = lines.index("| seed | agentd | agentd-move-resident |")  # native did not run: no column
    assert lines[start + 2 : start + 4] == ["| 1 | 90.00 | 81.00 |", "| 2 | 220.00 | 242.00 |"]
    start = lines.index("| seed | agentd-move-resident / agentd |")
    assert lines[start + 2 : start + 10] == [
        "| 1 | 0.900 |",
        "| 2 | 1.100 |",
        "| mean | 1.000 |",
        "| geomean | 0.995 |",
        "| min | 0.900 |",
        "| max | 1.100 |",
        "| sd | 0.141 |",
        "| seeds < 1 | 1 of 2 |",
    ]


@pytest.mark.parametrize(
    ("seeds", "message"),
    [
        ("0", "argument --seeds: must be comma-separated integers >= 1, got '0'"),
        ("1,x", "argument --seeds: must be comma-separated integers >= 1, got '1,x'"),
        ("1,2,1", "--seeds: a seed is given twice (1,2,1)"),
    ],
)
def test_tool_bench_bad_seeds_exit_2_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seeds: str, message: str
) -> None:
    try:
        code = main(["--out", str(tmp_path), "--seeds", seeds])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# one swe-short Program on a rank pair: a few seconds per simulation
TINY = Point("swe-short", 1, 1, 4500, 1)


def test_seeds_run_every_system_on_every_seed_and_seed_n_is_the_point_run_with_seed_n(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tool_bench, "POINTS", {"tiny": TINY})
    argv = ["--points", "tiny", "--systems", "native,agentd", "--jobs", "1"]
    assert main(["--out", str(tmp_path / "one"), *argv]) == 0  # the point's own seed (1): unchanged layout
    assert sorted(p.name for p in (tmp_path / "one" / "tiny").iterdir()) == ["agentd.json", "native.json"]
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert main(["--out", str(tmp_path / "many"), *argv, "--seeds", "2,1"]) == 0
    many = json.loads((tmp_path / "many" / "summary.json").read_text())["tiny"]
    for seed in ("1", "2"):
        files = sorted(p.name for p in (tmp_path / "many" / "tiny" / f"seed{seed}").iterdir())
        assert files == ["agentd.json", "native.json"]
    # deterministic: seed 1 of the seeds run is the point's own run to the last digit, seed 2 another trace
    assert many["seeds"]["1"] == one["tiny"]
    assert many["seeds"]["2"]["native"]["mean"] != many["seeds"]["1"]["native"]["mean"]
    ratio = many["ratios"]["agentd / native"]
    for seed in ("1", "2"):
        assert ratio["per_seed"][seed] == many["seeds"][seed]["agentd"]["mean"] / many["seeds"][seed]["native"]["mean"]
    assert ratio["mean"] == pytest.approx(sum(ratio["per_seed"].values()) / 2)
    report = (tmp_path / "many" / "report.md").read_text()
    assert "## tiny: swe-short x1, trace seeds 1,2, 4500 blocks/rank, concurrency 1" in report
    assert "| seed | agentd / native |" in report
