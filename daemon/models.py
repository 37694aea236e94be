"""Model pools: which workers serve which model, and where a request for a model may go.

Each worker's served models come from ``routing.served_models`` (config, wins) or from its
``GET /v1/models`` (:func:`discover_models`): at start, then again every health-check interval
(:func:`run_model_discovery`), so a worker that is restarted with another model is followed.  The
cost is bounded: one GET per worker per interval, concurrently, each within the health-check
timeout and reading at most :data:`MAX_MODELS_BODY_BYTES` and :data:`MAX_MODELS_PER_WORKER` ids.
A refresh that fails keeps the last list read (a transient error does not turn a worker into one
that serves anything); a change of list is logged once (``models_changed``).  The requests carry
the worker credentials of the transport they go through (``[worker_auth]`` or the worker URL's
user-info, :class:`daemon.upstream.UpstreamTransport`).  A worker whose models are unknown (not
configured, or never read; the embedded simulated workers serve ``[embedded] model``) is taken to
serve every model, so nothing changes where nothing is known.

:meth:`ModelDirectory.route` maps a request's ``model`` to its pool: the targets of the workers
serving it.  When every target serves the model (the single-model fleet, or no ``model`` given)
the pool is the core's ``DEFAULT_MODEL_POOL`` and nothing is filtered - exactly the behaviour
without pools.  Otherwise the pool is named after the model, requests go only to its targets
(native policies and Program scheduling alike; the core keys Program state by pool), and a model
no known worker serves is a 404 ``model_not_found`` (docs/operations.md, "Bad input, request ids
and model pools").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import trio

from actors.core.config import BackendTarget
from actors.core.ids import DEFAULT_MODEL_POOL
from actors.logevents import get_logger, log_event
from daemon.http.errors import ApiError

logger = get_logger("models")
MAX_MODELS_BODY_BYTES = 1024 * 1024  # a bigger /v1/models answer is not a list agentd uses
MAX_MODELS_PER_WORKER = 1024


class ModelDirectory:
    """Served models per worker URL (``None`` = unknown: serves any model)."""

    def __init__(self, targets: Sequence[BackendTarget], configured: Mapping[str, Sequence[str]] | None = None) -> None:
        self.targets = tuple(targets)
        self.worker_urls = tuple(dict.fromkeys(t.worker_url for t in self.targets))
        given = {url.rstrip("/"): frozenset(models) for url, models in (configured or {}).items()}
        self.models: dict[str, frozenset[str] | None] = {url: given.get(url) for url in self.worker_urls}
        self.configured = frozenset(url for url in self.worker_urls if url in given)
        self._routes: dict[str | None, tuple[str, frozenset[int] | None]] = {}
        self.logged: dict[str, tuple[frozenset[str] | None, str]] = {}  # last logged discovery per worker

    def unknown(self) -> tuple[str, ...]:
        """Workers (not configured) whose served models are not known yet."""
        return tuple(u for u in self.worker_urls if u not in self.configured and self.models[u] is None)

    def set_models(self, worker_url: str, models: frozenset[str] | None) -> None:
        if worker_url in self.configured:
            return
        self.models[worker_url] = models
        self._routes.clear()

    def route(self, model: str | None) -> tuple[str, frozenset[int] | None]:
        """(pool name, eligible target indices or None for all); 404 when no worker serves it."""
        cached = self._routes.get(model)
        if cached is not None:
            return cached
        if model is None:
            return DEFAULT_MODEL_POOL, None
        serving = {url for url, models in self.models.items() if models is None or model in models}
        if not serving:
            known = sorted({m for models in self.models.values() if models is not None for m in models})
            raise ApiError(
                404,
                f"model {model[:128]!r} is not served by any worker (served: {', '.join(known)[:512]})",
                code="model_not_found",
                param="model",
            )
        if len(serving) == len(self.worker_urls):
            route: tuple[str, frozenset[int] | None] = (DEFAULT_MODEL_POOL, None)
        else:
            route = (model, frozenset(t.index for t in self.targets if t.worker_url in serving))
        if len(self._routes) < 1024:  # bounded: only models some worker serves get here
            self._routes[model] = route
        return route

    def document(self) -> list[dict[str, object]]:
        """Diagnostics: each worker's served models and where they came from."""
        return [
            {
                "worker_url": url,
                "models": None if self.models[url] is None else sorted(self.models[url] or ()),
                "source": "config" if url in self.configured else "discovered" if self.models[url] else "unknown",
            }
            for url in self.worker_urls
        ]


