"""End-to-end fixtures (helpers live in ``native_fakes.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from native_fakes import FakeWorker

from daemon import cli


@pytest.fixture
def fake_worker() -> FakeWorker:
    return FakeWorker(("http://w0:8000", "http://w1:8000"))


@pytest.fixture
def trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A small synthetic trace file (two swe-short Programs) for the command-line walks."""
    path = tmp_path / "small.jsonl"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "2", "--out", str(path)]) == 0
    capsys.readouterr()
    return str(path)
