"""Session 40's CLI walk: bad input to the kit's commands is an exit 2 naming the flag, the rule and
the value, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.commands.trace import MAX_TOKEN_SCALE
from daemon import cli


@pytest.mark.parametrize("flag", ["--input-scale", "--output-scale"])
@pytest.mark.parametrize("value", ["1e300", "100.5", "0", "-1", "nan", "inf"])
def test_trace_synth_token_scales_are_bounded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str
) -> None:
    """``--input-scale 1e300`` grew the process by gigabytes (a hash id per 512-token block of every
    prompt) until memory ran out; it is now ``0 < X <= 100`` (docs/traces.md, "Profiles")."""
    out = tmp_path / "t.jsonl"
    argv = ["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(out), flag, value]
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a number > 0 and <= {MAX_TOKEN_SCALE:g}, got '{value}'" in err, err
    assert not out.exists()


def test_trace_synth_largest_token_scale_still_works(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    argv = ["trace", "synth", "--profile", "swe-short", "--programs", "1", "--max-turns", "2", "--out", str(out)]
    assert cli.main([*argv, "--input-scale", f"{MAX_TOKEN_SCALE:g}", "--output-scale", "0.001"]) == 0
    assert out.read_text().count("\n") >= 3
