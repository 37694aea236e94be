"""The output file of ``agentd batch`` (daemon/batch_output.py, docs/batch.md §3 Resume)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.batch_output import (
    OutputFileError,
    OutputWriter,
    drop_failed_records,
    record_ok,
    scan_output,
    truncate_partial_line,
    write_errors_file,
)


def rec(custom_id: str | None, status: int | None = 200, *, rid: str | None = None, error: bool = False) -> bytes:
    record: dict[str, Any] = {
        "id": rid or f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": None if status is None else {"status_code": status, "request_id": None, "body": {}},
        "error": {"code": "timeout", "message": "t"} if error else None,
    }
    return json.dumps(record).encode() + b"\n"


@pytest.mark.parametrize(
    ("content", "kept"),
    [
        (b"", b""),
        (b"a\nb\n", b"a\nb\n"),
        (b"a\nb\npart", b"a\nb\n"),
        (b"partial only", b""),
        (b"a\n" + b"x" * 200_000, b"a\n"),  # the partial line spans several read blocks
        (b"x" * 200_000 + b"\n" + b"y" * 70_000, b"x" * 200_000 + b"\n"),
    ],
)
def test_truncate_partial_line(tmp_path: Path, content: bytes, kept: bytes) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(content)
    assert truncate_partial_line(path) == len(content) - len(kept)
    assert path.read_bytes() == kept


def test_scan_counts_outcomes_and_keys_line_records_by_number(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(
        rec("a")
        + rec("b", 500)
        + rec("c", None, error=True)
        + rec(None, None, rid="batch_req_line_7", error=True)
        + rec("d", None, rid="batch_req_line_9", error=True)
        + b'{"id": "batch_req_e", "custom_'
    )
    resumed = scan_output(path)
    assert resumed.custom_ids == {"a", "b", "c"}
    assert resumed.line_numbers == {7, 9}
    assert (resumed.ok, resumed.failed, resumed.malformed) == (1, 2, 2)
    assert resumed.truncated_bytes == len(b'{"id": "batch_req_e", "custom_')
    assert scan_output(tmp_path / "missing.jsonl").custom_ids == set()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"nope\n", "line 1 is not JSON"),
        (rec("a") + b"[1]\n", "line 2 is not a batch output record"),
        (b'{"id": 3, "custom_id": "a"}\n', "line 1 is not a batch output record"),
        (b'{"id": "x", "custom_id": 5}\n', "line 1: custom_id must be a string"),
    ],
)
def test_scan_refuses_a_file_that_is_not_a_batch_output(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(content)
    with pytest.raises(OutputFileError, match=message):
        scan_output(path)
    assert path.read_bytes() == content


def test_drop_failed_and_the_errors_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    lines = [rec("a"), rec("b", 429), rec(None, None, rid="batch_req_line_3", error=True), rec("c", None, error=True)]
    path.write_bytes(b"".join(lines))
    errors = tmp_path / "errors.jsonl"
    assert write_errors_file(path, errors) == 3
    assert errors.read_bytes() == lines[1] + lines[2] + lines[3]
    assert drop_failed_records(path) == 2
    assert path.read_bytes() == lines[0] + lines[2]
    assert drop_failed_records(path) == 0 and path.read_bytes() == lines[0] + lines[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["errors.jsonl", "out.jsonl"]  # no temporary left
    resumed = scan_output(path, drop_failed=True)
    assert resumed.custom_ids == {"a"} and resumed.dropped == 0


def test_record_ok() -> None:
    assert record_ok(json.loads(rec("a", 204)))
    assert not record_ok(json.loads(rec("a", 300)))
    assert not record_ok(json.loads(rec("a", 200, error=True)))
    assert not record_ok({"id": "x", "custom_id": "a", "response": None, "error": None})


def test_writer_appends_whole_lines_and_syncs(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(rec("old"))
    writer = OutputWriter(path, fsync_every=2)
    for cid in ("a", "b", "c"):
        writer.write(json.loads(rec(cid)))
    assert writer.lines_written == 3
    writer.close()
    writer.close()  # idempotent
    assert [json.loads(line)["custom_id"] for line in path.read_bytes().splitlines()] == ["old", "a", "b", "c"]
    OutputWriter(path, truncate=True).close()
    assert path.read_bytes() == b""
