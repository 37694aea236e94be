"""Issue 15's data plane walked as a demanding user over real sockets, with one process and with two
relay processes (docs/operations.md §13, §14): odd but valid bodies, body limits and lying or
stalled uploads, the usage filter against a worker with vLLM's usage rules, a stream dripped one
byte per TCP segment, a worker and a client that leave mid-stream; afterwards nothing is held
(``invariants.at_rest``, no open lease).

Each of these failed before session 32:

* ``stream_options: {"include_usage": false, "continuous_usage_stats": true}`` on a stream whose
  usage the scheduler needs: agentd injected ``include_usage`` and the worker then put usage on
  every chunk, which the client got though it had asked for none;
* with ``routing.agentic_context_forwarding = "json_string"``, a ``NaN`` in an object agentic
  context (a field agentd does not read): a JSON 500 after admission (the context cannot be
  written as JSON text); now a 400 naming the member;
* a UTF-16 body holding a lone surrogate escape (``"\\ud800"``): the byte search for the escape
  did not see it, and the Program's prompt estimate failed with a 500; now the 400
  ``invalid_json`` a UTF-8 body gets.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

sys.path.append(str(Path(__file__).resolve().parents[1] / "faults"))

from fault_env import BUDGET_SECONDS, await_diagnostics
from fault_worker import Act, FaultWorker, _chunk, _event

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, BatchApiConfig, LimitsConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

MAX_BODY = 65_536
CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}]}


def _program(program_id: str, **extra: Any) -> dict[str, Any]:
    return {**CHAT, "vllm_xargs": {"agentic_context": {"program_id": program_id}}, **extra}


class VllmUsageWorker(FaultWorker):
    """:class:`FaultWorker` whose streams follow vLLM's usage rules: ``include_usage`` adds a final
    usage-only event, and only with it does ``continuous_usage_stats`` put usage on every event;
    ``drip``: every byte of a stream goes out in a TCP segment of its own."""

    drip = False

    async def _stream(self, stream: trio.SocketStream, act: Act, request: dict[str, Any]) -> bool:
        if act.kind != "ok":
            return await super()._stream(stream, act, request)
        options = request.get("stream_options") or {}
        include = options.get("include_usage") is True
        continuous = include and options.get("continuous_usage_stats") is True
        usage = {"prompt_tokens": 5, "completion_tokens": act.events, "total_tokens": 5 + act.events}
        deltas = [{"role": "assistant", "content": ""}] + [{"content": f"t{i}"} for i in range(act.events)]
        events = []
        for i, delta in enumerate(deltas):
            obj: dict[str, Any] = {"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            if continuous:
                obj["usage"] = {**usage, "completion_tokens": i}
            events.append(_event(obj))
        finish: dict[str, Any] = {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        events.append(_event({**finish, "usage": usage} if continuous else finish))
        if include:
            events.append(_event({"id": "c1", "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        wire += b"".join(_chunk(e) for e in events) + b"0\r\n\r\n"
        if not self.drip:
            await stream.send_all(wire)
            return True
        stream.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(wire)):  # every frame split at every offset, one segment per byte
            await stream.send_all(wire[i : i + 1])
        return True


def _config(worker_url: str, processes: int, coalesce_ms: float, tmp: Path) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(
            host="127.0.0.1",
            port=0,
            shutdown_grace_seconds=2.0,
            data_plane_processes=processes,
            stream_coalesce_ms=coalesce_ms,
            max_body_bytes=MAX_BODY,
        ),
        routing=RoutingConfig(
            worker_urls=(worker_url,),
            health_check_interval_seconds=3600.0,
            policy="round_robin",
            agentic_context_forwarding="json_string",
        ),
        limits=LimitsConfig(body_read_timeout_seconds=2.0),
        batch_api=BatchApiConfig(database_path=str(tmp / "batches.sqlite3")),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=1_000_000),
    )


async def _exchange(port: int, data: bytes, *, half_close: bool = False) -> bytes:
    """Send ``data`` on a new connection and read until the daemon closes it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        if half_close:
            await stream.send_eof()
        raw = b""
        with trio.fail_after(BUDGET_SECONDS):
            while chunk := await stream.receive_some(65536):
                raw += chunk
    return raw


