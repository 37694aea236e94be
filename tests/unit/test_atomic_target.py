"""Atomic writes never replace what is not a regular file, and follow symbolic links.

A report or trace is written through a temporary file renamed over the destination
(bench/output.py ``write_atomic``; ``agentd batch --errors`` and ``--retry-failed`` in
daemon/batch_output.py).  Until session 35 a destination such as ``/dev/null`` was replaced by the
rename: run as root, ``--out /dev/null`` left a regular file at /dev/null for every program on the
machine.  A FIFO stands in for the device here (no privileges needed, nothing global at risk).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from bench.output import write_atomic
from daemon.batch_output import drop_failed_records, write_errors_file
from daemon.commands.paths import atomic_target


def read_fifo(path: Path, into: list[bytes]) -> threading.Thread:
    def reader() -> None:
        with open(path, "rb") as f:
            into.append(f.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread


def test_a_fifo_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert atomic_target(fifo) is None
    got: list[bytes] = []
    thread = read_fifo(fifo, got)
    write_atomic(fifo, "report\n")
    thread.join(timeout=30)
    assert got == [b"report\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO, not a regular file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary file left


def test_the_batch_errors_file_into_a_fifo(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    failed = {"id": "batch_req_1", "custom_id": "a", "response": None, "error": {"code": "x", "message": "y"}}
    output.write_text(json.dumps(failed) + "\n")
    fifo = tmp_path / "errors"
    os.mkfifo(fifo)
    got: list[bytes] = []
    thread = read_fifo(fifo, got)
    assert write_errors_file(output, fifo) == 1
    thread.join(timeout=30)
    assert got == [output.read_bytes()] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert drop_failed_records(fifo) == 0 and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symbolic_link_keeps_pointing_at_the_new_file(tmp_path: Path) -> None:
    real = tmp_path / "reports" / "r.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and link.resolve() == real and real.read_text() == "new"
    errors = tmp_path / "errors-link"
    errors.symlink_to(real)
    output = tmp_path / "out.jsonl"
    output.write_text("")
    assert write_errors_file(output, errors) == 0
    assert errors.is_symlink() and real.read_text() == ""


def test_a_new_file_is_created(tmp_path: Path) -> None:
    write_atomic(tmp_path / "new.json", "x")
    assert (tmp_path / "new.json").read_text() == "x"
