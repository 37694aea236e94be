"""The Batch API's durable state: one embedded SQLite database (docs/batch.md §4).

:class:`BatchDatabase` is synchronous (stdlib ``sqlite3``, WAL journal, ``synchronous=FULL``): every
method is one transaction, so a process killed at any instant leaves either the state before or the
state after it.  :class:`BatchStore` runs those methods off the Trio thread, one at a time
(``trio.to_thread.run_sync`` with a limiter of 1 over a single connection): simple, and a result
commit costs about one WAL fsync.

Tables: ``files`` (uploads and generated output/error files, content as a BLOB), ``batches`` (the
OpenAI batch object's fields) and ``batch_lines`` (one row per non-blank input line: the request to
send, or the error record of a malformed line, and once answered its output record).  A line is
*done* when its record is committed; :meth:`BatchDatabase.commit_result` commits a line at most once
(a second commit of the same line is a no-op), which is what makes the output exactly-once while the
requests to the workers are at-least-once (a line sent but not committed when the daemon died is sent
again after the restart).

Ownership (docs/batch.md §4): with API keys configured every file and batch records the tenant
of the key that created it in ``owner`` (output and error files inherit the batch's), and every
read, list, delete and cancel takes an ``owner`` argument: a tenant sees only its own objects (an
object created without keys, ``owner`` NULL, belongs to no tenant).  ``owner=None`` (no keys)
reads everything, as before.  Schema version 2 added the column; an older database is migrated in
place when it is opened (:func:`_migrate`).

Status transitions (OpenAI's): ``validating -> in_progress -> finalizing -> completed``,
``validating -> failed``, ``validating|in_progress -> cancelling -> cancelled``.  Any other move is
refused (the method returns False and changes nothing).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import attrs
import trio

SCHEMA_VERSION = 2
COMPLETION_WINDOW_SECONDS = 24 * 3600
TERMINAL = ("completed", "failed", "cancelled", "expired")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled", "expired")
# to -> the statuses it may be reached from
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "in_progress": ("validating",),
    "failed": ("validating",),
    "finalizing": ("in_progress",),
    "completed": ("finalizing",),
    "cancelling": ("validating", "in_progress"),
    "cancelled": ("cancelling",),
}
_TIME_COLUMN = {
    "in_progress": "in_progress_at",
    "failed": "failed_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}
MAX_BATCH_ERRORS = 100  # the batch object's ``errors.data`` keeps the first ones

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content BLOB NOT NULL,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS deleted_files (
    id TEXT PRIMARY KEY,
    file_rowid INTEGER NOT NULL,
    owner TEXT
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT,
    errors TEXT,
    output_file_id TEXT,
    error_file_id TEXT,
    created_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    expires_at INTEGER,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    expired_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER,
    total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    owner TEXT
);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS batch_lines (
    batch_id TEXT NOT NULL,
    line_no INTEGER NOT NULL,
    custom_id TEXT,
    request TEXT,
    done INTEGER NOT NULL DEFAULT 0,
    ok INTEGER NOT NULL DEFAULT 0,
    record BLOB,
    PRIMARY KEY (batch_id, line_no)
) WITHOUT ROWID;
"""


@attrs.frozen
class PendingLine:
    """A line still to be answered: its request as stored (``{"url": ..., "body": ...}``)."""

    line_no: int
    custom_id: str
    request: dict[str, Any]


@attrs.frozen
class LineRow:
    """One input line as loaded by validation: ``request`` to send, or the ``record`` of an error."""

    line_no: int
    custom_id: str | None
    request: dict[str, Any] | None = None
    record: bytes | None = None


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a database written by an older agentd up to :data:`SCHEMA_VERSION` (one transaction).

    Version 1 -> 2: an ``owner`` column on ``files`` and ``batches`` (NULL for existing rows: they
    were created without keys and stay visible when keys are off)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table in ("files", "batches"):
            columns = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})")}
            if "owner" not in columns:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _owned(owner: str | None, column: str = "owner") -> tuple[str, tuple[Any, ...]]:
    """SQL condition and arguments restricting a query to ``owner``'s rows (none without keys)."""
    return ("1 = 1", ()) if owner is None else (f"{column} = ?", (owner,))


PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def create_private(path: Path) -> None:
    """Create the database's directory (``0700``) and an empty database file (``0600``) unless they
    exist: the database holds every tenant's prompts and answers, so no other local user may read
    it (docs/operations.md §10.5).  SQLite gives its ``-wal`` and ``-shm`` files the database file's
    mode.  An existing directory or file keeps the permissions the operator gave it."""
    path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class BatchDatabase:
    """Synchronous access to the database; each public method is one transaction."""

    def __init__(self, path: Path, now: Callable[[], float] = time.time) -> None:
        self.path = path
        self._now = now
        create_private(path)
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
        self._lock = threading.Lock()
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.executescript(_SCHEMA)
        _migrate(self._conn)
        self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _ts(self) -> int:
        return int(self._now())

    def _tx(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            return out

    # ---------------------------------------------------------------- files

    def create_file(self, filename: str, purpose: str, content: bytes, owner: str | None = None) -> dict[str, Any]:
        file_id = new_id("file-")
        created = self._ts()

        def tx(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO files (id, purpose, filename, bytes, created_at, content, owner)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (file_id, purpose, filename, len(content), created, content, owner),
            )

        self._tx(tx)
        return _file_object(file_id, purpose, filename, len(content), created)

    def get_file(self, file_id: str, owner: str | None = None) -> dict[str, Any] | None:
        cond, args = _owned(owner)
        with self._lock:
            row = self._conn.execute(
                f"SELECT id, purpose, filename, bytes, created_at FROM files WHERE id = ? AND {cond}", (file_id, *args)
            ).fetchone()
        return None if row is None else _file_object(*row)

    def file_content(self, file_id: str) -> bytes | None:
        with self._lock:
            row = self._conn.execute("SELECT content FROM files WHERE id = ?", (file_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def read_file_chunk(self, file_id: str, offset: int, size: int, owner: str | None = None) -> bytes | None:
        """``size`` bytes of a file's content from ``offset`` (b"" past the end); None if unknown."""
        cond, args = _owned(owner)
        with self._lock:
            row = self._conn.execute(f"SELECT rowid FROM files WHERE id = ? AND {cond}", (file_id, *args)).fetchone()
            if row is None:
                return None
            with self._conn.blobopen("files", "content", row[0], readonly=True) as blob:
                blob.seek(min(offset, len(blob)))
                return blob.read(size)

    def list_files(
        self,
        purpose: str | None,
        limit: int,
        owner: str | None = None,
        *,
        after: str | None = None,
        ascending: bool = False,
    ) -> tuple[list[dict[str, Any]], bool] | None:
        """A page of files, newest first (oldest first with ``ascending``), optionally of one
        purpose, and whether more follow.  ``after`` is the id of the last file of the previous page
        (OpenAI's cursor); a file deleted since still works as one (``deleted_files``), so deleting
        each file of a page before asking for the next one does not break the listing.  None when
        ``after`` names no file of ``owner``'s."""
        cond, owner_args = _owned(owner)
        query = f"SELECT id, purpose, filename, bytes, created_at FROM files WHERE {cond}"
        args = owner_args
        if purpose is not None:
            query += " AND purpose = ?"
            args = (*args, purpose)
        with self._lock:
            if after is not None:
                found = self._conn.execute(
                    f"SELECT rowid FROM files WHERE id = ? AND {cond}"
                    f" UNION ALL SELECT file_rowid FROM deleted_files WHERE id = ? AND {cond}",
                    (after, *owner_args, after, *owner_args),
                ).fetchone()
                if found is None:
                    return None
                query += " AND rowid > ?" if ascending else " AND rowid < ?"
                args = (*args, found[0])
            order = "ASC" if ascending else "DESC"
            rows = self._conn.execute(query + f" ORDER BY rowid {order} LIMIT ?", (*args, limit + 1)).fetchall()
        return [_file_object(*r) for r in rows[:limit]], len(rows) > limit

    def delete_file(self, file_id: str, owner: str | None = None) -> bool:
        cond, args = _owned(owner)

        def tx(c: sqlite3.Connection) -> bool:
            row = c.execute(f"SELECT rowid, owner FROM files WHERE id = ? AND {cond}", (file_id, *args)).fetchone()
            if row is None:
                return False
            c.execute("DELETE FROM files WHERE rowid = ?", (row[0],))
            # kept so that the id still works as a list cursor (``after``) once the file is gone
            c.execute("INSERT OR REPLACE INTO deleted_files (id, file_rowid, owner) VALUES (?, ?, ?)", (file_id, *row))
            return True

        return bool(self._tx(tx))

    # ---------------------------------------------------------------- batches

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: Mapping[str, str] | None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        batch_id = new_id("batch_")
        created = self._ts()

        def tx(c: sqlite3.Connection) -> None:
            c.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, metadata, created_at,"
                " expires_at, owner) VALUES (?, ?, ?, ?, 'validating', ?, ?, ?, ?)",
                (
                    batch_id,
                    endpoint,
                    input_file_id,
                    completion_window,
                    None if metadata is None else json.dumps(dict(metadata)),
                    created,
                    created + COMPLETION_WINDOW_SECONDS,
                    owner,
                ),
            )

        self._tx(tx)
        batch = self.get_batch(batch_id)
        assert batch is not None
        return batch

    def get_batch(self, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
        cond, args = _owned(owner)
        with self._lock:
            cur = self._conn.execute(f"SELECT * FROM batches WHERE id = ? AND {cond}", (batch_id, *args))
            row = cur.fetchone()
            names = [d[0] for d in cur.description]
        return None if row is None else _batch_object(dict(zip(names, row, strict=True)))

    def list_batches(
        self, limit: int, after: str | None, owner: str | None = None
    ) -> tuple[list[dict[str, Any]], bool] | None:
        """Newest first; ``after`` is the id of the last batch of the previous page (None if unknown)."""
        cond, args = _owned(owner)
        with self._lock:
            before = 1 << 62
            if after is not None:
                row = self._conn.execute(f"SELECT seq FROM batches WHERE id = ? AND {cond}", (after, *args)).fetchone()
                if row is None:
                    return None
                before = row[0]
            cur = self._conn.execute(
                f"SELECT * FROM batches WHERE seq < ? AND {cond} ORDER BY seq DESC LIMIT ?", (before, *args, limit + 1)
            )
            rows = cur.fetchall()
            names = [d[0] for d in cur.description]
        items = [_batch_object(dict(zip(names, r, strict=True))) for r in rows[:limit]]
        return items, len(rows) > limit

    def owner(self, batch_id: str) -> str | None:
        """The tenant that created a batch (None: created without keys, or unknown)."""
        with self._lock:
            row = self._conn.execute("SELECT owner FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def status(self, batch_id: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else str(row[0])

    def active_batches(self) -> list[tuple[str, str]]:
        """``(id, status)`` of every batch the executor still has to work on, oldest first."""
        marks = ",".join("?" * len(ACTIVE))
        with self._lock:
            rows = self._conn.execute(
                f"SELECT id, status FROM batches WHERE status IN ({marks}) ORDER BY seq", ACTIVE
            ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def status_counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute("SELECT status, COUNT(*) FROM batches GROUP BY status").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def transition(self, batch_id: str, to: str) -> bool:
        """Move a batch to ``to`` if its status allows it (:data:`TRANSITIONS`); False otherwise."""
        return bool(self._tx(lambda c: self._move(c, batch_id, to)))

    def _move(self, c: sqlite3.Connection, batch_id: str, to: str, **extra: Any) -> bool:
        sources = TRANSITIONS[to]
        sets = ", ".join(["status = ?", f"{_TIME_COLUMN[to]} = ?", *(f"{k} = ?" for k in extra)])
        marks = ",".join("?" * len(sources))
        cur = c.execute(
            f"UPDATE batches SET {sets} WHERE id = ? AND status IN ({marks})",
            (to, self._ts(), *extra.values(), batch_id, *sources),
        )
        return cur.rowcount == 1

    def request_cancel(self, batch_id: str) -> bool:
        return self.transition(batch_id, "cancelling")

    def fail_batch(self, batch_id: str, errors: Sequence[Mapping[str, Any]]) -> bool:
        """validating -> failed with OpenAI's ``errors`` list (the first :data:`MAX_BATCH_ERRORS`)."""
        payload = json.dumps({"object": "list", "data": [dict(e) for e in errors[:MAX_BATCH_ERRORS]]})
        return bool(self._tx(lambda c: self._move(c, batch_id, "failed", errors=payload)))

    def start_batch(self, batch_id: str, rows: Iterable[LineRow], errors: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Validation done: store every line (error lines already answered) and move to in_progress.

        One transaction: a crash before it commits leaves the batch ``validating`` with no lines (it
        is validated again); after it, the lines exist exactly once.  If the batch was cancelled
        meanwhile the lines are stored and the status stays ``cancelling``.  False if the batch is
        no longer validating or cancelling (nothing is written).
        """

        def tx(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row[0] not in ("validating", "cancelling"):
                return False
            if c.execute("SELECT 1 FROM batch_lines WHERE batch_id = ? LIMIT 1", (batch_id,)).fetchone():
                return False  # already loaded (validation ran before the batch was cancelled)
            total = failed = 0
            for r in rows:
                total += 1
                failed += r.record is not None
                c.execute(
                    "INSERT INTO batch_lines (batch_id, line_no, custom_id, request, done, ok, record)"
                    " VALUES (?, ?, ?, ?, ?, 0, ?)",
                    (
                        batch_id,
                        r.line_no,
                        r.custom_id,
                        None if r.request is None else json.dumps(r.request),
                        int(r.record is not None),
                        r.record,
                    ),
                )
            payload = json.dumps({"object": "list", "data": [dict(e) for e in errors[:MAX_BATCH_ERRORS]]})
            c.execute(
                "UPDATE batches SET total = ?, failed = ?, errors = ? WHERE id = ?",
                (total, failed, payload if errors else None, batch_id),
            )
            if row[0] == "validating":
                self._move(c, batch_id, "in_progress")
            return True

        return bool(self._tx(tx))

    def pending_lines(self, batch_id: str, after_line: int, limit: int) -> list[PendingLine]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT line_no, custom_id, request FROM batch_lines"
                " WHERE batch_id = ? AND done = 0 AND line_no > ? ORDER BY line_no LIMIT ?",
                (batch_id, after_line, limit),
            ).fetchall()
        return [PendingLine(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]

    def line_counts(self, batch_id: str) -> tuple[int, int]:
        """``(done, total)`` lines of a batch."""
        with self._lock:
            row = self._conn.execute(
                "SELECT COALESCE(SUM(done), 0), COUNT(*) FROM batch_lines WHERE batch_id = ?", (batch_id,)
            ).fetchone()
        return int(row[0]), int(row[1])

    def commit_result(self, batch_id: str, line_no: int, record: bytes, ok: bool) -> bool:
        """Commit one line's output record; True if it was newly answered, False if it already was."""

        def tx(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "UPDATE batch_lines SET done = 1, ok = ?, record = ? WHERE batch_id = ? AND line_no = ? AND done = 0",
                (int(ok), record, batch_id, line_no),
            )
            if cur.rowcount != 1:
                return False
            column = "completed" if ok else "failed"
            c.execute(f"UPDATE batches SET {column} = {column} + 1 WHERE id = ?", (batch_id,))
            return True

        return bool(self._tx(tx))

    def finalize(self, batch_id: str, to: str) -> bool:
        """Write the output and error files from the answered lines (input order) and move the batch
        from finalizing to completed or from cancelling to cancelled, in one transaction."""

        def tx(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row[0] not in TRANSITIONS[to]:
                return False
            outputs: list[bytes] = []
            errors: list[bytes] = []
            for ok, record in c.execute(
                "SELECT ok, record FROM batch_lines WHERE batch_id = ? AND done = 1 ORDER BY line_no", (batch_id,)
            ):
                (outputs if ok else errors).append(bytes(record))
            created = self._ts()
            ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
            for key, kind, lines in (("output_file_id", "output", outputs), ("error_file_id", "error", errors)):
                if not lines:
                    continue
                file_id = new_id("file-")
                content = b"".join(lines)
                c.execute(
                    "INSERT INTO files (id, purpose, filename, bytes, created_at, content, owner)"
                    " SELECT ?, ?, ?, ?, ?, ?, owner FROM batches WHERE id = ?",
                    (file_id, f"batch_{kind}", f"{batch_id}_{kind}.jsonl", len(content), created, content, batch_id),
                )
                ids[key] = file_id
            return self._move(c, batch_id, to, **ids)

        return bool(self._tx(tx))


def _file_object(file_id: str, purpose: str, filename: str, size: int, created_at: int) -> dict[str, Any]:
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": created_at,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def _batch_object(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": None if row["errors"] is None else json.loads(row["errors"]),
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        "created_at": row["created_at"],
        "in_progress_at": row["in_progress_at"],
        "expires_at": row["expires_at"],
        "finalizing_at": row["finalizing_at"],
        "completed_at": row["completed_at"],
        "failed_at": row["failed_at"],
        "expired_at": row["expired_at"],
        "cancelling_at": row["cancelling_at"],
        "cancelled_at": row["cancelled_at"],
        "request_counts": {"total": row["total"], "completed": row["completed"], "failed": row["failed"]},
        "metadata": None if row["metadata"] is None else json.loads(row["metadata"]),
    }


P = ParamSpec("P")
T = TypeVar("T")


class BatchStore:
    """The database seen from Trio: ``await store.call(store.db.method, *args)`` runs the method on a
    worker thread, one call at a time."""

    def __init__(self, db: BatchDatabase) -> None:
        self.db = db
        self._limiter = trio.CapacityLimiter(1)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        def run() -> T:
            return fn(*args, **kwargs)

        return await trio.to_thread.run_sync(run, limiter=self._limiter)
