"""What the session-27 walk found in the commands' flags.

``--seed -1`` was accepted by ``agentd simulate`` (then reported as a bad ``embedded.seed`` of the
configuration file, which does not hold it), ``agentd bench`` (whose simulated workers refuse it)
and ``agentd check-fairness``: each now exits 2 naming the flag.
"""

from __future__ import annotations

import pytest

from daemon import cli

QUICKSTART = "configs/quickstart.toml"


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--config", QUICKSTART, "--trace", "t.jsonl"],
        ["bench", "--trace", "t.jsonl", "--out", "out"],
        ["check-fairness", "--config", QUICKSTART],
    ],
)
def test_a_negative_seed_is_a_usage_error_naming_the_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--seed", "-1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"agentd {argv[0]}: error: argument --seed: must be an integer >= 0, got '-1'"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--trace", "t.jsonl", "--out", ""],
        ["check-fairness", "--config", QUICKSTART, "--out", ""],
        ["trace", "synth", "--profile", "swe-short", "--programs", "2", "--out", ""],
    ],
)
def test_an_empty_out_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``--out ''`` is ``Path("")``, the current directory: the bench and the fairness check wrote
    their reports and logs into it, trace synth said it is a directory."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    assert capsys.readouterr().err.strip().endswith("--out: must not be empty")


@pytest.mark.parametrize("module", ["bench.tool_bench", "bench.soak"])
def test_the_bench_tools_refuse_an_empty_out(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--out", ""])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--out: must not be empty")
