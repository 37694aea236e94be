"""OpenAI response bodies and the SSE stream of the simulated server (vLLM shapes, docs/simulator.md §3).

Streaming: the first frame carries ``delta {role: "assistant", content: ""}`` and is sent with the
first token (vLLM sends nothing while a prefill runs); then one frame per output token, the last one
carrying ``finish_reason``; then, with ``stream_options.include_usage``, a frame with empty
``choices`` and the usage; then ``data: [DONE]``.  Frames never carry a ``usage`` key unless
``continuous_usage_stats`` is set together with ``include_usage``.  If the engine drops the
request, an ``error`` frame and ``[DONE]`` end the stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

from sim.engine import EngineOutput
from sim.requests import ParsedRequest

DONE = b"data: [DONE]\n\n"


def _frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage(parsed: ParsedRequest, completion_tokens: int, cached: int) -> dict[str, Any]:
    prompt = len(parsed.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": max(cached, 0)},
    }


def token_logprobs(parsed: ParsedRequest, first: int, end: int, *, chat: bool) -> dict[str, Any] | None:
    """The ``logprobs`` of output tokens ``[first, end)`` in OpenAI's chat or completions shape, or
    None when the request asked for none.  The simulated output is certain: every token has
    logprob 0.0 and is its own only top alternative (docs/simulator.md §3)."""
    if parsed.logprobs is None:
        return None
    pieces = parsed.output.pieces[first:end]
    top = parsed.logprobs
    if chat:
        content = []
        for piece in pieces:
            entry = {"token": piece, "logprob": 0.0, "bytes": list(piece.encode())}
            content.append({**entry, "top_logprobs": [entry] if top else []})
        return {"content": content}
    offsets, offset = [], len(parsed.echo_text) + parsed.output.text_start(first)
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {
        "text_offset": offsets,
        "token_logprobs": [0.0] * len(pieces),
        "tokens": list(pieces),
        "top_logprobs": [{piece: 0.0} if top else {} for piece in pieces],
    }


def final_response(
    parsed: ParsedRequest, *, response_id: str, created: int, model: str, chat: bool, num_cached_tokens: int
) -> dict[str, Any]:
    out = parsed.output
    n = len(out.token_ids)
    if chat:
        call = out.tool_call
        if call is not None:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "reasoning_content": None,
                "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                ],
            }
        else:
            message = {"role": "assistant", "content": "".join(out.pieces), "reasoning_content": None, "tool_calls": []}
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": token_logprobs(parsed, 0, n, chat=True),
            "finish_reason": out.finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": parsed.echo_text + "".join(out.pieces),
            "logprobs": token_logprobs(parsed, 0, n, chat=False),
            "finish_reason": out.finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        obj = "text_completion"
    return {
        "id": response_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(parsed, n, num_cached_tokens),
        "prompt_logprobs": None,
    }


class SseStream:
    """Async iterator of SSE bytes for one streamed request; ``aclose()`` must be called."""

    def __init__(
        self,
        parsed: ParsedRequest,
        outputs: trio.MemoryReceiveChannel[EngineOutput],
        *,
        response_id: str,
        created: int,
        model: str,
        chat: bool,
        on_close: Callable[[bool], None],
    ) -> None:
        self._parsed = parsed
        self._outputs = outputs
        self._chat = chat
        self._on_close: Callable[[bool], None] | None = on_close
        self._done = False
        self._sent_first = False  # the role frame (chat) or the echoed prompt (completions) went out
        self._emitted = 0
        self._head: dict[str, Any] = {
            "id": response_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }

    def __aiter__(self) -> SseStream:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        try:
            out = await self._outputs.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._done = True
            return (
                _frame(
                    {
                        "error": {
                            "message": "request aborted by the engine",
                            "type": "InternalServerError",
                            "param": None,
                            "code": 500,
                        }
                    }
                )
                + DONE
            )
        frames = [self._token_frames(out)]
        if out.finish_reason is not None:
            self._done = True
            if self._parsed.include_usage:
                frames.append(
                    _frame(
                        {
                            **self._head,
                            "choices": [],
                            "usage": usage(self._parsed, self._emitted, out.num_cached_tokens),
                        }
                    )
                )
            frames.append(DONE)
            self._finish(aborted=False)
        return b"".join(frames)

    def _token_frames(self, out: EngineOutput) -> bytes:
        parsed = self._parsed
        pieces = parsed.output.pieces
        call = parsed.output.tool_call
        chunks: list[bytes] = []
        last = out.first_index + out.num_tokens - 1
        for i in range(out.first_index, last + 1):
            finish = out.finish_reason if i == last else None
            if self._chat:
                if not self._sent_first:
                    self._sent_first = True
                    role = {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    chunks.append(_frame({**self._head, "choices": [role]}))
                delta: dict[str, Any] = {}
                if call is None:
                    if pieces[i]:
                        delta["content"] = pieces[i]
                elif i == call.name_tokens:
                    delta["tool_calls"] = [
                        {
                            "index": 0,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                elif pieces[i]:
                    delta["tool_calls"] = [{"index": 0, "function": {"arguments": pieces[i]}}]
                if not delta and finish is None:
                    continue  # vLLM sends no empty deltas
                logprobs = token_logprobs(parsed, i, i + 1, chat=True)
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            else:
                if not pieces[i] and finish is None:
                    continue
                logprobs = token_logprobs(parsed, i, i + 1, chat=False)
                text = pieces[i] if self._sent_first else parsed.echo_text + pieces[i]
                self._sent_first = True  # completions: the prompt is echoed in the first frame only
                choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None}
            if finish is not None:
                choice["stop_reason"] = None
            payload = {**self._head, "choices": [choice]}
            if parsed.continuous_usage:
                payload["usage"] = usage(parsed, i + 1, out.num_cached_tokens)
            chunks.append(_frame(payload))
        self._emitted = last + 1
        return b"".join(chunks)

    def _finish(self, *, aborted: bool) -> None:
        on_close, self._on_close = self._on_close, None
        self._outputs.close()
        if on_close is not None:
            on_close(aborted)

    async def aclose(self) -> None:
        self._finish(aborted=not self._done)


# ---------------------------------------------------------------------------- the Responses API
def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return (
        f"event: {kind}\ndata: ".encode()
        + json.dumps({"type": kind, **payload}, separators=(",", ":")).encode()
        + b"\n\n"
    )


class ResponsesShape:
    """The Responses API objects of one request (docs/simulator.md §3): what ``POST /v1/responses``
    answers, or streams as events, for the chat request it stands for (``parsed``)."""

    def __init__(self, parsed: ParsedRequest, body: dict[str, Any], *, response_id: str, created: int, model: str):
        self.parsed = parsed
        self.body = body
        self.id = response_id
        self.created = created
        self.model = model
        suffix = response_id.removeprefix("resp_")
        self.item_id = ("fc_" if parsed.output.tool_call is not None else "msg_") + suffix

    def response(self, status: str, output: list[dict[str, Any]], usage_: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        incomplete = status == "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "model": self.model,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "temperature": body.get("temperature", 1.0),
            "text": body["text"] if isinstance(body.get("text"), dict) else {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "metadata": body.get("metadata") or {},
            "usage": usage_,
        }

    def item(self, done: bool, text: str) -> dict[str, Any]:
        call = self.parsed.output.tool_call
        status = "completed" if done else "in_progress"
        if call is not None:
            return {
                "type": "function_call",
                "id": self.item_id,
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments if done else "",
                "status": status,
            }
        content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": content}

    def usage(self, output_tokens: int, cached: int) -> dict[str, Any]:
        prompt = len(self.parsed.prompt_ids)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": max(cached, 0)},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output_tokens,
        }

    def status(self, finish_reason: str | None) -> str:
        return "incomplete" if finish_reason == "length" else "completed"

    def final(self, num_cached_tokens: int) -> dict[str, Any]:
        out = self.parsed.output
        text = "".join(out.pieces)
        return self.response(
            self.status(out.finish_reason), [self.item(True, text)], self.usage(len(out.token_ids), num_cached_tokens)
        )


class ResponsesStream:
    """Async iterator of the Responses API's SSE events for one streamed request (``response.created``,
    ``response.in_progress``, ``response.output_item.added``, text or function-call argument deltas,
    their ``.done`` events, ``response.output_item.done``, ``response.completed`` with the usage);
    ``aclose()`` must be called.  No ``[DONE]`` line, as OpenAI's and vLLM's streams."""

    def __init__(
        self, shape: ResponsesShape, outputs: trio.MemoryReceiveChannel[EngineOutput], on_close: Callable[[bool], None]
    ) -> None:
        self._shape = shape
        self._outputs = outputs
        self._on_close: Callable[[bool], None] | None = on_close
        self._done = False
        self._started = False
        self._seq = 0
        self._text: list[str] = []

    def __aiter__(self) -> ResponsesStream:
        return self

    def _ev(self, kind: str, **payload: Any) -> bytes:
        self._seq += 1
        return _event(kind, {"sequence_number": self._seq - 1, **payload})

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        shape = self._shape
        try:
            out = await self._outputs.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._done = True
            failed = shape.response("failed", [], None)
            failed["error"] = {"code": "server_error", "message": "request aborted by the engine"}
            return self._ev("response.failed", response=failed)
        call = shape.parsed.output.tool_call
        frames: list[bytes] = []
        where = {"item_id": shape.item_id, "output_index": 0}
        if not self._started:
            self._started = True
            pending = shape.response("in_progress", [], None)
            frames += [
                self._ev("response.created", response=pending),
                self._ev("response.in_progress", response=pending),
            ]
            frames.append(self._ev("response.output_item.added", output_index=0, item=shape.item(False, "")))
            if call is None:
                part = {"type": "output_text", "text": "", "annotations": []}
                frames.append(self._ev("response.content_part.added", **where, content_index=0, part=part))
        pieces = shape.parsed.output.pieces
        for i in range(out.first_index, out.first_index + out.num_tokens):
            first_call_token = call is not None and i <= call.name_tokens  # the name, sent with the item
            if pieces[i] and not first_call_token:
                self._text.append(pieces[i])
                if call is None:
                    frames.append(
                        self._ev("response.output_text.delta", **where, content_index=0, delta=pieces[i], logprobs=[])
                    )
                else:
                    frames.append(self._ev("response.function_call_arguments.delta", **where, delta=pieces[i]))
        if out.finish_reason is not None:
            self._done = True
            text = "".join(self._text)
            if call is None:
                part = {"type": "output_text", "text": text, "annotations": []}
                frames.append(self._ev("response.output_text.done", **where, content_index=0, text=text, logprobs=[]))
                frames.append(self._ev("response.content_part.done", **where, content_index=0, part=part))
            else:
                frames.append(self._ev("response.function_call_arguments.done", **where, arguments=call.arguments))
            item = shape.item(True, text)
            frames.append(self._ev("response.output_item.done", output_index=0, item=item))
            n = out.first_index + out.num_tokens
            status = shape.status(out.finish_reason)
            final = shape.response(status, [item], shape.usage(n, out.num_cached_tokens))
            frames.append(
                self._ev("response.completed" if status == "completed" else "response.incomplete", response=final)
            )
            self._finish(aborted=False)
        return b"".join(frames)

    def _finish(self, *, aborted: bool) -> None:
        on_close, self._on_close = self._on_close, None
        self._outputs.close()
        if on_close is not None:
            on_close(aborted)

    async def aclose(self) -> None:
        self._finish(aborted=not self._done)
