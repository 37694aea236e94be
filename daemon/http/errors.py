"""OpenAI-style error bodies: ``{"error": {"message", "type", "param", "code"}}``.

:class:`ApiError` is raised anywhere in the HTTP layer for an expected failure (bad input,
no healthy target, worker failure) and rendered by :func:`error_body`.  ``type`` follows the
OpenAI convention: ``invalid_request_error`` for 4xx caused by the client, ``server_error`` for
agentd-side 5xx and ``upstream_error`` when a worker failed.  ``code`` is a short stable token.
"""

from __future__ import annotations

import json
import math

from actors.core.errors import Rejection
from daemon.redact import redact


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        error_type: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.error_type = error_type or default_type(status)
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.message, self.error_type, self.param, self.code)

    @classmethod
    def from_rejection(cls, rejection: Rejection, default_retry_after: int | None = None) -> ApiError:
        """The HTTP answer to a scheduling refusal: ``code`` is its reason, plus ``Retry-After``:
        the refusal's own (a queue ETA), else ``default_retry_after`` for a 429 or 503 (``[limits]
        retry_after_seconds``: no healthy worker, a queue timeout; docs/operations.md §11.3)."""
        headers: tuple[tuple[str, str], ...] = ()
        seconds = rejection.retry_after_seconds
        if seconds is None and rejection.status_hint in (429, 503):
            seconds = default_retry_after
        if seconds is not None:
            # whole seconds, rounded up, at least 1 (docs/program-scheduling.md §13)
            headers = (("retry-after", str(max(1, math.ceil(seconds)))),)
        return cls(rejection.status_hint, rejection.message, code=rejection.reason, headers=headers)


def default_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    return "server_error"


def error_body(message: str, error_type: str, param: str | None, code: str | None) -> bytes:
    payload = {"error": {"message": redact(message), "type": error_type, "param": param, "code": code}}
    return json.dumps(payload).encode()


def error_dict(message: str, error_type: str, param: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


SSE_DONE = b"data: [DONE]\n\n"


def sse_error_tail(payload: dict) -> bytes:
    """The end of an event stream that failed after its head went out (docs/operations.md §11.1):
    one error event, then ``data: [DONE]``.  ``payload`` is an OpenAI error body (``{"error":
    {...}}``); the event carries it whole, which the ``openai`` clients raise as an ``APIError``,
    and also the Responses API's ``error`` event fields at its top level (``type``, ``code``,
    ``message``, ``param``), so that a client reading a ``/v1/responses`` stream by each event's
    ``type`` sees an error event rather than an event of no known type."""
    error = payload.get("error")
    event: dict = {}
    if isinstance(error, dict):
        event = {
            "type": "error",
            "code": error.get("code"),
            "message": error.get("message"),
            "param": error.get("param"),
        }
    event.update(payload)
    return b"data: " + json.dumps(event).encode() + b"\n\n" + SSE_DONE


def wrap_worker_error(status: int, body: bytes, target_id: str) -> bytes | None:
    """An OpenAI-shaped body for a worker's non-2xx answer that is not one (plain text, HTML, empty,
    truncated, or JSON without an ``error`` object such as vLLM's older ``{"object": "error",
    "message": ...}``); ``None`` when the worker's body already is one (relayed unchanged)."""
    parsed = None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        pass
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return None
    message = parsed.get("message") if isinstance(parsed, dict) else None
    if isinstance(message, str) and message:
        detail = message[:512]
    else:
        detail = body[:512].decode("utf-8", "replace").strip() or "(empty body)"
    return error_body(
        f"worker {target_id} answered HTTP {status}: {detail}", default_type(status), None, "upstream_status"
    )
