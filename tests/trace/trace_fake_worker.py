"""A tiny vLLM-like worker for replay tests (process boundary fake, via httpx.MockTransport).

Streams ``max_tokens`` one-token chunks (TTFT 0.1 s, then 0.01 s per token, in Trio time; a
non-streaming request gets the whole response at the same end time), caches
every served sequence (prompt + output) and reports the longest cached prefix in whole 16-token
blocks as ``cached_tokens``, and exposes vLLM's counters on ``/metrics``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio

from sim.tokenizer import render_chat, text_of_tokens, tokenize

BLOCK = 16
TTFT_SECONDS = 0.1
ITL_SECONDS = 0.01


class FakeWorker:
    def __init__(self) -> None:
        self.sequences: list[list[int]] = []
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.preemptions = 0  # reported as vllm:num_preemptions_total

    def _cached(self, prompt: list[int]) -> int:
        best = 0
        for seq in self.sequences:
            n = 0
            for a, b in zip(seq, prompt, strict=False):  # the common prefix of two sequences
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, len(prompt) - 1) // BLOCK * BLOCK

    def metrics(self) -> str:
        return (
            "# TYPE vllm:prompt_tokens counter\n"
            f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {self.prompt_tokens_total}\n'
            "# TYPE vllm:prompt_tokens_cached counter\n"
            f'vllm:prompt_tokens_cached_total{{engine="0",model_name="m"}} {self.cached_tokens_total}\n'
            "# TYPE vllm:num_preemptions counter\n"
            f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {self.preemptions}\n'
        )

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics())
        body = json.loads(await request.aread())
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        prompt = render_chat(body["messages"])
        cached = self._cached(prompt)
        self.prompt_tokens_total += len(prompt)
        self.cached_tokens_total += cached
        n = body["max_tokens"]
        text = text_of_tokens(n, salt=request.headers.get("x-request-id", ""))
        pieces = [text.split(" ")[0]] + [" " + w for w in text.split(" ")[1:]]
        self.sequences.append(prompt + tokenize(text))
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": n,
            "total_tokens": len(prompt) + n,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

        if not body.get("stream", False):
            await trio.sleep(TTFT_SECONDS + ITL_SECONDS * len(pieces))
            message = {"role": "assistant", "content": text}
            payload = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}
            return httpx.Response(200, json=payload)

        async def stream() -> AsyncIterator[bytes]:
            await trio.sleep(TTFT_SECONDS)
            for piece in pieces:
                await trio.sleep(ITL_SECONDS)
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())
