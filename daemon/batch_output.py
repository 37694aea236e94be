"""The output file of ``agentd batch``: resume scan, whole-line appends, the derived errors file.

Crash safety (docs/batch.md §3): every record is one complete line written with a single ``write``
call loop on an ``O_APPEND`` descriptor, flushed to the OS at once and ``fsync``-ed every
``fsync_every`` lines and on close.  A crash can therefore only leave a *trailing* partial line (the
last write cut short); :func:`scan_output` truncates it away before the next run appends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attrs import define

from daemon.batchfile import encode_record
from daemon.commands.paths import atomic_target

# Record ids of output lines that answer a malformed or duplicate *input line* (keyed by line number,
# since such a line may have no custom_id); every other record id is "batch_req_" + random hex.
LINE_RECORD_PREFIX = "batch_req_line_"


def line_record_id(line_number: int) -> str:
    return f"{LINE_RECORD_PREFIX}{line_number}"


class OutputFileError(Exception):
    """The existing output file is not a batch output file this command can resume."""


def record_ok(record: dict[str, Any]) -> bool:
    """A 2xx response with no error."""
    response = record.get("response")
    if record.get("error") is not None or not isinstance(response, dict):
        return False
    status = response.get("status_code")
    return isinstance(status, int) and 200 <= status < 300


@define
class Resumed:
    """What an existing output file already answers."""

    custom_ids: set[str]  # answered requests (any outcome)
    line_numbers: set[int]  # answered malformed/duplicate input lines
    ok: int = 0
    failed: int = 0  # non-2xx responses and transport errors
    malformed: int = 0
    truncated_bytes: int = 0  # a trailing partial line removed
    dropped: int = 0  # failed records removed to be retried (``drop_failed``)


def _records(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        yield from enumerate(f, start=1)


def truncate_partial_line(path: Path) -> int:
    """Cut a trailing line without its newline (a write cut short); return the bytes removed."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "r+b") as f:
        block = 1 << 16
        end = size
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            if end == size and chunk.endswith(b"\n"):
                return 0
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        else:
            keep = 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


def _record(number: int, raw: bytes) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError:
        raise OutputFileError(f"line {number} is not JSON") from None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str) or "custom_id" not in record:
        raise OutputFileError(f"line {number} is not a batch output record (no 'id'/'custom_id')")
    return record


def _is_line_record(record: dict[str, Any]) -> bool:
    record_id: str = record["id"]
    return record_id.startswith(LINE_RECORD_PREFIX) and record_id[len(LINE_RECORD_PREFIX) :].isdigit()


def drop_failed_records(path: Path) -> int:
    """Rewrite ``path`` atomically without its failed request records (non-2xx, transport errors; the
    malformed-line records stay); return how many were dropped.  The file must be whole lines."""
    target = atomic_target(path)
    if target is None:
        return 0  # not a regular file (/dev/null): it keeps no records
    tmp = target.with_name(f".{target.name}.retry.tmp")
    dropped = 0
    try:
        with open(tmp, "wb") as out:
            for number, raw in _records(path):
                record = _record(number, raw)
                if not _is_line_record(record) and not record_ok(record):
                    dropped += 1
                    continue
                out.write(raw)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if dropped:
        os.replace(tmp, target)
    else:
        tmp.unlink()
    return dropped


def scan_output(path: Path, *, drop_failed: bool = False) -> Resumed:
    """Truncate a trailing partial line (and with ``drop_failed`` remove the failed request records,
    :func:`drop_failed_records`), then read which lines/custom_ids the file answers.

    Raises :class:`OutputFileError` naming the line when a complete line is not an output record."""
    resumed = Resumed(set(), set())
    if not path.exists():
        return resumed
    resumed.truncated_bytes = truncate_partial_line(path)
    if drop_failed:
        resumed.dropped = drop_failed_records(path)
    for number, raw in _records(path):
        record = _record(number, raw)
        record_id: str = record["id"]
        if _is_line_record(record):
            resumed.line_numbers.add(int(record_id[len(LINE_RECORD_PREFIX) :]))
            resumed.malformed += 1
            continue
        custom_id = record["custom_id"]
        if not isinstance(custom_id, str):
            raise OutputFileError(f"line {number}: custom_id must be a string")
        if custom_id in resumed.custom_ids:
            continue  # cannot happen with files this command wrote; count once
        resumed.custom_ids.add(custom_id)
        if record_ok(record):
            resumed.ok += 1
        else:
            resumed.failed += 1
    return resumed


class OutputWriter:
    """Appends whole records to the output file (see the module docstring)."""

    def __init__(self, path: Path, *, fsync_every: int = 64, truncate: bool = False) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        self._fd = os.open(path, flags, 0o644)
        self._fsync_every = fsync_every
        self._unsynced = 0
        self.lines_written = 0

    def write(self, record: dict[str, Any]) -> None:
        data = memoryview(encode_record(record))
        while data:
            n = os.write(self._fd, data)
            data = data[n:]
        self.lines_written += 1
        self._unsynced += 1
        if self._unsynced >= self._fsync_every:
            self.sync()

    def sync(self) -> None:
        if self._unsynced:
            os.fsync(self._fd)
            self._unsynced = 0

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1


def write_errors_file(output: Path, errors: Path) -> int:
    """Rewrite ``errors`` atomically with the records of ``output`` that are not a 2xx; return how many.
    A destination that is not a regular file (``/dev/null``) is written in place."""
    target = atomic_target(errors)
    tmp = errors if target is None else target.with_name(f".{target.name}.tmp")
    count = 0
    try:
        with open(tmp, "wb") as out:
            if output.exists():
                for _, raw in _records(output):
                    if raw.endswith(b"\n") and not record_ok(json.loads(raw)):
                        out.write(raw)
                        count += 1
            out.flush()
            if target is not None:
                os.fsync(out.fileno())
    except BaseException:
        if target is not None:
            tmp.unlink(missing_ok=True)
        raise
    if target is not None:
        os.replace(tmp, target)
    return count
