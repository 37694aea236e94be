"""``agentd simulate`` shows a progress line like bench, replay and check-fairness: by default when
stderr is a terminal, forced with ``--progress``, never with ``--no-progress``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon import cli

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml")


class Terminal:
    """A stand-in for a terminal's stderr (what ``isatty`` answers is all that matters here)."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "one.jsonl"
    assert cli.main(["trace", "synth", "--profile", "chat-human", "--programs", "1", "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize(
    ("flags", "terminal", "shown"),
    [([], False, False), ([], True, True), (["--progress"], False, True), (["--no-progress"], True, False)],
)
def test_simulate_progress_line(
    trace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    terminal: bool,
    shown: bool,
) -> None:
    stderr = Terminal()
    if terminal:
        monkeypatch.setattr("sys.stderr", stderr)
    report = tmp_path / "sim.json"
    argv = ["simulate", "--config", QUICKSTART, "--trace", str(trace), "--out", str(report), *flags]
    assert cli.main(argv) == 0
    assert json.loads(report.read_text())["requests"]["failed"] == 0
    printed = stderr.text if terminal else capsys.readouterr().err
    assert ("simulate" in printed) is shown, printed


def test_progress_flags_exclude_each_other(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--config", QUICKSTART, "--trace", str(trace), "--progress", "--no-progress"]
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert "--no-progress" in capsys.readouterr().err
