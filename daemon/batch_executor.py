"""The Batch API's executor: a Trio actor that runs every active batch through the daemon's own proxy.

:class:`BatchService` is what the HTTP routes and the executor share: the configuration, the store
(the SQLite database is opened on first use, or at start when it already exists, so a daemon that
never uses the Batch API creates no database; the executor holds a lock beside it,
daemon/batch_lock.py), a wake-up event (a batch was created or cancelled) and a
change event (a batch's status changed; tests wait on it instead of sleeping).

:func:`run_batch_executor` (started by the supervisor, stopped with it) keeps one task per active
batch (docs/batch.md §4):

1. ``validating``: parse the input file line by line (``daemon.batchfile``); malformed and duplicate
   lines become error records at once; store every line and move to ``in_progress`` in one
   transaction (or ``failed`` when no line is valid).
2. ``in_progress``: send each unanswered line through ``ProxyEngine.build_request`` + ``handle``
   with a :class:`~daemon.http.proxy.CollectingSink` (no HTTP loopback), at most
   ``batch_api.concurrency`` at a time over all batches, with the batch-class headers of
   ``batchfile.request_headers`` (job name = the batch id unless the custom_id carries a job tag).
   Each answer is committed in its own transaction before it counts; a 429/502/503/504 answer is
   retried a few times first, and while no worker is in rotation (agentd's own 503) a line waits
   for one without a limit (:data:`NO_TARGET_CODES`).  Lines unanswered when the daemon stopped (in
   flight or not yet sent) are sent again on the next start: at-least-once to the workers, exactly
   once in the output.
   With API keys configured each line runs as the batch's owner (the tenant that created it,
   ``principal=`` of ``build_request``): tenant fairness and tenant-scoped Program ids apply to
   it as to that tenant's own HTTP requests (docs/batch.md §4).
3. ``finalizing``: output and error files in input order, ``completed``.
4. ``cancelling``: no new line is sent, in-flight ones are abandoned (not in the output), the
   answered ones go into the partial output files, ``cancelled``.
"""

from __future__ import annotations

import io
import json
import logging
import math
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import attrs
import trio

from actors.logevents import get_logger, log_event
from daemon import batchfile
from daemon.batch_lock import BatchDatabaseLock
from daemon.batch_store import TERMINAL, BatchDatabase, BatchStore, LineRow, PendingLine, new_id
from daemon.config import BatchApiConfig
from daemon.http.errors import ApiError
from daemon.http.proxy import CollectingSink, ProxyEngine
from daemon.http.requests import ENDPOINTS
from daemon.metrics import BatchApiMetrics

logger = get_logger("batch_api")
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_ATTEMPTS = 4
RETRY_BASE_SECONDS = 1.0  # waits 1, 2, 4 s between attempts unless the answer has a Retry-After
MAX_RETRY_WAIT_SECONDS = 30.0
# agentd's own 503s when no worker is in rotation (native and scheduled paths): the line waits for
# one, without an attempt limit, instead of failing (docs/batch.md §4, "How a batch runs")
NO_TARGET_CODES = frozenset({"no_healthy_target", "no_targets"})
NO_TARGET_MAX_WAIT_SECONDS = 5.0  # the longest wait between two tries of a line waiting for a worker
PENDING_PAGE = 256  # lines read from the database per query


