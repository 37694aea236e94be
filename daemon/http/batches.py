"""The Batch API routes, in OpenAI's shapes (docs/batch.md §4).

``POST /v1/files`` is a raw ASGI handler (:func:`serve_file_upload`, mounted in front of Quart by
:class:`~daemon.http.app.AgentdApp` like the proxy routes): it parses the multipart body as it
arrives (werkzeug's sans-IO decoder) and enforces ``batch_api.max_file_bytes`` (413) and
``batch_api.max_lines`` (400) while streaming, independently of ``server.max_body_bytes``.

The other routes are a Quart blueprint (:func:`batches_blueprint`): ``GET /v1/files`` (``purpose``,
``limit``, ``after``, ``order``), ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content`` (streamed in chunks),
``DELETE /v1/files/{id}``, ``POST /v1/batches``, ``GET /v1/batches`` (``limit``, ``after``),
``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``.  Unknown ids are 404, bad input a 400 naming the field; every
error body is OpenAI-shaped.

With API keys configured, every route is scoped to the caller's tenant (the principal the app
authenticated and left in the ASGI scope under :data:`PRINCIPAL_SCOPE_KEY`): files and batches are
stored with their owner, another tenant's ids answer 404 exactly like unknown ones, and lists show
only the caller's objects (docs/batch.md §4).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import trio
from quart import Blueprint, Response, request
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import BLANK_LINE_RE, Data, Epilogue, Field, File, MultipartDecoder, NeedData, State

from actors.logevents import get_logger, log_event
from daemon.batch_executor import BatchService
from daemon.batchfile import SUPPORTED_URLS
from daemon.http.errors import ApiError
from daemon.http.proxy import send_error
from daemon.http.requests import check_content_encoding, parse_json_body

logger = get_logger("batch_api")
JSON = "application/json"
FILE_PURPOSES = ("batch",)
MAX_FIELD_BYTES = 64 * 1024  # a non-file form field (purpose)
MULTIPART_OVERHEAD_BYTES = 1024 * 1024  # boundaries, part headers and small fields around the file
MAX_PART_HEAD_BYTES = 16 * 1024  # the preamble, or one part's header lines (a browser's are ~150 bytes)
CONTENT_CHUNK_BYTES = 1024 * 1024
COMPLETION_WINDOWS = ("24h",)
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MAX_LIST_LIMIT = 100
MAX_FILE_LIST_LIMIT = 10_000
PRINCIPAL_SCOPE_KEY = "agentd.principal"  # set by daemon/http/app.py when API keys are configured


def scope_principal(scope: Mapping[str, Any]) -> str | None:
    """The authenticated tenant of a request (None when API keys are off)."""
    value = scope.get(PRINCIPAL_SCOPE_KEY)
    return value if isinstance(value, str) else None


def _scope_header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class _LineCounter:
    """Counts non-blank lines of a stream of chunks without holding more than one chunk."""

    def __init__(self) -> None:
        self.lines = 0
        self._current_blank = True

    def feed(self, chunk: bytes) -> None:
        pieces = chunk.split(b"\n")
        for i, piece in enumerate(pieces):
            if piece.strip():
                self._current_blank = False
            if i < len(pieces) - 1:  # a newline ends the current line
                self.lines += not self._current_blank
                self._current_blank = True

    def finish(self) -> int:
        return self.lines + (not self._current_blank)


UPLOAD_FIELDS = ("purpose", "file")
MAX_FILENAME_BYTES = 255
DEFAULT_FILENAME = "upload.jsonl"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def upload_filename(raw: str | None) -> str:
    """The name an upload is stored under: the last component of the client's ``filename`` (a
    client's directories, ``../`` included, are not kept: the name is shown, never used as a
    path); 400 naming ``file`` for control characters (NUL, newlines) or over 255 UTF-8 bytes."""
    if not raw:
        return DEFAULT_FILENAME
    if _CONTROL.search(raw) is not None:
        raise ApiError(
            400,
            f"the file's filename must not contain control characters (got {json.dumps(raw[:80])})",
            code="invalid_filename",
            param="file",
        )
    name = re.split(r"[/\\]", raw)[-1]
    if name in ("", ".", ".."):
        return DEFAULT_FILENAME
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate from a filename*= parameter
        raise ApiError(400, "the file's filename is not valid UTF-8", code="invalid_filename", param="file") from None
    if size > MAX_FILENAME_BYTES:
        raise ApiError(
            400,
            f"the file's filename takes {size} bytes, more than {MAX_FILENAME_BYTES}",
            code="invalid_filename",
            param="file",
        )
    return name


def _seen_twice(name: str) -> ApiError:
    return ApiError(400, f"multipart field {name} is given more than once", code="duplicate_field", param=name)


async def _read_upload(
    scope: dict[str, Any], receive: Any, max_file_bytes: int, max_lines: int, stall_seconds: float | None = None
) -> tuple[str | None, str, bytes] | None:
    """``(purpose, filename, content)`` of a multipart upload; None if the client disconnected.

    The form has exactly the fields ``purpose`` and ``file``: another field is a 400
    ``unknown_parameter`` naming it (as for ``POST /v1/batches``: a field agentd would drop is an
    error, not silently ignored), a repeated one a 400 ``duplicate_field`` (docs/operations.md
    §14).  A body that makes no progress for ``stall_seconds`` is a 408 ``body_read_timeout``."""
    check_content_encoding(_scope_header(scope, b"content-encoding"))
    ctype, options = parse_options_header(_scope_header(scope, b"content-type") or "")
    boundary = options.get("boundary")
    # a media type is case-insensitive (RFC 9110 §8.3.1): Multipart/Form-Data was a 400 before session 43
    if ctype.lower() != "multipart/form-data" or not boundary:
        raise ApiError(
            400,
            "POST /v1/files takes multipart/form-data with the fields purpose and file",
            code="invalid_content_type",
            param="file",
        )
    declared = _scope_header(scope, b"content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):  # ("²".isdigit() is true, int() refuses it)
            raise ApiError(
                400,
                f"invalid content-length header: {declared[:40]!r}",
                code="invalid_header",
                param="content-length",
            )
        if len(declared) > 18 or int(declared) > max_file_bytes + MULTIPART_OVERHEAD_BYTES:
            raise _too_large(max_file_bytes)
    fields: dict[str, bytearray] = {}
    content = bytearray()
    try:
        return await _read_parts(receive, boundary, fields, content, max_file_bytes, max_lines, stall_seconds)
    except _Disconnected:
        return None
    finally:
        # a refused upload's buffers are freed now: the error's traceback keeps this frame (and
        # so the buffers) alive until the exception is gone, which a reference cycle can delay
        # until a full garbage collection (a client repeating a chunked over-limit upload grew
        # the daemon by the limit each time, docs/operations.md §14)
        content.clear()
        for buffer in fields.values():
            buffer.clear()


def _too_large(max_file_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"file exceeds the limit of {max_file_bytes} bytes (batch_api.max_file_bytes)",
        code="file_too_large",
        param="file",
    )


async def _read_parts(
    receive: Any,
    boundary: str,
    fields: dict[str, bytearray],
    content: bytearray,
    max_file_bytes: int,
    max_lines: int,
    stall_seconds: float | None,
) -> tuple[str | None, str, bytes]:
    """The parts of the upload into ``fields`` and ``content`` (see :func:`_read_upload`)."""
    decoder = MultipartDecoder(boundary.encode("latin-1"), max_parts=16)
    counter = _LineCounter()
    filename = DEFAULT_FILENAME
    current: str | None = None  # "file" (the file part), "purpose"
    saw_file = False
    total = 0
    done = False
    while not done:
        if stall_seconds is None:
            message = await receive()
        else:
            with trio.move_on_after(stall_seconds) as stall:
                message = await receive()
            if stall.cancelled_caught:
                raise ApiError(
                    408,
                    f"the upload made no progress for limits.body_read_timeout_seconds ({stall_seconds:g} s)",
                    code="body_read_timeout",
                )
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > max_file_bytes + MULTIPART_OVERHEAD_BYTES:
            raise _too_large(max_file_bytes)
        more = message.get("more_body", False)
        try:
            decoder.receive_data(chunk)
            if not more:
                decoder.receive_data(None)
            while True:
                _check_part_head(decoder)
                event = decoder.next_event()
                if isinstance(event, NeedData):
                    break
                if isinstance(event, Epilogue):
                    done = True
                    break
                if isinstance(event, File | Field):
                    name = event.name
                    if name is None:  # RFC 7578 §4.2: every part names its field
                        raise ValueError("a part's Content-Disposition has no name")
                    if name not in UPLOAD_FIELDS:
                        _reject_unknown([name], UPLOAD_FIELDS, "multipart field")
                    if name in fields or (name == "file" and saw_file):
                        raise _seen_twice(name)
                    current = name
                    if isinstance(event, File) and name == "file":
                        saw_file = True
                        filename = upload_filename(event.filename)
                    else:  # purpose, or the file sent as a plain field (no filename)
                        fields[name] = bytearray()
                elif isinstance(event, Data):
                    if current == "file" and saw_file:
                        content += event.data
                        if len(content) > max_file_bytes:
                            raise _too_large(max_file_bytes)
                        counter.feed(event.data)
                        if counter.lines > max_lines:
                            raise _too_many_lines(max_lines)
                    elif current is not None:
                        fields[current] += event.data
                        if current == "file" and len(fields[current]) > max_file_bytes:
                            raise _too_large(max_file_bytes)
                        if current != "file" and len(fields[current]) > MAX_FIELD_BYTES:
                            message_text = f"form field {current} is longer than {MAX_FIELD_BYTES} bytes"
                            raise ApiError(400, message_text, code="invalid_value", param=current)
        except ValueError as exc:
            raise ApiError(400, f"malformed multipart body: {exc}", code="invalid_multipart", param="file") from None
        if not more and not done:
            raise ApiError(400, "malformed multipart body: it ends early", code="invalid_multipart", param="file")
    if not saw_file:
        if "file" not in fields:
            raise ApiError(400, "missing the file part (multipart field file)", code="missing_field", param="file")
        content = fields["file"]  # sent as a plain field, not a file part
        counter.feed(bytes(content))
    if counter.finish() > max_lines:
        raise _too_many_lines(max_lines)
    purpose = fields.get("purpose")
    return (None if purpose is None else purpose.decode("utf-8", "replace")), filename, bytes(content)


def _check_part_head(decoder: MultipartDecoder) -> None:
    """400 ``invalid_multipart`` for a preamble or a part's header block over 16 KiB.  werkzeug
    parses a part's ``Content-Disposition`` at about 0.7 µs a byte on the event loop: before session
    44 a 30 MB filename held the whole daemon (every stream, every probe) for 11 s, and the upload
    limit allowed 200 MiB of it (docs/operations.md §14)."""
    if decoder.state not in (State.PREAMBLE, State.PART) or len(decoder.buffer) <= MAX_PART_HEAD_BYTES:
        return
    if decoder.state == State.PART:
        ended = BLANK_LINE_RE.search(decoder.buffer, 0, MAX_PART_HEAD_BYTES + 4)
        what = "a part's headers exceed"
    else:
        ended = decoder.preamble_re.search(decoder.buffer, 0, MAX_PART_HEAD_BYTES + len(decoder.boundary) + 8)
        what = "the multipart preamble exceeds"
    if ended is None:
        raise ApiError(
            400, f"malformed multipart body: {what} {MAX_PART_HEAD_BYTES} bytes", code="invalid_multipart", param="file"
        )


class _Disconnected(Exception):
    """The client left during the upload (:func:`_read_upload` answers None)."""


def _too_many_lines(max_lines: int) -> ApiError:
    return ApiError(
        400, f"file has more than {max_lines} request lines (batch_api.max_lines)", code="too_many_lines", param="file"
    )


class _RawSink:
    def __init__(self, send: Any) -> None:
        self._send = send

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            }
        )

    async def send(self, chunk: bytes) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end(self, chunk: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": False})


async def serve_file_upload(
    service: BatchService, scope: dict[str, Any], receive: Any, send: Any, *, stall_seconds: float | None = None
) -> None:
    """``POST /v1/files`` end to end (see the module docstring); ``stall_seconds`` bounds how long
    the upload may make no progress (``limits.body_read_timeout_seconds``, 408)."""
    sink = _RawSink(send)
    cfg = service.cfg
    try:
        upload = await _read_upload(scope, receive, cfg.max_file_bytes, cfg.max_lines, stall_seconds)
        if upload is None:
            return
        purpose, filename, content = upload
        if purpose is None:
            raise ApiError(400, "missing the purpose field (it must be 'batch')", code="missing_field", param="purpose")
        if purpose not in FILE_PURPOSES:
            raise ApiError(
                400,
                f"purpose must be one of {', '.join(FILE_PURPOSES)} (got {purpose[:80]!r}): agentd stores batch input",
                code="invalid_value",
                param="purpose",
            )
        store = await service.store()
        file = await store.call(store.db.create_file, filename, purpose, content, scope_principal(scope))
    except ApiError as error:
        await send_error(sink, error)
        return
    log_event(logger, logging.INFO, "batch_file_uploaded", file_id=file["id"], bytes=file["bytes"], filename=filename)
    body = json.dumps(file).encode()
    await sink.start(200, [("content-type", JSON), ("content-length", str(len(body)))])
    await sink.end(body)


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, content_type=JSON)


MAX_ID_CHARS = 128  # agentd's ids are ~40 ASCII characters (file-…, batch_…)


def _storable_id(object_id: str) -> bool:
    """Whether ``object_id`` can name a stored object at all: a path segment that is not ASCII (a
    lone surrogate cannot even be bound as an SQLite parameter) or very long is a 404 at once."""
    return object_id.isascii() and len(object_id) <= MAX_ID_CHARS


def _not_found(kind: str, object_id: str, param: str) -> ApiError:
    return ApiError(404, f"no {kind} with id {object_id[:120]!r}", code=f"{kind}_not_found", param=param)


def _check_metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(400, "metadata must be an object of strings or null", code="invalid_value", param="metadata")
    if len(value) > MAX_METADATA_PAIRS:
        raise ApiError(400, f"metadata has more than {MAX_METADATA_PAIRS} keys", code="invalid_value", param="metadata")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise ApiError(
                400, f"metadata keys are at most {MAX_METADATA_KEY} characters", code="invalid_value", param="metadata"
            )
        if not isinstance(item, str) or len(item) > MAX_METADATA_VALUE:
            raise ApiError(
                400,
                f"metadata.{key}: must be a string of at most {MAX_METADATA_VALUE} characters",
                code="invalid_value",
                param=f"metadata.{key}",
            )
    return dict(value)


BATCH_FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
BATCH_LIST_PARAMS = ("limit", "after")
FILE_LIST_PARAMS = ("purpose", "limit", "after", "order")


def _reject_unknown(names: Iterable[str], accepted: tuple[str, ...], what: str) -> None:
    """A field agentd does not read is a 400 naming it, as OpenAI answers ("Unrecognized request
    argument supplied: X"), not silently dropped: a misspelt ``metdata`` lost the metadata, an
    ``order`` or ``output_expires_after`` agentd does not implement seemed to work (docs/batch.md §4)."""
    for name in names:
        if name not in accepted:
            raise ApiError(
                400,
                f"Unrecognized {what} supplied: {name[:80]} (accepted: {', '.join(accepted)})",
                code="unknown_parameter",
                param=name[:80],
            )


def _batch_request(raw: bytes) -> tuple[str, str, str, dict[str, str] | None]:
    body = parse_json_body(raw)
    _reject_unknown(body, BATCH_FIELDS, "request argument")
    input_file_id = body.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise ApiError(
            400,
            f"input_file_id must be the id of an uploaded file (got {json.dumps(input_file_id)[:80]})",
            code="missing_field" if input_file_id in (None, "") else "invalid_type",
            param="input_file_id",
        )
    endpoint = body.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in SUPPORTED_URLS:  # (an object is unhashable)
        raise ApiError(
            400,
            f"endpoint must be one of {', '.join(SUPPORTED_URLS)} (got {json.dumps(endpoint)[:80]})",
            code="invalid_value",
            param="endpoint",
        )
    window = body.get("completion_window")
    if not isinstance(window, str) or window not in COMPLETION_WINDOWS:
        raise ApiError(
            400,
            f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)} (got {json.dumps(window)[:80]})",
            code="invalid_value",
            param="completion_window",
        )
    return input_file_id, endpoint, window, _check_metadata(body.get("metadata"))


def bounded_int(raw: str, name: str, low: int, high: int) -> int:
    """``raw`` as an integer within [low, high]; 400 ``invalid_value`` naming ``name`` otherwise.
    Only ASCII digits count: ``str.isdigit`` also accepts ``"²"``, which ``int`` refuses, and a
    number of thousands of digits is refused before ``int`` (which raises on over 4,300 digits)."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 20) or not low <= int(raw) <= high:
        raise ApiError(
            400,
            f"{name} must be an integer within [{low}, {high}] (got {raw[:40]!r})",
            code="invalid_value",
            param=name,
        )
    return int(raw)


def _single_args(accepted: tuple[str, ...]) -> None:
    """Unknown query parameters and repeated ones (``limit=1&limit=2``: which one?) are a 400."""
    _reject_unknown(request.args.keys(), accepted, "query parameter")
    for name in accepted:
        if len(request.args.getlist(name)) > 1:
            raise ApiError(400, f"query parameter {name} is given more than once", code="invalid_value", param=name)


def _list_args() -> tuple[int, str | None]:
    _single_args(BATCH_LIST_PARAMS)
    limit = bounded_int(request.args.get("limit", "20"), "limit", 1, MAX_LIST_LIMIT)
    return limit, request.args.get("after") or None


def _list_page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's cursor page: the client's auto-pagination asks again with ``after=last_id`` while
    ``has_more`` (docs/batch.md §4)."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def batches_blueprint(service: BatchService) -> Blueprint:
    bp = Blueprint("batch_api", __name__)

    def owner() -> str | None:
        return scope_principal(request.scope)

    async def file_or_404(file_id: str) -> dict[str, Any]:
        if not _storable_id(file_id):
            raise _not_found("file", file_id, "file_id")
        store = await service.store()
        file = await store.call(store.db.get_file, file_id, owner())
        if file is None:
            raise _not_found("file", file_id, "file_id")
        return file

    async def batch_or_404(batch_id: str) -> dict[str, Any]:
        if not _storable_id(batch_id):
            raise _not_found("batch", batch_id, "batch_id")
        store = await service.store()
        batch = await store.call(store.db.get_batch, batch_id, owner())
        if batch is None:
            raise _not_found("batch", batch_id, "batch_id")
        return batch

    @bp.get("/v1/files")
    async def list_files() -> Response:
        _single_args(FILE_LIST_PARAMS)
        limit = bounded_int(request.args.get("limit", "10000"), "limit", 1, MAX_FILE_LIST_LIMIT)
        order = request.args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, f"order must be asc or desc (got {order[:40]!r})", code="invalid_value", param="order")
        after = request.args.get("after") or None
        if after is not None and not _storable_id(after):
            raise ApiError(400, f"after: no file with id {after[:120]!r}", code="invalid_value", param="after")
        store = await service.store()
        purpose = request.args.get("purpose") or None
        page = await store.call(store.db.list_files, purpose, limit, owner(), after=after, ascending=order == "asc")
        if page is None:
            raise ApiError(400, f"after: no file with id {(after or '')[:120]!r}", code="invalid_value", param="after")
        return _json(_list_page(*page))

    @bp.get("/v1/files/<file_id>")
    async def get_file(file_id: str) -> Response:
        return _json(await file_or_404(file_id))

    @bp.delete("/v1/files/<file_id>")
    async def delete_file(file_id: str) -> Response:
        store = await service.store()
        if not _storable_id(file_id) or not await store.call(store.db.delete_file, file_id, owner()):
            raise _not_found("file", file_id, "file_id")
        return _json({"id": file_id, "object": "file", "deleted": True})

    @bp.get("/v1/files/<file_id>/content")
    async def file_content(file_id: str) -> Response:
        file = await file_or_404(file_id)
        store = await service.store()
        tenant = owner()

        async def chunks() -> AsyncIterator[bytes]:
            offset = 0
            while offset < file["bytes"]:
                chunk = await store.call(store.db.read_file_chunk, file_id, offset, CONTENT_CHUNK_BYTES, tenant)
                if not chunk:
                    return
                offset += len(chunk)
                yield chunk

        response = Response(chunks(), status=200, content_type="application/octet-stream")
        response.headers["content-length"] = str(file["bytes"])
        return response

    @bp.post("/v1/batches")
    async def create_batch() -> Response:
        check_content_encoding(request.headers.get("content-encoding"))
        raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        input_file_id, endpoint, window, metadata = _batch_request(raw)
        store = await service.store()
        tenant = owner()
        file = await store.call(store.db.get_file, input_file_id, tenant)
        if file is None:
            raise _not_found("file", input_file_id, "input_file_id")
        if file["purpose"] != "batch":
            raise ApiError(
                400,
                f"input_file_id: file {input_file_id} has purpose {file['purpose']!r}, not 'batch'",
                code="invalid_value",
                param="input_file_id",
            )
        batch = await store.call(store.db.create_batch, input_file_id, endpoint, window, metadata, tenant)
        await service.status_changed()
        service.wake()
        log_event(
            logger, logging.INFO, "batch_created", batch_id=batch["id"], input_file_id=input_file_id, endpoint=endpoint
        )
        return _json(batch)

    @bp.get("/v1/batches")
    async def list_batches() -> Response:
        limit, after = _list_args()
        store = await service.store()
        page = await store.call(store.db.list_batches, limit, after, owner())
        if page is None:
            raise ApiError(400, f"after: no batch with id {(after or '')[:120]!r}", code="invalid_value", param="after")
        return _json(_list_page(*page))

    @bp.get("/v1/batches/<batch_id>")
    async def get_batch(batch_id: str) -> Response:
        return _json(await batch_or_404(batch_id))

    @bp.post("/v1/batches/<batch_id>/cancel")
    async def cancel_batch(batch_id: str) -> Response:
        batch = await batch_or_404(batch_id)
        store = await service.store()
        if batch["status"] in ("validating", "in_progress"):
            if await store.call(store.db.request_cancel, batch_id):
                await service.status_changed()
                service.wake()
                log_event(logger, logging.INFO, "batch_cancel_requested", batch_id=batch_id)
            return _json(await batch_or_404(batch_id))
        if batch["status"] in ("cancelling", "cancelled"):
            return _json(batch)
        raise ApiError(
            409,
            f"batch {batch_id} is {batch['status']} and can no longer be cancelled",
            code="batch_not_cancellable",
            param="batch_id",
        )

    return bp
