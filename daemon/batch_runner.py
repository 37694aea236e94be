"""The engine of ``agentd batch``: send a batch file's lines to an OpenAI-compatible server (docs/batch.md §3).

One producer reads the input line by line (:func:`daemon.batchfile.iter_lines`, duplicates filtered)
and hands valid lines through an unbuffered channel to sender tasks, started as lines need them up
to ``concurrency``, so at most ``concurrency`` requests are in flight and about as many lines are in
memory.  Malformed and
duplicate lines are answered at once with an ``error`` record.  Each sender posts its line with the
batch headers (:func:`daemon.batchfile.request_headers`), retries transport errors and 429/502/503/504
answers a few times with back-off, and appends exactly one record per line
(:class:`daemon.batch_output.OutputWriter`).  Lines already answered in the output file are skipped
(:func:`daemon.batch_output.scan_output`).

Stopping (:meth:`BatchRunner.request_stop`): no new line is sent; with ``cancel_in_flight`` the
requests in flight are cancelled too (their lines have no record and are sent by the next run).
A record is written synchronously after its whole response has been read, so a cancellation never
splits it.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, TextIO

import httpx
import trio
from attrs import define, field, frozen

from daemon.batch_output import OutputWriter, Resumed, line_record_id, scan_output
from daemon.batch_progress import BatchProgress
from daemon.batchfile import (
    MAX_LINE_BYTES,
    BatchLine,
    LineError,
    error_record,
    iter_lines,
    output_record,
    request_headers,
    without_duplicates,
)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS = 60.0


@frozen
class BatchOptions:
    input_path: Path
    output_path: Path
    concurrency: int = 16
    restart: bool = False
    retry_failed: bool = False  # drop the output's non-2xx records first, so those lines are sent again
    max_attempts: int = 3  # per line: 1 + retries of transport errors and RETRY_STATUSES
    retry_backoff_seconds: float = 1.0  # doubled each retry; Retry-After wins when given (capped)
    fsync_every: int = 64
    api_key: str | None = None
    progress_interval_seconds: float | None = None  # None: 0.25 s on a TTY, 10 s otherwise


@define
class BatchSummary:
    total: int = 0  # non-blank input lines
    resumed: int = 0  # input lines answered by a previous run (any outcome), skipped
    ok: int = 0  # 2xx this run
    failed: int = 0  # non-2xx answers and transport errors this run
    malformed: int = 0  # invalid or duplicate lines recorded this run
    prior_failed: int = 0  # failed records (non-2xx, transport error) already in the output
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_seconds: float = 0.0
    stopped: bool = False  # interrupted before every line was answered
    truncated_bytes: int = 0
    # this run's failures by cause: ``http_<status>`` (with the error body's code when it has
    # one, ``http_401/invalid_api_key``), ``connection_error`` or ``timeout``
    causes: dict[str, int] = field(factory=dict)

    def count_failure(self, cause: str) -> None:
        self.failed += 1
        self.causes[cause] = self.causes.get(cause, 0) + 1

    @property
    def answered(self) -> int:
        return self.resumed + self.ok + self.failed + self.malformed

    @property
    def exit_code(self) -> int:
        """0 when every valid line has a 2xx record (this run or a previous one), else 1."""
        return 0 if not self.stopped and self.failed == 0 and self.prior_failed == 0 else 1

    def text(self) -> str:
        rate = self.completion_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0
        parts = [
            f"{self.total} lines: {self.ok} ok, {self.failed} failed{self._causes_text()}, {self.malformed} malformed",
            f"{self.resumed} already in the output ({self.prior_failed} of them failed"
            + ("; --retry-failed sends them again)" if self.prior_failed else ")")
            if self.resumed
            else "",
            f"tokens {self.prompt_tokens} prompt / {self.completion_tokens} completion ({rate:.0f} completion tok/s)",
            f"wall {self.wall_seconds:.1f}s",
        ]
        return "; ".join(p for p in parts if p)

    def _causes_text(self) -> str:
        """`` (http_401/invalid_api_key: 3)``: why this run's lines failed (the summary said only how
        many, and every record had to be opened to learn that the target wanted an API key)."""
        if not self.causes:
            return ""
        return " (" + ", ".join(f"{cause}: {n}" for cause, n in sorted(self.causes.items())) + ")"


def count_lines(path: Path) -> int:
    """Non-blank lines of the input, streamed (the progress bar's total); a line over the limit
    counts whatever it holds, as the run reports it malformed (a long run of spaces too)."""
    count = 0
    with open(path, "rb") as f:
        while chunk := f.readline(MAX_LINE_BYTES + 1):
            if (chunk.strip() and chunk.strip() != b"\xef\xbb\xbf") or len(chunk) > MAX_LINE_BYTES:
                count += 1
            while len(chunk) > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
                chunk = f.readline(MAX_LINE_BYTES + 1)
                if not chunk:
                    break
    return count


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def _failure_cause(status: int, body: Any) -> str:
    """``http_<status>``, with the OpenAI error body's ``code`` when it is a short token."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, str) and 0 < len(code) <= 64 and code.isascii() and code.isprintable() and " " not in code:
        return f"http_{status}/{code}"
    return f"http_{status}"


def _usage_tokens(body: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a chat/completions or responses answer (0 when absent)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0

    def num(*keys: str) -> int:
        for key in keys:
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
        return 0

    return num("prompt_tokens", "input_tokens"), num("completion_tokens", "output_tokens")


def _retry_after(response: httpx.Response) -> float | None:
    try:
        value = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return min(value, MAX_RETRY_AFTER_SECONDS) if math.isfinite(value) and value >= 0 else None


def target_base(url: str) -> str:
    """The server root from a ``--target``: a trailing ``/`` or ``/v1`` (the OpenAI SDK's base URL) is dropped."""
    base = url.rstrip("/")
    return base.removesuffix("/v1")


class BatchRunner:
    def __init__(
        self,
        opts: BatchOptions,
        client: httpx.AsyncClient,
        base_url: str,
        *,
        stderr: TextIO | None = None,
        is_tty: bool | None = None,
    ) -> None:
        self.opts = opts
        self.client = client
        self.base_url = target_base(base_url)
        self.stderr = stderr if stderr is not None else sys.stderr
        self.is_tty = self.stderr.isatty() if is_tty is None else is_tty
        self.summary = BatchSummary()
        self.in_flight = 0
        self._started = 0  # sender tasks started (at most opts.concurrency)
        self._busy = 0  # lines handed to a sender and not yet written
        self._senders: trio.Nursery | None = None
        self._recv: trio.MemoryReceiveChannel[BatchLine] | None = None
        self._producer_scope = trio.CancelScope()
        self._senders_scope = trio.CancelScope()
        self._writer: OutputWriter | None = None
        self._progress = BatchProgress(self, self.stderr, tty=False, interval=None)

    # -- control -------------------------------------------------------------------------------------

    def request_stop(self, *, cancel_in_flight: bool = False) -> None:
        """Send no new line; with ``cancel_in_flight`` also abandon the requests in flight."""
        self.summary.stopped = True
        self._producer_scope.cancel()
        if cancel_in_flight:
            self._senders_scope.cancel()

    # -- the run -------------------------------------------------------------------------------------

    async def run(self, resumed: Resumed | None = None) -> BatchSummary:
        """Answer every line not yet in the output.  ``resumed``: the output file already scanned
        (:func:`daemon.batch_output.scan_output`); scanned here when None (ignored with ``restart``)."""
        opts = self.opts
        s = self.summary
        start = trio.current_time()
        if opts.restart:
            resumed = Resumed(set(), set())
        elif resumed is None:
            resumed = scan_output(opts.output_path, drop_failed=opts.retry_failed)
        s.prior_failed = resumed.failed
        s.truncated_bytes = resumed.truncated_bytes
        s.total = count_lines(opts.input_path)
        self._writer = OutputWriter(opts.output_path, fsync_every=opts.fsync_every, truncate=opts.restart)
        progress = self._progress = BatchProgress(
            self, self.stderr, tty=self.is_tty, interval=opts.progress_interval_seconds
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(progress.run)
                send, recv = trio.open_memory_channel[BatchLine](0)
                with self._senders_scope:
                    async with trio.open_nursery() as senders:
                        self._senders = senders
                        self._recv = recv
                        try:
                            async with send:
                                with self._producer_scope:
                                    await self._produce(send, resumed)
                        finally:
                            recv.close()
                nursery.cancel_scope.cancel()
        finally:
            self._writer.close()
            s.wall_seconds = trio.current_time() - start
            progress.finish()
        if s.answered < s.total:
            s.stopped = True
        return s

    async def _produce(self, send: trio.MemorySendChannel[BatchLine], resumed: Resumed) -> None:
        assert self._writer is not None
        lines = iter_lines(self.opts.input_path)
        with closing(lines):  # closes the input when the producer is cancelled (a stop)
            await self._produce_from(lines, send, resumed)

    async def _produce_from(
        self, lines: Iterator[BatchLine | LineError], send: trio.MemorySendChannel[BatchLine], resumed: Resumed
    ) -> None:
        assert self._writer is not None
        for n, item in enumerate(without_duplicates(lines)):
            if n % 256 == 255:
                await trio.lowlevel.checkpoint()  # long runs of skipped lines still let progress draw
            if isinstance(item, LineError):
                if item.line_number in resumed.line_numbers:
                    self.summary.resumed += 1
                    continue
                self._progress.message(f"agentd batch: {item.message}")
                self._writer.write(error_record(item, line_record_id(item.line_number)))
                self.summary.malformed += 1
                continue
            if item.custom_id in resumed.custom_ids:
                self.summary.resumed += 1
                continue
            self._ensure_idle_sender()
            await send.send(item)
            self._busy += 1

    def _ensure_idle_sender(self) -> None:
        """Start a sender task when every started one is busy, up to ``concurrency``: senders are
        started as lines need them, not ``concurrency`` of them up front (``--concurrency
        1000000000`` on a 3-line file started a billion tasks and was killed for lack of memory)."""
        if self._busy >= self._started < self.opts.concurrency:
            assert self._senders is not None and self._recv is not None
            self._started += 1
            self._senders.start_soon(self._sender, self._recv.clone())

    async def _sender(self, recv: trio.MemoryReceiveChannel[BatchLine]) -> None:
        assert self._writer is not None
        async with recv:
            async for line in recv:
                self.in_flight += 1
                try:
                    record = await self._answer(line)
                finally:
                    self.in_flight -= 1
                # no checkpoint from here to the write: a cancellation cannot split the record
                self._writer.write(record)
                self._busy -= 1

    async def _answer(self, line: BatchLine) -> dict[str, Any]:
        """POST one line (with retries) and build its output record; updates the counters."""
        opts = self.opts
        headers = request_headers(line)
        if opts.api_key:
            headers["authorization"] = f"Bearer {opts.api_key}"
        content = json.dumps(line.body).encode()
        record_id = f"batch_req_{uuid.uuid4().hex}"
        delay = opts.retry_backoff_seconds
        for attempt in range(1, opts.max_attempts + 1):
            last = attempt == opts.max_attempts
            try:
                response = await self.client.post(self.base_url + line.url, content=content, headers=headers)
            except httpx.RequestError as exc:  # no HTTP answer: connect/read errors, timeouts, a bad encoding
                if last:
                    code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error"
                    self.summary.count_failure(code)
                    message = f"{type(exc).__name__}: {str(exc) or 'no detail'} (after {attempt} attempts)"
                    return output_record(
                        line.custom_id,
                        status_code=None,
                        body=None,
                        request_id=None,
                        error=(code, message),
                        record_id=record_id,
                    )
                await trio.sleep(delay)
                delay *= 2
                continue
            if response.status_code in RETRY_STATUSES and not last:
                wait = _retry_after(response)
                await trio.sleep(delay if wait is None else wait)
                delay *= 2
                continue
            return self._response_record(line, response, record_id)
        raise AssertionError("unreachable: the last attempt always returns")

    def _response_record(self, line: BatchLine, response: httpx.Response, record_id: str) -> dict[str, Any]:
        body: Any
        try:
            body = json.loads(response.content, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            body = response.content.decode("utf-8", errors="replace")
        if 200 <= response.status_code < 300:
            self.summary.ok += 1
            prompt, completion = _usage_tokens(body)
            self.summary.prompt_tokens += prompt
            self.summary.completion_tokens += completion
        else:
            self.summary.count_failure(_failure_cause(response.status_code, body))
        return output_record(
            line.custom_id,
            status_code=response.status_code,
            body=body,
            request_id=response.headers.get("x-request-id"),
            error=None,
            record_id=record_id,
        )
