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
            "logprobs": None,
            "finish_reason": out.finish_reason,
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": "".join(out.pieces),
            "logprobs": None,
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
        self._sent_role = False
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
                if not self._sent_role:
                    self._sent_role = True
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
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                if not pieces[i] and finish is None:
                    continue
                choice = {"index": 0, "text": pieces[i], "logprobs": None, "finish_reason": finish, "stop_reason": None}
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
