"""Transport-agnostic vLLM-compatible OpenAI API of the simulated server.

``SimApi.handle(ApiRequest) -> ApiResponse`` is used by the Quart-Trio server (``server.py``) and by
the in-process httpx transport (``transport.py``).  A response either has a ``body`` or a
``stream`` (an async iterator of SSE bytes fed as the engine emits tokens; the adapter must
``aclose()`` it, which aborts the request if it is still running).

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /v1/responses``, ``POST /v1/embeddings``, ``POST /tokenize``,
``POST /detokenize``, ``POST /v1/chat/completions/render`` and ``/v1/completions/render``
(vllm-router's cache_aware policy), ``GET /get_load``,
``GET /version``, ``GET /metrics`` (see ``metrics.py``).

Request parsing and response shapes live in ``requests.py`` and ``responses.py``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import struct
import time
from collections.abc import Mapping
from typing import Any

import attrs
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sim.cluster import SimCluster
from sim.engine import EngineOutput, Request
from sim.metrics import SimCollector
from sim.requests import (
    EMBEDDING_DIMENSIONS,
    ApiError,
    ParsedRequest,
    embedding_vector,
    parse_embeddings,
    parse_generation,
    parse_tokenize,
    responses_to_chat,
)
from sim.responses import ResponsesShape, ResponsesStream, SseStream, final_response

JSON = "application/json"


@attrs.frozen
class ApiRequest:
    method: str
    path: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes = b""


@attrs.frozen(eq=False)
class ApiResponse:
    status: int
    content_type: str
    body: bytes = b""
    stream: SseStream | ResponsesStream | None = None
    headers: tuple[tuple[str, str], ...] = ()


def json_response(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> ApiResponse:
    return ApiResponse(status, JSON, json.dumps(payload, separators=(",", ":")).encode(), headers=headers)


def error_response(err: ApiError) -> ApiResponse:
    return json_response(err.status, err.payload())


def wall_clock_epoch() -> float:
    """The Unix time at Trio time 0 of the current run: ``created_epoch`` for a simulator serving
    real clients on the real clock (``agentd sim-backend``, the daemon's embedded backend)."""
    return time.time() - trio.current_time()


class SimApi:
    """``created_epoch`` is the Unix time that the cluster's clock (``trio.current_time()``) counts
    from: a response's ``created`` is ``int(created_epoch + now)``, an int Unix time as vLLM sends.
    The default 0.0 keeps every field deterministic under MockClock (virtual time only); servers
    on the real clock pass :func:`wall_clock_epoch` (docs/simulator.md §3)."""

    def __init__(
        self, cluster: SimCluster, registry: CollectorRegistry | None = None, *, created_epoch: float = 0.0
    ) -> None:
        self.cluster = cluster
        self.created_epoch = created_epoch
        # an exposition rendered while every engine was idle is served again until one of them changes
        # (only for the API's own registry, whose one collector reads nothing but the engines)
        self._cache_metrics = registry is None
        self._metrics_cache: tuple[tuple[tuple[int, int, int] | None, ...], bytes] | None = None
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.registry.register(SimCollector(cluster))
        self._in_flight: dict[str, int] = {}
        self._anon_counter: dict[str, int] = {}

    def _exposition(self) -> bytes:
        """The /metrics text. Rendering it costs about 15 ms for a few ranks, and the daemon scrapes
        every second, which made long idle stretches of a simulated trace (hours of tool or human
        time) cost seconds of CPU per virtual hour; while all engines are idle the text cannot
        change until one of them does (``Engine.idle_key``)."""
        if not self._cache_metrics:
            return generate_latest(self.registry)
        key = tuple(engine.idle_key() for engine in self.cluster.engines)
        cached = self._metrics_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        text = generate_latest(self.registry)
        self._metrics_cache = (key, text) if None not in key else None
        return text

    async def handle(self, req: ApiRequest) -> ApiResponse:
        path = req.path.split("?", 1)[0].rstrip("/") or "/"
        method = req.method.upper()
        try:
            if method == "GET":
                return self._get(path, req)
            if method == "POST":
                if path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
                    return await self._generate(path, req)
                if path in ("/tokenize", "/v1/chat/completions/render", "/v1/completions/render"):
                    return self._tokenize(path, req)
                if path == "/detokenize":
                    return self._detokenize(req)
                if path == "/v1/embeddings":
                    return self._embeddings(req)
            if path in _KNOWN_PATHS:
                raise ApiError(405, f"Method {method} not allowed for {path}", "MethodNotAllowed")
            raise ApiError(404, f"Not Found: {path}", "NotFoundError")
        except ApiError as err:
            return error_response(err)

    # ------------------------------------------------------------------ simple endpoints
    def _get(self, path: str, req: ApiRequest) -> ApiResponse:
        cluster = self.cluster
        if path in ("/health", "/ping"):
            return ApiResponse(200, "text/plain", b"")
        if path == "/v1/models":
            model = cluster.config.model
            card = {
                "id": model,
                "object": "model",
                "created": int(self.created_epoch + cluster.now()),  # vLLM: time.time() per call
                "owned_by": "vllm",
                "root": model,
                "parent": None,
                "max_model_len": cluster.max_model_len,
                "permission": [],
            }
            return json_response(200, {"object": "list", "data": [card]})
        if path == "/metrics":
            return ApiResponse(200, CONTENT_TYPE_LATEST, self._exposition())
        if path in ("/get_load", "/load"):
            rank = _rank_header(req.headers)
            engines = cluster.engines if rank is None or not 0 <= rank < cluster.dp_size else [cluster.engines[rank]]
            return json_response(200, {"load": sum(e.num_running + e.num_waiting for e in engines)})
        if path == "/version":
            return json_response(200, {"version": "agentd-sim"})
        if path in ("/get_model_info", "/get_server_info", "/server_info"):
            e = cluster.config.engine
            return json_response(
                200,
                {
                    "model_path": cluster.config.model,
                    "data_parallel_size": cluster.dp_size,
                    "block_size": e.block_size,
                    "num_gpu_blocks": e.num_gpu_blocks,
                    "max_num_seqs": e.max_num_seqs,
                    "scheduling_policy": e.scheduling_policy,
                    "max_model_len": cluster.max_model_len,
                },
            )
        if path in _KNOWN_PATHS:
            raise ApiError(405, f"Method GET not allowed for {path}", "MethodNotAllowed")
        raise ApiError(404, f"Not Found: {path}", "NotFoundError")

    def _tokenize(self, path: str, req: ApiRequest) -> ApiResponse:
        body = _json_body(req.body)
        tokens = parse_tokenize(body, chat=path == "/v1/chat/completions/render" or "messages" in body)
        if path.endswith("/render"):
            return json_response(200, {"token_ids": tokens, "count": len(tokens)})
        return json_response(200, {"count": len(tokens), "max_model_len": self.cluster.max_model_len, "tokens": tokens})

    def _detokenize(self, req: ApiRequest) -> ApiResponse:
        body = _json_body(req.body)
        if "tokens" not in body:
            raise ApiError(400, "tokens: field required", param="tokens")
        raise ApiError(400, "tokens: detokenize is not supported by the simulator's hashing tokenizer", param="tokens")

    def _embeddings(self, req: ApiRequest) -> ApiResponse:
        """``POST /v1/embeddings`` in vLLM's shape; served at once, outside the engines' batches
        and KV (docs/simulator.md §3: an embedding costs the simulated cluster nothing)."""
        cluster = self.cluster
        body = _json_body(req.body)
        inputs = parse_embeddings(body, model=cluster.config.model, max_model_len=cluster.max_model_len)
        dims = body.get("dimensions") or EMBEDDING_DIMENSIONS
        data: list[dict[str, Any]] = []
        for i, ids in enumerate(inputs):
            vector = embedding_vector(ids, dims)
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
            data.append({"index": i, "object": "embedding", "embedding": encoded})
        tokens = sum(len(ids) for ids in inputs)
        payload = {
            "id": "embd-" + _digest(cluster.config.seed, req.body),
            "object": "list",
            "created": int(self.created_epoch + cluster.now()),
            "model": cluster.config.model,
            "data": data,
            "usage": {
                "prompt_tokens": tokens,
                "total_tokens": tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }
        return json_response(200, payload)

    # ------------------------------------------------------------------ generation
    async def _generate(self, path: str, req: ApiRequest) -> ApiResponse:
        cluster = self.cluster
        responses = path == "/v1/responses"  # the chat request it stands for (docs/simulator.md §3)
        chat = path == "/v1/chat/completions" or responses
        body = _json_body(req.body)
        if responses:
            parsed = _responses_generation(body, cluster)
        else:
            parsed = parse_generation(body, chat=chat, cluster=cluster)
        rank = _rank_header(req.headers)
        try:
            cluster.check_rank(rank)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="X-data-parallel-rank") from None
        base = req.headers.get("x-request-id") or (
            body.get("request_id") if isinstance(body.get("request_id"), str) else None
        )
        if not base:
            digest = _digest(cluster.config.seed, req.body)
            n = self._anon_counter.get(digest, 0)
            self._anon_counter[digest] = n + 1
            base = digest if n == 0 else f"{digest}-{n}"
        response_id = ("resp_" if responses else "chatcmpl-" if chat else "cmpl-") + base
        engine_id = response_id
        n = self._in_flight.get(response_id, 0)
        if n:
            engine_id = f"{response_id}-{n}"
        self._in_flight[response_id] = n + 1
        engine_req = Request(
            engine_id,
            parsed.prompt_ids,
            parsed.output.token_ids,
            finish_reason=parsed.output.finish_reason,
            priority=parsed.priority,
            cache_salt=parsed.cache_salt,
            skip_prefix_cache=parsed.skip_prefix_cache,
        )
        created = int(self.created_epoch + cluster.now())
        try:
            outputs = await cluster.submit(
                engine_req, dp_rank=rank, order_key=(response_id, req.body), final_only=not parsed.stream
            )
        except BaseException:
            self._release(response_id)
            raise
        headers = (("x-request-id", response_id),)
        shape = (
            ResponsesShape(parsed, body, response_id=response_id, created=created, model=cluster.config.model)
            if responses
            else None
        )
        if parsed.stream and shape is not None:
            events = ResponsesStream(
                shape, outputs, lambda aborted: self._finish(engine_id, response_id, aborted=aborted)
            )
            return ApiResponse(200, "text/event-stream; charset=utf-8", stream=events, headers=headers)
        if parsed.stream:
            stream = SseStream(
                parsed,
                outputs,
                response_id=response_id,
                created=created,
                model=cluster.config.model,
                chat=chat,
                on_close=lambda aborted: self._finish(engine_id, response_id, aborted=aborted),
            )
            return ApiResponse(200, "text/event-stream; charset=utf-8", stream=stream, headers=headers)
        try:
            async with outputs:
                last: EngineOutput | None = None
                async for out in outputs:
                    last = out
        finally:
            self._finish(engine_id, response_id, aborted=last is None or last.finish_reason is None)
        if last is None or last.finish_reason is None:
            raise ApiError(500, "request aborted by the engine", "InternalServerError")
        if shape is not None:
            return json_response(200, shape.final(last.num_cached_tokens), headers)
        payload = final_response(
            parsed,
            response_id=response_id,
            created=created,
            model=cluster.config.model,
            chat=chat,
            num_cached_tokens=last.num_cached_tokens,
        )
        return json_response(200, payload, headers)

    def _finish(self, engine_id: str, response_id: str, *, aborted: bool) -> None:
        if aborted:
            # a response closed after the cluster's task ended (a run stopped by Ctrl-C closes the
            # cluster before the proxies' responses): there is nothing left to abort
            with contextlib.suppress(trio.BrokenResourceError):
                self.cluster.abort(engine_id)
        self._release(response_id)

    def _release(self, response_id: str) -> None:
        n = self._in_flight.get(response_id, 0)
        if n <= 1:
            self._in_flight.pop(response_id, None)
        else:
            self._in_flight[response_id] = n - 1


_KNOWN_PATHS = frozenset(
    {
        "/health",
        "/ping",
        "/v1/models",
        "/metrics",
        "/get_load",
        "/load",
        "/version",
        "/get_model_info",
        "/get_server_info",
        "/server_info",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/tokenize",
        "/detokenize",
        "/v1/embeddings",
        "/v1/chat/completions/render",
        "/v1/completions/render",
    }
)


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", param="body") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", param="body")
    return body


