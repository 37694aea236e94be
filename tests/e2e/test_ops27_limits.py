"""The request-head bound of docs/operations.md §13.7 and §14, the same on both HTTP/1.1 protocols.

A head over 16 KiB is a JSON 431 ``request_head_too_large`` and the connection closes, however it
arrives.  hypercorn's protocol (``http1_implementation = "hypercorn"``) enforced the bound only on a
head still incomplete, through h11: a 17-64 KiB head sent in one write was read whole and served
(found in session 27; the fix is ``BoundedH11Protocol`` in daemon/http/hypercorn_close.py), and its
431 for a larger one had no body.  Real sockets: the behaviour is about what one read holds."""

from __future__ import annotations

import json
from functools import partial

import pytest
import trio
from test_h1_sockets import App, read_until_close

from daemon.config import HTTP1_ENV
from daemon.http.serve import serve_http

BUDGET = 20.0
LIMIT = 16384


PREFIX = b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-big: "
HEAD_OVERHEAD = len(PREFIX)


def _head(value_bytes: int) -> bytes:
    """A GET whose head (request line and header lines, without the blank line that ends it) is
    ``HEAD_OVERHEAD + value_bytes`` bytes."""
    return PREFIX + b"a" * value_bytes + b"\r\n\r\n"


@pytest.fixture(params=["agentd", "hypercorn"])
def http1(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(HTTP1_ENV, request.param)
    return str(request.param)


async def _exchange(port: int, data: bytes, pieces: int) -> bytes:
    """Send ``data`` in ``pieces`` writes (several: only the first 20 KiB of it, an incomplete head
    the server must refuse before it ends; writing on after its answer would meet a closed
    socket), then read the answer until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        if pieces > 1:
            data = data[: 20 * 1024]
        step = -(-len(data) // pieces)
        for i in range(0, len(data), step):
            await stream.send_all(data[i : i + step])
            if pieces > 1:
                await trio.sleep(0.01)  # separate reads on the server's side
        return await read_until_close(stream)


@pytest.mark.parametrize(
    ("value_bytes", "pieces"),
    [
        (LIMIT - HEAD_OVERHEAD + 1, 1),  # one byte over, in one write
        (17_000, 1),
        (40_000, 1),  # the leftover of session 26: accepted by hypercorn's protocol
        (70_000, 1),  # over one 64 KiB read: h11's incomplete-head limit
        (40_000, 8),
    ],
)
async def test_a_head_over_16_kib_is_a_json_431_on_both_protocols(http1: str, value_bytes: int, pieces: int) -> None:
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            stop = trio.Event()
            url = await nursery.start(partial(serve_http), App(), "127.0.0.1", 0, 1.0, stop.wait)
            port = int(url.rsplit(":", 1)[1])
            raw = await _exchange(port, _head(value_bytes), pieces)
            head, body = raw.split(b"\r\n\r\n", 1)
            lower = head.lower()
            assert lower.startswith(b"http/1.1 431 "), head[:80]
            assert b"connection: close" in lower and b"content-type: application/json" in lower
            assert json.loads(body)["error"] == {
                "message": f"the request head exceeds {LIMIT} bytes",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_head_too_large",
            }
            stop.set()


async def test_a_head_of_exactly_16_kib_is_served_on_both_protocols(http1: str) -> None:
    with trio.fail_after(BUDGET):
        async with trio.open_nursery() as nursery:
            stop = trio.Event()
            url = await nursery.start(partial(serve_http), App(), "127.0.0.1", 0, 1.0, stop.wait)
            port = int(url.rsplit(":", 1)[1])
            raw = await _exchange(port, _head(LIMIT - HEAD_OVERHEAD), 1)
            head, body = raw.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 200 "), head[:80]
            assert json.loads(body)["path"] == "/echo"
            stop.set()