class BatchService:
    """Shared by the routes and the executor (see the module docstring)."""

    def __init__(self, cfg: BatchApiConfig, metrics: BatchApiMetrics, now: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.path = cfg.resolved_database_path()
        self._now = now
        self._store: BatchStore | None = None
        self._opening = trio.Lock()
        self._wake = trio.Event()
        self._changed = trio.Event()
        # a graceful stop began: no new line is sent, the lines in flight get the drain's grace
        # (docs/batch.md, "How a batch runs"); the lines in flight and an event set when there are none
        self.stopping = trio.Event()
        self._lines_in_flight = 0
        self._lines_idle = trio.Event()
        self._lines_idle.set()

    @property
    def opened(self) -> bool:
        return self._store is not None

    async def store(self) -> BatchStore:
        """The store, opening (and creating) the database on first use."""
        async with self._opening:
            if self._store is None:
                try:
                    db = await trio.to_thread.run_sync(BatchDatabase, self.path, self._now)
                except (OSError, sqlite3.Error) as exc:
                    # the database cannot be created or opened (agentd start checks the path first,
                    # docs/config.md; this is what is left: a directory removed or made read-only
                    # later, a full disk): the client gets why, not a 500 internal_error
                    log_event(
                        logger, logging.WARNING, "batch_api_database_unavailable", path=str(self.path), error=repr(exc)
                    )
                    raise ApiError(
                        503,
                        f"the Batch API's database cannot be opened (batch_api.database_path {str(self.path)!r}: "
                        f"{getattr(exc, 'strerror', None) or exc})",
                        code="batch_database_unavailable",
                        error_type="server_error",
                    ) from None
                self._store = BatchStore(db)
                log_event(logger, logging.INFO, "batch_api_database_opened", path=str(self.path))
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.db.close()
            self._store = None

    def wake(self) -> None:
        """A batch was created or cancelled: the executor looks at the database again."""
        self._wake.set()

    def line_started(self) -> None:
        self._lines_in_flight += 1
        if self._lines_in_flight == 1:
            self._lines_idle = trio.Event()

    def line_ended(self) -> None:
        self._lines_in_flight -= 1
        if self._lines_in_flight == 0:
            self._lines_idle.set()

    async def drain(self, shutdown: trio.Event, grace_seconds: float) -> None:
        """On ``shutdown``: send no new line and wait up to ``grace_seconds`` for the lines in flight
        to be answered and recorded, as the HTTP drain waits for clients' requests (docs/operations.md
        §10.4); what is still running then is cut with the daemon and sent again by its next start."""
        await shutdown.wait()
        self.stopping.set()
        with trio.move_on_after(grace_seconds):
            await self._lines_idle.wait()

    async def wait_wake(self) -> None:
        await self._wake.wait()
        self._wake = trio.Event()

    async def status_changed(self) -> None:
        """Record a status change: refresh the gauge and wake whoever waits in :meth:`wait_settled`."""
        store = await self.store()
        self.metrics.set_statuses(await store.call(store.db.status_counts))
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_settled(self, batch_id: str) -> dict[str, Any]:
        """Wait until a batch reaches a terminal status; return it."""
        store = await self.store()
        while True:
            changed = self._changed
            batch = await store.call(store.db.get_batch, batch_id)
            if batch is None:
                raise KeyError(batch_id)
            if batch["status"] in TERMINAL:
                return batch
            await changed.wait()


class _Stopped(Exception):
    """A line's wait before trying again ended because the daemon is stopping."""


@attrs.define(eq=False)
class _Run:
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


class BatchExecutor:
    def __init__(self, service: BatchService, engine: ProxyEngine) -> None:
        self.service = service
        self.engine = engine
        self.slots = trio.Semaphore(service.cfg.concurrency)
        self.runs: dict[str, _Run] = {}
        self._first_scan = True  # batches found by the first scan of an existing database are resumed
        # one validation at a time: each holds its whole input file and the lines parsed from it
        # (about 3x the file), so N batches created at once over one 200 MiB file held N times
        # that (docs/operations.md §14)
        self._validation = trio.Lock()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        service = self.service
        lock = BatchDatabaseLock(service.path)
        lock.acquire()  # one daemon per database, before anything is resumed (daemon/batch_lock.py)
        try:
            self._first_scan = service.path.exists()
            if self._first_scan:
                await service.status_changed()  # opens it; sets the gauge
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    if service.opened:
                        await self._scan(nursery)
                    await service.wait_wake()
        finally:
            service.close()
            lock.release()

    async def _scan(self, nursery: trio.Nursery) -> None:
        store = await self.service.store()
        resumed = self._first_scan
        self._first_scan = False
        for batch_id, status in await store.call(store.db.active_batches):
            run = self.runs.get(batch_id)
            if run is None:
                run = self.runs[batch_id] = _Run()
                nursery.start_soon(self._run_batch, batch_id, run, resumed)
            elif status == "cancelling":
                run.scope.cancel()

    async def _run_batch(self, batch_id: str, run: _Run, resumed: bool) -> None:
        try:
            await self._drive(batch_id, run, resumed)
        finally:
            del self.runs[batch_id]

    async def _drive(self, batch_id: str, run: _Run, resumed: bool) -> None:
        service = self.service
        store = await service.store()
        db = store.db
        status = await store.call(db.status, batch_id)
        resumed = resumed and status != "validating"
        if status == "validating":
            await self._validate(store, batch_id)
            await service.status_changed()
            status = await store.call(db.status, batch_id)
        if status == "in_progress":
            if resumed:
                done, total = await store.call(db.line_counts, batch_id)
                log_event(logger, logging.INFO, "batch_resumed", batch_id=batch_id, done=done, total=total)
            sent = False
            with run.scope:
                sent = await self._send_all(store, batch_id)
            if not sent and not run.scope.cancelled_caught:
                return  # the daemon is stopping: its next start sends the rest (docs/batch.md)
            if await store.call(db.transition, batch_id, "finalizing"):
                await service.status_changed()
            status = await store.call(db.status, batch_id)
        if status == "finalizing":
            await store.call(db.finalize, batch_id, "completed")
            await service.status_changed()
            batch = await store.call(db.get_batch, batch_id)
            assert batch is not None
            log_event(
                logger,
                logging.INFO,
                "batch_completed",
                batch_id=batch_id,
                total=batch["request_counts"]["total"],
                completed=batch["request_counts"]["completed"],
                failed=batch["request_counts"]["failed"],
                output_file_id=batch["output_file_id"],
                error_file_id=batch["error_file_id"],
            )
        elif status == "cancelling":
            await store.call(db.finalize, batch_id, "cancelled")
            await service.status_changed()
            log_event(logger, logging.INFO, "batch_cancelled", batch_id=batch_id)

    # ---------------------------------------------------------------- validation

    async def _validate(self, store: BatchStore, batch_id: str) -> None:
        async with self._validation:
            batch = await store.call(store.db.get_batch, batch_id)
            assert batch is not None
            if batch["status"] != "validating":  # cancelled while it waited: nothing to load
                return
            await self._validate_file(store, batch_id, batch)

    async def _validate_file(self, store: BatchStore, batch_id: str, batch: dict[str, Any]) -> None:
        content = await store.call(store.db.file_content, batch["input_file_id"])
        if content is None:
            await store.call(
                store.db.fail_batch,
                batch_id,
                [_batch_error("file_not_found", f"input file {batch['input_file_id']} no longer exists", None)],
            )
            log_event(logger, logging.INFO, "batch_failed", batch_id=batch_id, reason="input file deleted")
            return
        max_lines = self.service.cfg.max_lines
        rows, errors = await trio.to_thread.run_sync(_parse_input, content, batch["endpoint"], max_lines)
        valid = sum(r.request is not None for r in rows)
        if valid == 0:
            if not rows:
                errors = [_batch_error("empty_file", "the input file has no request lines", None)]
            await store.call(store.db.fail_batch, batch_id, errors)
            log_event(logger, logging.INFO, "batch_failed", batch_id=batch_id, reason="no valid line", lines=len(rows))
            return
        await store.call(store.db.start_batch, batch_id, rows, errors)
        invalid = len(rows) - valid
        if invalid:
            self.service.metrics.requests.labels("invalid").inc(invalid)

    # ---------------------------------------------------------------- sending

    async def _send_all(self, store: BatchStore, batch_id: str) -> bool:
        """Send every pending line; False when the daemon began stopping first (lines stay pending)."""
        owner = await store.call(store.db.owner, batch_id)
        stopping = self.service.stopping
        after = 0
        async with trio.open_nursery() as nursery:
            while not stopping.is_set():
                page = await store.call(store.db.pending_lines, batch_id, after, PENDING_PAGE)
                if not page:
                    return True
                for line in page:
                    await self.slots.acquire()
                    if stopping.is_set():
                        self.slots.release()
                        break
                    self.service.line_started()
                    nursery.start_soon(self._send_one, store, batch_id, line, owner)
                after = page[-1].line_no
        return False

    async def _send_one(self, store: BatchStore, batch_id: str, line: PendingLine, owner: str | None) -> None:
        try:
            record, ok = await self._answer(batch_id, line, owner)
            if await store.call(store.db.commit_result, batch_id, line.line_no, batchfile.encode_record(record), ok):
                self.service.metrics.requests.labels("succeeded" if ok else "failed").inc()
        except _Stopped:
            pass  # the daemon is stopping during a wait: the line stays pending for the next start
        finally:
            self.slots.release()
            self.service.line_ended()

    async def _pause(self, seconds: float) -> None:
        """Sleep before trying a line again, unless the daemon begins stopping (:class:`_Stopped`)."""
        stopping = self.service.stopping
        with trio.move_on_after(seconds):
            await stopping.wait()
        if stopping.is_set():
            raise _Stopped

    async def _answer(self, batch_id: str, line: PendingLine, owner: str | None) -> tuple[dict[str, Any], bool]:
        url = line.request["url"]
        body = line.request["body"]
        parsed = batchfile.BatchLine(line.line_no, line.custom_id, "POST", url, body)
        headers = batchfile.request_headers(parsed, job_name=batch_id)
        raw = json.dumps(body).encode()
        request_id = headers.get("x-request-id", str(body.get("request_id")))
        attempts = waits = 0
        while True:
            status, answer, retry_after = await self._send(ENDPOINTS[url], raw, headers, owner)
            if status == 503 and _error_code(answer, status) in NO_TARGET_CODES:
                # no worker in rotation (restarting, recovering, all ejected): nothing was sent, so
                # the line waits for one however long it takes, trying again after 1, 2, 4 s, then
                # every 5 s (the 503's Retry-After is for clients); cancelling the batch or stopping
                # the daemon ends the wait, and the line stays pending
                waits += 1
                await self._pause(min(RETRY_BASE_SECONDS * 2.0 ** min(waits - 1, 8), NO_TARGET_MAX_WAIT_SECONDS))
                continue
            attempts += 1
            if status not in RETRY_STATUSES or attempts >= MAX_ATTEMPTS:
                break
            wait = RETRY_BASE_SECONDS * 2.0 ** (attempts - 1)
            await self._pause(min(wait if retry_after is None else retry_after, MAX_RETRY_WAIT_SECONDS))
        ok = 200 <= status < 300
        record = batchfile.output_record(
            line.custom_id,
            status_code=status,
            body=answer,
            request_id=request_id,
            error=None if ok else (_error_code(answer, status), _error_message(answer, status)),
            record_id=new_id("batch_req_"),
        )
        return record, ok

    async def _send(
        self, endpoint: str, raw: bytes, headers: dict[str, str], owner: str | None
    ) -> tuple[int, Any, float | None]:
        """One request through the proxy as ``owner``: ``(status, JSON body or text, Retry-After seconds)``."""
        try:
            req = self.engine.build_request(endpoint, raw, headers, principal=owner, origin="batch_api")
        except ApiError as error:
            return error.status, json.loads(error.body()), None
        sink = CollectingSink()
        try:
            await self.engine.handle(req, sink, raw_body=raw)
        except Exception as exc:  # a bug below: the line fails with a 500 record, the daemon keeps going
            logger.error(
                "batch request failed",
                exc_info=exc,
                extra={"agentd_event": "internal_error", "agentd_fields": {"request_id": req.request_id}},
            )
            internal = ApiError(500, "internal error in agentd (see the daemon log)", code="internal_error")
            return 500, json.loads(internal.body()), None
        retry_after = None
        for name, value in sink.headers:
            if name.lower() == "retry-after":
                retry_after = _seconds(value)
        try:
            answer: Any = json.loads(sink.body, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            answer = sink.body.decode("utf-8", "replace")
        return sink.status or 502, answer, retry_after


def _parse_input(content: bytes, endpoint: str, max_lines: int) -> tuple[list[LineRow], list[dict[str, Any]]]:
    """Every non-blank line -> a row to send or an error row; the batch's ``errors`` entries."""
    rows: list[LineRow] = []
    errors: list[dict[str, Any]] = []
    for item in batchfile.without_duplicates(batchfile.iter_lines(io.BytesIO(content))):
        if isinstance(item, batchfile.BatchLine) and item.url != endpoint:
            item = batchfile.LineError(
                item.line_number,
                item.custom_id,
                batchfile.INVALID_REQUEST,
                f"line {item.line_number}: url: must be the batch's endpoint {endpoint} (got {item.url})",
            )
        if len(rows) >= max_lines:
            item = batchfile.LineError(
                item.line_number,
                item.custom_id,
                "too_many_lines",
                f"line {item.line_number}: over the limit of {max_lines} lines (batch_api.max_lines)",
            )
        if isinstance(item, batchfile.LineError):
            record = batchfile.error_record(item, new_id("batch_req_"))
            rows.append(LineRow(item.line_number, item.custom_id, None, batchfile.encode_record(record)))
            errors.append(_batch_error(item.code, item.message, _param(item.message), item.line_number))
        else:
            rows.append(LineRow(item.line_number, item.custom_id, {"url": item.url, "body": item.body}))
    return rows, errors


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN/Infinity: keep the answer as text


def _param(message: str) -> str | None:
    """The field a line error names (``line N: field: problem``), if any."""
    parts = message.split(": ", 2)
    return parts[1] if len(parts) == 3 and " " not in parts[1] else None


def _batch_error(code: str, message: str, param: str | None, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _error_code(answer: Any, status: int) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        code = answer["error"].get("code")
        if isinstance(code, str) and code:
            return code
    return f"http_{status}"


def _error_message(answer: Any, status: int) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        message = answer["error"].get("message")
        if isinstance(message, str) and message:
            return message
    return f"the request failed with HTTP {status}"


def _seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


async def run_batch_executor(
    service: BatchService, engine: ProxyEngine, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """The executor actor (see the module docstring); ready once an existing database is resumed."""
    await BatchExecutor(service, engine).run(task_status=task_status)
