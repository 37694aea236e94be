"""The Batch API's SQLite store (daemon/batch_store.py): transitions, idempotent commits, restart recovery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from daemon.batch_store import TRANSITIONS, BatchDatabase, BatchStore, LineRow
from daemon.config import BatchApiConfig, default_state_dir
from daemon.config_loading import ConfigError, config_from_dict

ENDPOINT = "/v1/chat/completions"


def _db(tmp_path: Path) -> BatchDatabase:
    clock = iter(range(1000, 100000))
    return BatchDatabase(tmp_path / "state" / "b.sqlite3", now=lambda: next(clock))


def _rows(n: int, bad: tuple[int, ...] = ()) -> list[LineRow]:
    rows = []
    for i in range(1, n + 1):
        if i in bad:
            rows.append(LineRow(i, None, None, f'{{"bad":{i}}}\n'.encode()))
        else:
            rows.append(LineRow(i, f"c{i}", {"url": ENDPOINT, "body": {"n": i}}))
    return rows


def _started(db: BatchDatabase, n: int, bad: tuple[int, ...] = ()) -> str:
    file = db.create_file("in.jsonl", "batch", b"x")
    batch = db.create_batch(file["id"], ENDPOINT, "24h", {"k": "v"})
    assert db.start_batch(batch["id"], _rows(n, bad))
    return str(batch["id"])


def test_batch_store_creates_the_database_and_its_directory(tmp_path: Path) -> None:
    db = _db(tmp_path)
    assert (tmp_path / "state" / "b.sqlite3").exists()
    mode = db._conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    db.close()


def test_batch_store_files_roundtrip_and_chunks(tmp_path: Path) -> None:
    db = _db(tmp_path)
    file = db.create_file("in.jsonl", "batch", b"0123456789")
    assert file["object"] == "file" and file["bytes"] == 10 and file["purpose"] == "batch"
    assert file["id"].startswith("file-")
    assert db.get_file(file["id"]) == file
    assert db.file_content(file["id"]) == b"0123456789"
    assert db.read_file_chunk(file["id"], 3, 4) == b"3456"
    assert db.read_file_chunk(file["id"], 8, 100) == b"89"
    assert db.read_file_chunk(file["id"], 50, 4) == b""
    assert db.read_file_chunk("file-nope", 0, 4) is None
    assert db.delete_file(file["id"]) and not db.delete_file(file["id"])
    assert db.get_file(file["id"]) is None


def test_batch_store_new_batch_is_validating_with_openai_fields(tmp_path: Path) -> None:
    db = _db(tmp_path)
    file = db.create_file("in.jsonl", "batch", b"x")
    batch = db.create_batch(file["id"], ENDPOINT, "24h", {"team": "eval"})
    assert batch["object"] == "batch" and batch["id"].startswith("batch_")
    assert batch["status"] == "validating"
    assert batch["expires_at"] == batch["created_at"] + 24 * 3600
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"team": "eval"}
    assert batch["output_file_id"] is None and batch["errors"] is None
    for key in ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "cancelling_at", "cancelled_at"):
        assert batch[key] is None
    assert db.active_batches() == [(batch["id"], "validating")]


def test_batch_store_refuses_illegal_transitions(tmp_path: Path) -> None:
    db = _db(tmp_path)
    file = db.create_file("in.jsonl", "batch", b"x")
    batch_id = db.create_batch(file["id"], ENDPOINT, "24h", None)["id"]
    for to in ("finalizing", "completed", "cancelled"):
        assert not db.transition(batch_id, to)
    assert db.status(batch_id) == "validating"
    assert not db.transition("batch_unknown", "in_progress")
    assert set(TRANSITIONS) == {"in_progress", "failed", "finalizing", "completed", "cancelling", "cancelled"}


def test_batch_store_full_lifecycle_writes_output_and_error_files_in_input_order(tmp_path: Path) -> None:
    db = _db(tmp_path)
    batch_id = _started(db, 4, bad=(2,))
    batch = db.get_batch(batch_id)
    assert batch is not None and batch["status"] == "in_progress" and batch["in_progress_at"] is not None
    assert batch["request_counts"] == {"total": 4, "completed": 0, "failed": 1}
    assert [p.line_no for p in db.pending_lines(batch_id, 0, 10)] == [1, 3, 4]
    # answers arrive out of order
    assert db.commit_result(batch_id, 4, b'{"n":4}\n', True)
    assert db.commit_result(batch_id, 1, b'{"n":1}\n', True)
    assert db.commit_result(batch_id, 3, b'{"n":3}\n', False)
    assert db.pending_lines(batch_id, 0, 10) == []
    assert db.transition(batch_id, "finalizing")
    assert db.finalize(batch_id, "completed")
    batch = db.get_batch(batch_id)
    assert batch is not None and batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    assert db.file_content(batch["output_file_id"]) == b'{"n":1}\n{"n":4}\n'
    assert db.file_content(batch["error_file_id"]) == b'{"bad":2}\n{"n":3}\n'
    output = db.get_file(batch["output_file_id"])
    assert output is not None and output["purpose"] == "batch_output"
    assert db.active_batches() == []
    assert not db.finalize(batch_id, "completed")  # already completed: nothing written twice


def test_batch_store_commit_result_is_idempotent(tmp_path: Path) -> None:
    db = _db(tmp_path)
    batch_id = _started(db, 2)
    assert db.commit_result(batch_id, 1, b'{"first":1}\n', True)
    assert not db.commit_result(batch_id, 1, b'{"second":1}\n', False)
    batch = db.get_batch(batch_id)
    assert batch is not None and batch["request_counts"] == {"total": 2, "completed": 1, "failed": 0}
    assert db.line_counts(batch_id) == (1, 2)
    assert not db.commit_result(batch_id, 99, b"{}\n", True)  # no such line


def test_batch_store_start_batch_runs_once(tmp_path: Path) -> None:
    db = _db(tmp_path)
    batch_id = _started(db, 3)
    assert not db.start_batch(batch_id, _rows(3))
    assert db.line_counts(batch_id) == (0, 3)


def test_batch_store_cancel_keeps_partial_results(tmp_path: Path) -> None:
    db = _db(tmp_path)
    batch_id = _started(db, 3)
    assert db.commit_result(batch_id, 2, b'{"n":2}\n', True)
    assert db.request_cancel(batch_id)
    assert not db.request_cancel(batch_id)  # already cancelling
    assert not db.transition(batch_id, "finalizing")
    assert db.finalize(batch_id, "cancelled")
    batch = db.get_batch(batch_id)
    assert batch is not None and batch["status"] == "cancelled"
    assert batch["cancelling_at"] is not None and batch["cancelled_at"] is not None
    assert db.file_content(batch["output_file_id"]) == b'{"n":2}\n'
    assert batch["error_file_id"] is None
    assert not db.request_cancel(batch_id)


def test_batch_store_validation_finishing_after_a_cancel_keeps_cancelling(tmp_path: Path) -> None:
    db = _db(tmp_path)
    file = db.create_file("in.jsonl", "batch", b"x")
    batch_id = db.create_batch(file["id"], ENDPOINT, "24h", None)["id"]
    assert db.request_cancel(batch_id)
    assert db.start_batch(batch_id, _rows(2))
    assert db.status(batch_id) == "cancelling"


def test_batch_store_fail_batch_records_errors(tmp_path: Path) -> None:
    db = _db(tmp_path)
    file = db.create_file("in.jsonl", "batch", b"x")
    batch_id = db.create_batch(file["id"], ENDPOINT, "24h", None)["id"]
    errors = [{"code": "invalid_request", "message": f"line {i}: bad", "param": None, "line": i} for i in range(150)]
    assert db.fail_batch(batch_id, errors)
    batch = db.get_batch(batch_id)
    assert batch is not None and batch["status"] == "failed" and batch["failed_at"] is not None
    assert batch["errors"]["object"] == "list" and len(batch["errors"]["data"]) == 100
    assert not db.fail_batch(batch_id, errors)


def test_batch_store_restart_recovers_unanswered_lines(tmp_path: Path) -> None:
    db = _db(tmp_path)
    batch_id = _started(db, 5)
    for line in (1, 3):
        assert db.commit_result(batch_id, line, f'{{"n":{line}}}\n'.encode(), True)
    db.close()  # the process dies here: lines 2, 4 and 5 were in flight or never sent
    again = _db(tmp_path)
    assert again.active_batches() == [(batch_id, "in_progress")]
    pending = again.pending_lines(batch_id, 0, 10)
    assert [(p.line_no, p.custom_id) for p in pending] == [(2, "c2"), (4, "c4"), (5, "c5")]
    assert pending[0].request == {"url": ENDPOINT, "body": {"n": 2}}
    assert [p.line_no for p in again.pending_lines(batch_id, 2, 1)] == [4]
    assert not again.commit_result(batch_id, 1, b'{"again":1}\n', True)  # a re-sent answered line
    for line in (2, 4, 5):
        assert again.commit_result(batch_id, line, f'{{"n":{line}}}\n'.encode(), True)
    assert again.transition(batch_id, "finalizing") and again.finalize(batch_id, "completed")
    batch = again.get_batch(batch_id)
    assert batch is not None
    content = again.file_content(batch["output_file_id"])
    assert content is not None
    assert [json.loads(x)["n"] for x in content.splitlines()] == [1, 2, 3, 4, 5]


def test_batch_store_lists_newest_first_with_a_cursor(tmp_path: Path) -> None:
    db = _db(tmp_path)
    file = db.create_file("in.jsonl", "batch", b"x")
    ids = [db.create_batch(file["id"], ENDPOINT, "24h", None)["id"] for _ in range(5)]
    page = db.list_batches(2, None)
    assert page is not None
    items, more = page
    assert [b["id"] for b in items] == ids[::-1][:2] and more
    page = db.list_batches(10, items[-1]["id"])
    assert page is not None
    assert [b["id"] for b in page[0]] == ids[::-1][2:] and not page[1]
    assert db.list_batches(2, "batch_unknown") is None
    assert db.status_counts() == {"validating": 5}


async def test_batch_store_runs_calls_off_the_trio_thread(tmp_path: Path) -> None:
    store = BatchStore(_db(tmp_path))
    file = await store.call(store.db.create_file, "in.jsonl", "batch", b"abc")
    got = await store.call(store.db.get_file, file["id"])
    assert got == file
    async with trio.open_nursery() as nursery:  # concurrent callers are serialized, none lost
        for i in range(20):
            nursery.start_soon(store.call, store.db.create_file, f"f{i}", "batch", b"x")
    count = store.db._conn.execute("SELECT COUNT(*) FROM files").fetchone()[0]
    assert count == 21
    store.db.close()


def test_batch_api_config_defaults_rules_and_state_dir(tmp_path: Path) -> None:
    cfg = config_from_dict({})
    assert cfg.batch_api == BatchApiConfig()
    assert cfg.batch_api.enabled and cfg.batch_api.max_lines == 50_000 and cfg.batch_api.concurrency == 32
    assert cfg.batch_api.max_file_bytes == 200 * 1024 * 1024
    assert default_state_dir({"XDG_STATE_HOME": "/var/x", "HOME": "/home/u"}) == Path("/var/x/agentd")
    assert default_state_dir({"XDG_STATE_HOME": "relative", "HOME": "/home/u"}) == Path("/home/u/.local/state/agentd")
    assert default_state_dir({"HOME": "/home/u"}) == Path("/home/u/.local/state/agentd")
    assert BatchApiConfig().resolved_database_path({"HOME": "/h"}) == Path("/h/.local/state/agentd/batches.sqlite3")
    given = config_from_dict({"batch_api": {"database_path": str(tmp_path / "x.db"), "concurrency": 4}})
    assert given.batch_api.resolved_database_path() == tmp_path / "x.db"
    with pytest.raises(ConfigError) as info:
        config_from_dict({"batch_api": {"max_lines": 0, "concurrency": "8", "max_file_bytes": -1, "bogus": 1}})
    text = "\n".join(info.value.lines)
    assert "batch_api.max_lines: must be an integer > 0 (got 0)" in text
    assert "batch_api.concurrency: must be an integer" in text
    assert "batch_api.max_file_bytes: must be an integer > 0 (got -1)" in text
    assert "batch_api.bogus: unknown key" in text
