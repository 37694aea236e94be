"""A refused upload or request body frees its buffer at once (docs/operations.md §14).

A chunked upload (no ``content-length``) over ``batch_api.max_file_bytes`` is refused with a 413
once the limit is passed.  Before session 34 the error formed a reference cycle with the reading
frame, which kept the file's buffer (up to the limit) alive until a full garbage collection: a
client repeating such an upload grew the daemon by the limit each time.  The cycle collector is
turned off here, so only reference counting frees memory, and the test measures what stays.  A
request body over ``server.max_body_bytes`` had the same cycle."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from daemon.http.app import _read_body
from daemon.http.batches import _read_upload
from daemon.http.errors import ApiError

LIMIT = 4 * 1024 * 1024
CHUNK = 64 * 1024


def chunked_upload(size: int) -> Any:
    """An ASGI ``receive`` sending a multipart form whose file part has ``size`` bytes."""
    head = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n"
    )
    parts = [head] + [b"x" * CHUNK] * (size // CHUNK) + [b"\r\n--b--\r\n"]
    messages = iter([{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)])

    async def receive() -> dict[str, Any]:
        return next(messages)

    return receive


SCOPE = {"headers": [(b"content-type", b"multipart/form-data; boundary=b")]}


async def refuse(size: int) -> None:
    with pytest.raises(ApiError) as caught:
        await _read_upload(SCOPE, chunked_upload(size), LIMIT, 1_000_000)
    assert (caught.value.status, caught.value.code) == (413, "file_too_large")


def traced_after_three(refusal: Callable[[int], Awaitable[None]]) -> tuple[int, int]:
    """(bytes still allocated, peak) after three refusals of twice the limit, the cycle collector off."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        for _ in range(3):
            trio.run(refusal, 2 * LIMIT)
        return tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()


def test_a_refused_chunked_upload_leaves_no_buffer_behind() -> None:
    current, peak = traced_after_three(refuse)
    assert peak > LIMIT  # the buffer did fill up to the limit
    assert current < LIMIT // 4, f"{current} bytes still held after three refused uploads"


async def test_an_upload_within_the_limit_is_read_whole() -> None:
    purpose, filename, content = await _read_upload(SCOPE, chunked_upload(LIMIT // 2), LIMIT, 1_000_000) or (
        None,
        "",
        b"",
    )
    assert (purpose, filename, len(content)) == ("batch", "in.jsonl", LIMIT // 2)


def chunked_body(size: int) -> Any:
    """An ASGI ``receive`` sending a request body of ``size`` bytes in chunks."""
    left = size // CHUNK

    async def receive() -> dict[str, Any]:
        nonlocal left
        left -= 1
        # a new chunk each time, as a socket reads them
        return {"type": "http.request", "body": b"x" * CHUNK if left >= 0 else b"", "more_body": left >= 0}

    return receive


async def refuse_body(size: int) -> None:
    with pytest.raises(ApiError) as caught:
        await _read_body(chunked_body(size), LIMIT, None)
    assert (caught.value.status, caught.value.code) == (413, "body_too_large")


def test_a_refused_chunked_request_body_leaves_nothing_behind() -> None:
    current, peak = traced_after_three(refuse_body)
    assert peak > LIMIT  # the chunks did pile up to the limit
    assert current < LIMIT // 4, f"{current} bytes still held after three refused bodies"