def _head(body: bytes, *, length: int | None = None, extra: bytes = b"") -> bytes:
    size = len(body) if length is None else length
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n%b\r\n" % (size, extra)
    )


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _error(raw: bytes) -> dict[str, Any]:
    body = raw.partition(b"\r\n\r\n")[2]
    if b"\r\n" in body.split(b"{", 1)[0]:  # chunked framing: the one chunk's data
        body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    error: dict[str, Any] = json.loads(body)["error"]
    return error


def _sse(body: bytes) -> list[bytes]:
    return [e for e in body.replace(b"\r\n", b"\n").split(b"\n\n") if e]


def _at_rest(doc: dict[str, Any]) -> bool:
    plane = doc.get("data_plane")
    return (
        doc["invariants"]["at_rest"]
        and doc["proxy"]["edge"]["in_flight"] == 0
        and doc["proxy"]["edge"]["queued"] == 0
        and (plane is None or plane["open_leases"] == 0)
    )


@pytest.mark.parametrize(("processes", "coalesce_ms"), [(1, 0.0), (1, 50.0), (2, 0.0), (2, 50.0)])
async def test_walkd32_bodies_limits_and_streams(tmp_path: Path, processes: int, coalesce_ms: float) -> None:
    async with trio.open_nursery() as nursery:
        worker: VllmUsageWorker = await nursery.start(VllmUsageWorker().run)
        worker.default = Act(events=4)
        handles = await nursery.start(run_daemon, _config(worker.url, processes, coalesce_ms, tmp_path))
        port = int(handles.http_url.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            # -- usage: the client gets usage exactly when it asked for it --------------------------
            for options, wanted in [
                ({"include_usage": False, "continuous_usage_stats": True}, "none"),
                ({"continuous_usage_stats": True}, "none"),
                (None, "none"),
                ({"include_usage": True}, "final"),
                ({"include_usage": True, "continuous_usage_stats": True}, "every"),
            ]:
                body = _program("usage", stream=True, **({} if options is None else {"stream_options": options}))
                answer = await client.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                events = _sse(answer.content)
                assert events[-1] == b"data: [DONE]"
                with_usage = [e for e in events if b'"usage"' in e]
                if wanted == "none":
                    assert with_usage == [], (options, with_usage)
                elif wanted == "final":
                    assert with_usage == [events[-2]], (options, events)
                else:
                    assert len(with_usage) == len(events) - 1, (options, events)
                sent = json.loads(worker.generation_requests()[-1].body)
                assert sent["stream_options"]["include_usage"] is True  # the scheduler's usage
                assert "agentic_context" in sent["vllm_xargs"]  # json_string: a string now
                assert isinstance(sent["vllm_xargs"]["agentic_context"], str)

            # -- a stream dripped one byte per TCP segment: the same events, usage filtered --------
            worker.drip = True
            answer = await client.post("/v1/chat/completions", json=_program("drip", stream=True))
            worker.drip = False
            events = _sse(answer.content)
            assert [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-1]] == [
                "", "t0", "t1", "t2", "t3", None,
            ]  # fmt: skip
            assert events[-1] == b"data: [DONE]" and not any(b'"usage"' in e for e in events)

            # -- odd but valid bodies: 400 naming the field, never a 500 ---------------------------
            nan = (
                b'{"model":"fault-model","messages":[{"role":"user","content":"hi"}],'
                b'"vllm_xargs":{"agentic_context":{"program_id":"nan","note":NaN}}}'
            )
            answer = await client.post("/v1/chat/completions", content=nan)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == "vllm_xargs.agentic_context.note"
            utf16 = json.dumps(_program("u16")).replace('"hi"', '"h\\ud800i"').encode("utf-16")
            answer = await client.post("/v1/chat/completions", content=utf16)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "invalid_json"
            answer = await client.post(  # the same body without the surrogate: served
                "/v1/chat/completions", content=json.dumps(_program("u16")).encode("utf-16")
            )
            assert answer.status_code == 200, answer.text
            answer = await client.post("/v1/chat/completions", content=b'{"stre\\u0061m": 1, "model": "fault-model"}')
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "stream"

            # -- body limits -----------------------------------------------------------------------
            def sized(size: int) -> bytes:
                raw = json.dumps(_program("big", messages=[{"role": "user", "content": ""}])).encode()
                pad = size - len(raw)
                return raw.replace(b'"content": ""', b'"content": "' + b"x" * pad + b'"')

            at_limit, over = sized(MAX_BODY), sized(MAX_BODY + 1)
            assert (len(at_limit), len(over)) == (MAX_BODY, MAX_BODY + 1)
            assert _status(await _exchange(port, _head(at_limit) + at_limit)) == 200
            raw = await _exchange(port, _head(over) + over)
            assert _status(raw) == 413 and _error(raw)["code"] == "body_too_large", raw[:300]
            chunked = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n"
            )
            raw = await _exchange(port, chunked + _chunk(at_limit) + b"0\r\n\r\n")
            assert _status(raw) == 200, raw[:300]
            raw = await _exchange(port, chunked + _chunk(over[:1000]) + _chunk(over[1000:]) + b"0\r\n\r\n")
            assert _status(raw) == 413 and _error(raw)["code"] == "body_too_large", raw[:300]
            gz = _head(at_limit, extra=b"Content-Encoding: gzip\r\n") + at_limit
            raw = await _exchange(port, gz)
            assert _status(raw) == 415 and _error(raw)["param"] == "content-encoding", raw[:300]
            # a content-length longer than the body: the client stops sending (408 at the body
            # timeout), or closes its side (no answer can be read: the request is dropped)
            small = json.dumps(_program("short")).encode()
            raw = await _exchange(port, _head(small, length=len(small) + 10) + small)
            assert _status(raw) == 408 and _error(raw)["code"] == "body_read_timeout", raw[:300]
            raw = await _exchange(port, _head(small, length=len(small) + 10) + small, half_close=True)
            assert raw == b"" or _status(raw) == 400, raw[:300]
            # a content-length shorter than the body: the body is cut there (not JSON: 400), the
            # rest is not taken for another request
            raw = await _exchange(port, _head(small, length=len(small) - 2) + small)
            assert _status(raw) == 400 and _error(raw)["code"] == "invalid_json", raw[:300]
            assert raw.count(b"HTTP/1.1 ") == 1, raw

            # -- a worker that closes mid-stream; a client that leaves mid-stream -----------------
            worker.script.append(Act(kind="kill", after=2))
            answer = await client.post("/v1/chat/completions", json=_program("killed", stream=True))
            events = _sse(answer.content)
            assert events[-1] == b"data: [DONE]" and b'"error"' in events[-2], events
            worker.script.append(Act(kind="stall", after=2))
            async with client.stream("POST", "/v1/chat/completions", json=_program("leaves", stream=True)) as r:
                async for _ in r.aiter_bytes():
                    break  # the first event arrived: leave
            doc = await await_diagnostics(client, _at_rest)
            assert doc["invariants"]["at_rest"]

            # -- with relay processes: a relay SIGKILLed mid-stream --------------------------------
            if processes > 1:
                await _relay_killed_mid_stream(client, worker)
        nursery.cancel_scope.cancel()


