"""The batch file format: OpenAI's Batch API / vLLM ``run_batch`` JSONL (docs/batch.md §3).

Shared by ``agentd batch`` (the command line) and the daemon's Batch API.  Pure functions and frozen
values only: no I/O besides reading the input file line by line in :func:`iter_lines`.

An input line is one JSON object::

    {"custom_id": "q-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

An output line is one JSON object (:func:`output_record`)::

    {"id": "batch_req_...", "custom_id": "q-1",
     "response": {"status_code": 200, "request_id": "...", "body": {...}} | null,
     "error": {"code": "...", "message": "..."} | null}

A worker's 4xx/5xx answer is a ``response`` with that status code (as OpenAI records it); ``error``
is for lines that could not be sent (malformed, duplicate ``custom_id``) or got no HTTP answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from attrs import frozen

BATCH_CLASS_HEADER = "x-agentd-class"
BATCH_CLASS = "batch"
# The routes a batch line may name (docs/batch.md §3): the agent-facing ones and the forwarded routes
# OpenAI's Batch API and vLLM's run_batch accept; all of them routes agentd proxies
# (daemon.http.requests.ENDPOINTS; a unit test keeps them a subset).
SUPPORTED_URLS: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/score",
    "/v1/rerank",
)

# The job tag of a request id (docs/batch.md: the job name convention); first match wins.
JOB_TAG = re.compile(r"#job_name\[([^\[\]]+)\]#")

# A custom_id is sent as the X-Request-Id header: printable ASCII only, bounded length.
MAX_CUSTOM_ID_CHARS = 512
_HEADER_SAFE = re.compile(r"[\x20-\x7e]+")
# One line larger than this is reported (not loaded): protects the reader from a file without newlines.
MAX_LINE_BYTES = 32 * 1024 * 1024

# LineError codes.  Every malformed line is ``invalid_request``; a repeated custom_id is ``duplicate_custom_id``.
INVALID_REQUEST = "invalid_request"
DUPLICATE_CUSTOM_ID = "duplicate_custom_id"


@frozen
class BatchLine:
    """A valid input line; ``line_number`` is 1-based (physical lines, blank ones included)."""

    line_number: int
    custom_id: str
    method: str
    url: str
    body: dict[str, Any]


@frozen
class LineError:
    """A line that cannot be sent; ``message`` starts with ``line N:`` and names the field."""

    line_number: int
    custom_id: str | None
    code: str
    message: str


def _err(line_number: int, custom_id: str | None, field: str, problem: str, code: str = INVALID_REQUEST) -> LineError:
    where = f"{field}: " if field else ""
    return LineError(line_number, custom_id, code, f"line {line_number}: {where}{problem}")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else json.dumps(value[:80])
    return text[:80]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_line(raw: bytes | str, line_number: int) -> BatchLine | LineError:
    """One input line (with or without its newline) -> a :class:`BatchLine` or a :class:`LineError`.

    Blank lines are the caller's business (:func:`iter_lines` skips them); given here, a blank line is
    an error.  ``body.model`` may be missing (the worker's default model answers); when present it
    must be a string.  ``body.stream: true`` is refused: batch results are whole JSON responses.
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _err(line_number, None, "", f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
    else:
        text = raw
    text = text.removeprefix("\ufeff").strip()
    if not text:
        return _err(line_number, None, "", "empty line, expected a JSON object")
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return _err(line_number, None, "", "JSON nests arrays or objects too deeply")
    except json.JSONDecodeError as exc:
        return _err(line_number, None, "", f"not valid JSON: {exc.msg} at column {exc.colno}")
    except ValueError as exc:  # NaN / Infinity
        return _err(line_number, None, "", f"not valid JSON: {exc}")
    if not isinstance(obj, dict):
        # the JSON value, as for every other field ("got NoneType" named a Python type for `null`)
        return _err(line_number, None, "", f"must be a JSON object, got {_shown(obj)}")

    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        shown = "missing" if "custom_id" not in obj else f"got {_shown(custom_id)}"
        return _err(line_number, None, "custom_id", f"must be a non-empty string ({shown})")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return _err(line_number, None, "custom_id", f"must be at most {MAX_CUSTOM_ID_CHARS} characters")
    if _HEADER_SAFE.fullmatch(custom_id) is None:
        return _err(line_number, None, "custom_id", "must be printable ASCII (it is sent as the X-Request-Id header)")

    method = obj.get("method")
    if method != "POST":
        shown = "missing" if "method" not in obj else f"got {_shown(method)}"
        return _err(line_number, custom_id, "method", f'must be "POST" ({shown})')
    url = obj.get("url")
    if url not in SUPPORTED_URLS:
        shown = "missing" if "url" not in obj else f"got {_shown(url)}"
        return _err(line_number, custom_id, "url", f"must be one of {', '.join(SUPPORTED_URLS)} ({shown})")
    body = obj.get("body")
    if not isinstance(body, dict):
        shown = "missing" if "body" not in obj else f"got {_shown(body)}"
        return _err(line_number, custom_id, "body", f"must be a JSON object ({shown})")
    if "model" in body and not isinstance(body["model"], str):
        return _err(line_number, custom_id, "body.model", f"must be a string, got {_shown(body['model'])}")
    stream = body.get("stream", False)
    if stream is not False and stream is not None:
        return _err(line_number, custom_id, "body.stream", "must be false or absent: batch requests are not streamed")
    return BatchLine(line_number, custom_id, method, url, body)


def iter_lines(source: str | Path | IO[bytes]) -> Generator[BatchLine | LineError, None, None]:
    """Every non-blank line of a batch file, parsed, in order; streams (one line in memory at a time).

    ``source`` is a path or a binary file object (read from its current position, not closed).  A line
    longer than :data:`MAX_LINE_BYTES` becomes a :class:`LineError` without being loaded whole.
    """
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            yield from _iter_open(f)
    else:
        yield from _iter_open(source)


def _iter_open(f: IO[bytes]) -> Iterator[BatchLine | LineError]:
    line_number = 0
    while True:
        chunk = f.readline(MAX_LINE_BYTES + 1)
        if not chunk:
            return
        line_number += 1
        if len(chunk) > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            while chunk and not chunk.endswith(b"\n"):  # skip the rest of the over-long line
                chunk = f.readline(MAX_LINE_BYTES)
            yield _err(line_number, None, "", f"longer than {MAX_LINE_BYTES} bytes")
            continue
        if not chunk.strip() or chunk.strip() == b"\xef\xbb\xbf":
            continue
        yield parse_line(chunk, line_number)


class DuplicateFilter:
    """First occurrence of a ``custom_id`` wins; every later line with it becomes a ``duplicate_custom_id``
    :class:`LineError`.  A malformed line that has a valid ``custom_id`` (bad url, say) still claims it.
    Holds the set of ids seen (memory grows with the number of distinct ids, not with the file size)."""

    def __init__(self) -> None:
        self._first_line: dict[str, int] = {}

    def check(self, item: BatchLine | LineError) -> BatchLine | LineError:
        cid = item.custom_id
        if cid is None:
            return item
        first = self._first_line.setdefault(cid, item.line_number)
        if first == item.line_number:
            return item
        return _err(
            item.line_number,
            cid,
            "custom_id",
            f"duplicate of line {first} ({_shown(cid)}); the first line with it is the one sent",
            code=DUPLICATE_CUSTOM_ID,
        )

    def __len__(self) -> int:
        return len(self._first_line)


def without_duplicates(items: Iterable[BatchLine | LineError]) -> Iterator[BatchLine | LineError]:
    """``items`` with every repeated ``custom_id`` turned into a duplicate error (:class:`DuplicateFilter`)."""
    seen = DuplicateFilter()
    for item in items:
        yield seen.check(item)


def with_job_tag(request_id: str, job_name: str) -> str:
    """``request_id`` tagged with ``#job_name[job_name]#`` unless it already carries a job tag."""
    if JOB_TAG.search(request_id) is not None:
        return request_id
    if not job_name or "[" in job_name or "]" in job_name:
        raise ValueError(f"job name must be non-empty without '[' or ']', got {job_name!r}")
    return f"{request_id}#job_name[{job_name}]#"


def request_headers(line: BatchLine, job_name: str | None = None) -> dict[str, str]:
    """The headers a batch line is sent with: batch class, JSON, and ``X-Request-Id: custom_id`` (tagged
    with ``job_name`` when given and the id has no tag) unless the body carries its own ``request_id``."""
    headers = {"content-type": "application/json", BATCH_CLASS_HEADER: BATCH_CLASS}
    if not isinstance(line.body.get("request_id"), str):
        rid = line.custom_id if job_name is None else with_job_tag(line.custom_id, job_name)
        headers["x-request-id"] = rid
    return headers


def output_record(
    custom_id: str | None,
    *,
    status_code: int | None,
    body: Any | None,
    request_id: str | None,
    error: tuple[str, str] | None,
    record_id: str,
) -> dict[str, Any]:
    """One output line in OpenAI's batch output shape.  ``status_code`` set -> a ``response`` object
    (whatever the status); ``error`` set -> an ``error`` object; both may be set (OpenAI never does, but
    a caller may keep the last HTTP answer of a failed retry)."""
    response = None if status_code is None else {"status_code": status_code, "request_id": request_id, "body": body}
    err = None if error is None else {"code": error[0], "message": error[1]}
    return {"id": record_id, "custom_id": custom_id, "response": response, "error": err}


def error_record(item: LineError, record_id: str) -> dict[str, Any]:
    """The output line for a malformed or duplicate input line."""
    return output_record(
        item.custom_id,
        status_code=None,
        body=None,
        request_id=None,
        error=(item.code, item.message),
        record_id=record_id,
    )


def encode_record(record: dict[str, Any]) -> bytes:
    """One output line, newline included, as written (compact JSON, UTF-8).  Raises ``ValueError`` on
    NaN/Infinity (not JSON); text with a lone UTF-16 surrogate is written with ASCII escapes."""
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(record, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"