def with_pool_models(content: bytes, directory: ModelDirectory) -> bytes:
    """A worker's ``/v1/models`` answer completed with the models other workers serve (model pools:
    one worker's list is not the fleet's); unchanged when it is not a model list."""
    payload = _model_list(content)
    if payload is None:
        return content
    listed = {m.get("id") for m in payload["data"] if isinstance(m, dict)}
    extra = sorted({m for models in directory.models.values() if models for m in models} - listed)
    if not extra:
        return content
    payload["data"].extend({"id": m, "object": "model", "owned_by": "agentd"} for m in extra)
    return json.dumps(payload).encode()


def find_model(content: bytes, model_id: str) -> dict[str, object] | None:
    """The entry of ``model_id`` in an OpenAI ``/v1/models`` answer, None when it is not listed
    (or the answer is not a model list)."""
    payload = _model_list(content)
    if payload is None:
        return None
    return next((m for m in payload["data"] if isinstance(m, dict) and m.get("id") == model_id), None)


def _model_list(content: bytes) -> dict[str, Any] | None:
    """The decoded ``/v1/models`` answer when it is a model list with at least one id, else None."""
    try:
        payload = json.loads(content)
    except ValueError:
        return None
    return payload if served_model_ids(payload) is not None else None


def served_model_ids(payload: object) -> frozenset[str] | None:
    """The model ids of an OpenAI ``/v1/models`` answer, None when it is not one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return None
    ids = frozenset(m["id"] for m in payload["data"] if isinstance(m, dict) and isinstance(m.get("id"), str))
    return ids or None


async def _read_models(client: httpx.AsyncClient, url: str) -> tuple[frozenset[str] | None, str]:
    """One worker's model list and the reason kind (``ok`` or why not), reading a bounded body."""
    try:
        async with client.stream("GET", f"{url}/v1/models") as response:
            if response.status_code != 200:
                return None, f"HTTP {response.status_code} without a model list"
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_MODELS_BODY_BYTES:
                    return None, f"answer larger than {MAX_MODELS_BODY_BYTES} bytes"
        models = served_model_ids(json.loads(body))
    except (httpx.HTTPError, ValueError, RecursionError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if models is None:
        return None, "HTTP 200 without a model list"
    if len(models) > MAX_MODELS_PER_WORKER:
        return None, f"more than {MAX_MODELS_PER_WORKER} models"
    return models, "ok"


async def discover_models(
    directory: ModelDirectory, client: httpx.AsyncClient, timeout_seconds: float, urls: Sequence[str] | None = None
) -> None:
    """``GET <worker>/v1/models`` for the given workers (default: every one not configured),
    concurrently.  A failure leaves a worker's models as they were (unknown if never read: it then
    serves any model).  Logged once per change: ``models_discovered`` for a worker's first list or
    a change of its failure kind, ``models_changed`` when a known list changes."""

    async def one(url: str) -> None:
        models: frozenset[str] | None = None
        reason = "timeout"
        with trio.move_on_after(timeout_seconds):
            models, reason = await _read_models(client, url)
        before = directory.models.get(url)
        kind = reason.split(":")[0]
        if models is not None and before is not None and models != before:
            directory.set_models(url, models)
            directory.logged[url] = (models, kind)
            log_event(
                logger,
                logging.WARNING,
                "models_changed",
                worker=url,
                models=",".join(sorted(models)),
                added=",".join(sorted(models - before)),
                removed=",".join(sorted(before - models)),
            )
            return
        if models is not None:
            directory.set_models(url, models)
        shown_models = models if models is not None else before
        if directory.logged.get(url) != (shown_models, kind):
            directory.logged[url] = (shown_models, kind)
            level = logging.INFO if models is not None else logging.WARNING
            shown = None if shown_models is None else ",".join(sorted(shown_models))
            log_event(logger, level, "models_discovered", worker=url, models=shown, reason=reason)

    targets = [u for u in directory.worker_urls if u not in directory.configured] if urls is None else list(urls)
    async with trio.open_nursery() as nursery:
        for url in targets:
            nursery.start_soon(one, url)


async def run_model_discovery(
    directory: ModelDirectory,
    client: httpx.AsyncClient,
    interval_seconds: float,
    timeout_seconds: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Discover every worker's models, report started, then read every (not configured) worker's
    list again every ``interval_seconds``: a worker down at start is learnt when it comes up, and a
    worker restarted with other models is followed (see the module docstring)."""
    await discover_models(directory, client, timeout_seconds)
    task_status.started()
    if len(directory.configured) == len(directory.worker_urls):
        return
    while True:
        await trio.sleep(interval_seconds)
        await discover_models(directory, client, timeout_seconds)