async def _relay_killed_mid_stream(client: httpx.AsyncClient, worker: VllmUsageWorker) -> None:
    """The stream is cut without ``[DONE]`` (docs/operations.md §13.2), the relay's lease is
    released, the relay is restarted and ``/metrics`` still merges every process."""
    worker.script.append(Act(kind="stall", after=2))
    async with client.stream("POST", "/v1/chat/completions", json=_program("victim", stream=True)) as r:
        chunks = r.aiter_bytes()
        await chunks.__anext__()
        doc = await await_diagnostics(client, lambda d: any(x["open_leases"] == 1 for x in d["data_plane"]["relays"]))
        victim = next(x for x in doc["data_plane"]["relays"] if x["open_leases"] == 1)
        os.kill(victim["pid"], signal.SIGKILL)
        rest = b""
        with pytest.raises(httpx.HTTPError):  # the connection is cut: no clean end of the body
            async for chunk in chunks:
                rest += chunk
        assert b"[DONE]" not in rest
    doc = await await_diagnostics(
        client,
        lambda d: (
            _at_rest(d)
            and d["data_plane"]["relays"][victim["index"]]["restarts_count"] == 1
            and d["data_plane"]["relays"][victim["index"]]["accepting"]
        ),
    )
    assert doc["data_plane"]["open_leases"] == 0  # (the relay_leases_abandoned log names the count)
    # counted over the position's processes: the restarted relay's own count began at 0 (session 35)
    assert (
        doc["data_plane"]["relays"][victim["index"]]["abandoned_on_close_count"]
        == victim["abandoned_on_close_count"] + 1
    )
    scrape = await client.get("/metrics")
    assert scrape.status_code == 200
    assert "agentd_proxy_requests_total" in scrape.text
    answer = await client.post("/v1/chat/completions", json=_program("after"))
    assert answer.status_code == 200
