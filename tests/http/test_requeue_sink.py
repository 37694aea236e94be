"""The client's sink of a request the scheduler may take back before its answer starts
(``daemon/http/proxy.py:RequeueSink``, docs/priority.md §3, "Re-queueing a blocking long prefill")."""

from __future__ import annotations

import json

import pytest

from daemon.dispatch import Requeued
from daemon.http.proxy import RequeueSink

SSE = [("content-type", "text/event-stream")]


class TakeBack:
    """The lease's flag: the scheduler took the request back (``ProgramDispatcher.requeue``)."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        return self.requested


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.calls.append(("start", status))

    async def send(self, chunk: bytes) -> None:
        self.calls.append(("send", chunk))

    async def end(self, chunk: bytes = b"") -> None:
        self.calls.append(("end", chunk))


async def test_a_stream_head_is_sent_once_and_nothing_after_a_take_back() -> None:
    rec, back = Recorder(), TakeBack()
    guard = RequeueSink(rec, back)
    await guard.start(200, SSE)
    assert (guard.head_sent, guard.committed) == (True, False)  # an event stream's head commits nothing
    back.requested = True  # the scheduler took it back while the forward was between two writes
    with pytest.raises(Requeued):
        await guard.send(b"data: late\n\n")
    with pytest.raises(Requeued):
        await guard.end()
    back.requested = False  # admitted again: the next forward
    guard.next_forward()
    await guard.start(200, SSE)  # the second forward's head: the client has it already
    await guard.send(b'data: {"x": 1}\n\n')
    assert guard.committed
    back.requested = True  # too late now: the writes go on (the dispatcher refuses such a take-back)
    await guard.end(b"data: [DONE]\n\n")
    assert rec.calls == [("start", 200), ("send", b'data: {"x": 1}\n\n'), ("end", b"data: [DONE]\n\n")]


async def test_an_error_of_a_later_forward_becomes_an_event_in_the_started_stream() -> None:
    rec, back = Recorder(), TakeBack()
    guard = RequeueSink(rec, back)
    await guard.start(200, SSE)
    guard.next_forward()
    body = json.dumps({"error": {"message": "worker w failed with HTTP 502", "code": "upstream_status"}}).encode()
    await guard.start(502, [("content-type", "application/json"), ("content-length", str(len(body)))])
    await guard.end(body)
    event = {
        "type": "error",
        "code": "upstream_status",
        "message": "worker w failed with HTTP 502",
        "param": None,
        "error": {"message": "worker w failed with HTTP 502", "code": "upstream_status"},
    }
    assert rec.calls == [("start", 200), ("end", b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n")]


async def test_a_later_forward_s_answer_that_is_not_json_is_relayed_as_the_event_s_data() -> None:
    rec, back = Recorder(), TakeBack()
    guard = RequeueSink(rec, back)
    await guard.start(200, SSE)
    guard.next_forward()
    await guard.start(502, [("content-type", "text/plain"), ("content-length", "11")])
    await guard.end(b"bad gateway\n")
    assert rec.calls == [("start", 200), ("end", b"data: bad gateway\n\ndata: [DONE]\n\n")]


async def test_a_complete_answer_commits_at_its_head() -> None:
    rec, back = Recorder(), TakeBack()
    guard = RequeueSink(rec, back)
    await guard.start(200, [("content-type", "application/json"), ("content-length", "2")])
    assert guard.committed  # its head carries the body's length: no take-back after it
    await guard.end(b"{}")
    assert rec.calls == [("start", 200), ("end", b"{}")]


async def test_a_later_forward_s_stream_head_commits_nothing_so_it_can_be_taken_back_again() -> None:
    rec, back = Recorder(), TakeBack()
    guard = RequeueSink(rec, back)
    await guard.start(200, SSE)
    guard.next_forward()  # taken back once, admitted again
    await guard.start(200, SSE)
    assert (guard.head_sent, guard.committed) == (True, False)  # still before the first token
    back.requested = True  # the scheduler takes the second dispatch back as well
    with pytest.raises(Requeued):
        await guard.send(b"data: late\n\n")
    back.requested = False
    guard.next_forward()
    await guard.start(200, SSE)
    await guard.end(b"data: [DONE]\n\n")
    assert rec.calls == [("start", 200), ("end", b"data: [DONE]\n\n")]