def _rank_header(headers: Mapping[str, str]) -> int | None:
    raw = headers.get("x-data-parallel-rank")
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None  # vLLM silently ignores non-integer values


def _digest(seed: int, body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=12, key=str(seed).encode()).hexdigest()


# the chat fields a Responses request's own fields become (``responses_to_chat``), named back in
# its errors: the client sent ``max_output_tokens`` and ``input`` (docs/simulator.md §3)
_RESPONSES_FIELD_OF = {"max_completion_tokens": "max_output_tokens", "messages": "input"}


def _responses_generation(body: Mapping[str, Any], cluster: SimCluster) -> ParsedRequest:
    """``parse_generation`` of the chat request a ``POST /v1/responses`` body stands for, its errors
    naming the Responses fields (before session 43 a ``max_output_tokens`` beyond the context was
    refused naming ``max_completion_tokens``, a field the client never sent)."""
    try:
        return parse_generation(responses_to_chat(body), chat=True, cluster=cluster)
    except ApiError as exc:
        renamed = _RESPONSES_FIELD_OF.get(exc.param or "")
        if renamed is None:
            raise
        message = exc.message
        for chat_field, field in _RESPONSES_FIELD_OF.items():
            message = message.replace(chat_field, field)
        raise ApiError(exc.status, message, exc.err_type, param=renamed) from None
