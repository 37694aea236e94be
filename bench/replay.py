"""Replay an agent trace against any OpenAI-compatible endpoint (agentd, vllm-router, a worker).

The driver is transport-agnostic: ``run_replay`` takes an ``httpx.AsyncClient`` and a base URL, so
the same code runs over loopback sockets (``agentd replay``/``agentd bench``) and in process under
a ``trio.testing.MockClock`` (``agentd simulate``, tests).  All timing uses ``trio.current_time()``.

Program drivers (one Trio task per session):

- closed-loop traces start root sessions in trace order and hold at most ``concurrency`` root
  Programs (each with its subagents) in flight; open-loop traces (``poisson``/``bursts``) start
  each root at ``timestamp / time_scale`` whatever its place in the file (roots are taken in
  timestamp order, file order breaking ties; optionally also capped by ``concurrency``);
- turn ``t > 0`` is sent ``pre_gap_ms / time_scale`` after turn ``t-1`` completed and after every
  blocking subagent spawned so far completed;
- a subagent starts ``pre_gap_ms / time_scale`` after its parent's ``parent_turn`` completed;
- messages are the conversation so far: the shared prefix as the system message, then user/tool
  deltas of exact token sizes (``sim.tokenizer.text_of_tokens``) and the assistant replies
  exactly as streamed back, so each prompt extends the previous prompt plus its output and
  prefixes are really shared;
- requests stream with ``stream_options.include_usage`` and carry the canonical
  ``vllm_xargs.agentic_context`` (program_id, task_id, agent_id, parent_program_id, step_id,
  blocks_parent, expected_resume, priority), ``x-session-id`` = the task id (so session-hash
  policies have a key);
- batch records (a ``job``, docs/traces.md) are sent without Program identity (no agentic
  context, no session header) with ``X-Agentd-Class: batch`` (``daemon.batchfile``) and
  ``X-Request-Id: <session>-t<turn>#job_name[<job>]#``, streamed only when the record says so, with
  ``max_tokens`` = the record's output length (exact, ``ignore_eos``) and, for a record that ended
  with ``stop``, the simulator hint ``vllm_xargs.sim_output_tokens`` so that the simulated engine
  reports a natural stop (what a batch-job-aware scheduler learns decode lengths from); batch roots
  always start at their ``timestamp`` (open loop, not limited by ``concurrency``);
- interactive records (``request_class: interactive``) are sent like an agent turn but without
  Program identity (no agentic context, no session header), with ``X-Agentd-Class: interactive``;
  their roots start at their ``timestamp`` like batch roots;
- a record's ``tenant`` (when not ``default``) travels as the OpenAI ``user`` field and the
  ``X-Agentd-Tenant`` header; its ``priority`` (vLLM's convention, lower first) as the body's
  ``priority`` for interactive and batch records and as ``agentic_context.priority = -priority``
  (agentd's convention, larger first) for agent turns, and only when it is not 0.

A failed turn ends its Program (recorded, never retried: the systems under test own retries).
``bench.report`` turns the raw :class:`ReplayResult` plus metric scrapes into the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

from bench.trace.format import DEFAULT_TENANT, Trace, TraceRecord
from daemon.batchfile import BATCH_CLASS, BATCH_CLASS_HEADER
from sim.tokenizer import text_of_tokens, tokenize

TENANT_HEADER = "x-agentd-tenant"  # the tenant header replay sends (docs/traces.md, "Tenants and classes")
INTERACTIVE_CLASS = "interactive"


@attrs.frozen
class ReplayOptions:
    time_scale: float = 1.0  # trace times are divided by this (X times faster than recorded)
    concurrency: int | None = None  # None: trace meta for closed loop, unlimited for open loop
    model: str = "agentd-sim"
    path: str = "/v1/chat/completions"
    agentic_context: str = "object"  # object | string (JSON-string form for stock vLLM) | none
    session_header: bool = True
    request_timeout_seconds: float = 600.0
    # the simulator hints of tool-call and stop turns (vllm_xargs.sim_finish_reason/sim_tool_name,
    # docs/traces.md); stock vLLM ignores them, --no-sim-hints leaves them out
    sim_hints: bool = True


@attrs.frozen
class RequestResult:
    session_id: str
    turn: int
    start: float
    end: float
    first_token: float | None
    ok: bool
    status: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    job: str | None = None  # the record's batch job (None: an agent turn)
    tenant: str = DEFAULT_TENANT
    klass: str = "agent"  # interactive | agent | batch (TraceRecord.klass)
    priority: int = 0  # the record's priority (vLLM convention, lower first)


@attrs.frozen
class TaskResult:
    """One root Program together with its subagents (the "job" whose completion time counts)."""

    task_id: str
    start: float
    end: float
    ok: bool
    requests: int
    batch: bool = False  # a batch-job request (not a Program): left out of the JCT
    tenant: str = DEFAULT_TENANT
    klass: str = "agent"  # only agent tasks count in the report's JCT


@attrs.frozen
class ReplayResult:
    started: float
    finished: float
    requests: tuple[RequestResult, ...]
    tasks: tuple[TaskResult, ...]
    planned_requests: int
    planned_tasks: int  # every root, batch requests included
    planned_batch_requests: int = 0  # records with a job (docs/traces.md)
    planned_batch_tasks: int = 0  # of planned_tasks, the batch roots
    planned_interactive_tasks: int = 0  # of planned_tasks, the interactive roots


class _Progress:
    """Counts for the live progress line; written by the driver tasks (single Trio thread)."""

    def __init__(self, total_requests: int, total_tasks: int, callback: Callable[[dict[str, Any]], None] | None):
        self.total_requests = total_requests
        self.total_tasks = total_tasks
        self.done_requests = 0
        self.failed_requests = 0
        self.done_tasks = 0
        self.in_flight = 0
        self._callback = callback

    def emit(self) -> None:
        if self._callback is not None:
            self._callback(
                {
                    "done_requests": self.done_requests,
                    "total_requests": self.total_requests,
                    "failed_requests": self.failed_requests,
                    "done_tasks": self.done_tasks,
                    "total_tasks": self.total_tasks,
                    "in_flight": self.in_flight,
                }
            )


class _Replayer:
    def __init__(
        self, trace: Trace, client: httpx.AsyncClient, base_url: str, opts: ReplayOptions, progress: _Progress
    ):
        if not (opts.time_scale > 0 and math.isfinite(opts.time_scale)):
            raise ValueError(f"time_scale must be finite and > 0, got {opts.time_scale}")
        if opts.agentic_context not in ("object", "string", "none"):
            raise ValueError(f"agentic_context must be object|string|none, got {opts.agentic_context!r}")
        self.trace = trace
        self.client = client
        self.url = base_url.rstrip("/") + opts.path
        self.opts = opts
        self.sessions = trace.sessions()
        self.children: dict[tuple[str, int], list[str]] = {}
        for sid, recs in self.sessions.items():
            first = recs[0]
            if first.parent_session_id is not None and first.parent_turn is not None:
                self.children.setdefault((first.parent_session_id, first.parent_turn), []).append(sid)
        self.results: list[RequestResult] = []
        self.progress = progress

    # ------------------------------------------------------------------ programs

    async def run_task(self, root: str, start: float, done: list[TaskResult]) -> None:
        ends: list[float] = []
        ok_flags: list[bool] = []
        counts = [0]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_session, root, nursery, ends, ok_flags, counts)
        end = max(ends) if ends else trio.current_time()
        first = self.sessions[root][0]
        ok = all(ok_flags) and bool(ok_flags)
        done.append(TaskResult(root, start, end, ok, counts[0], first.is_batch, first.tenant, first.klass))
        self.progress.done_tasks += 1
        self.progress.emit()

    async def _run_session(
        self,
        sid: str,
        nursery: trio.Nursery,
        ends: list[float],
        ok_flags: list[bool],
        counts: list[int],
        parent_done: trio.Event | None = None,
    ) -> None:
        recs = self.sessions[sid]
        messages: list[dict[str, Any]] = []
        blocking: list[trio.Event] = []
        prev_end: float | None = None
        ok = True
        for rec in recs:
            for ev in blocking:
                await ev.wait()
            gap = rec.pre_gap_ms / 1000.0 / self.opts.time_scale
            if rec.turn > 0 or (rec.parent_session_id is not None and gap > 0):
                await trio.sleep(gap)
            messages = self._next_messages(messages, rec)
            result, reply = await self._send(rec, messages)
            counts[0] += 1
            prev_end = result.end
            if not result.ok or reply is None:
                ok = False
                break
            messages.append(reply)
            for child in self.children.get((sid, rec.turn), []):
                ev = trio.Event()
                if self.sessions[child][0].blocks_parent:
                    blocking.append(ev)
                nursery.start_soon(self._run_session, child, nursery, ends, ok_flags, counts, ev)
        if prev_end is not None:
            ends.append(prev_end)
        ok_flags.append(ok)
        if parent_done is not None:
            parent_done.set()

    # ------------------------------------------------------------------ requests

    def _next_messages(self, messages: list[dict[str, Any]], rec: TraceRecord) -> list[dict[str, Any]]:
        if rec.turn == 0 or rec.compaction:
            out: list[dict[str, Any]] = []
            if rec.shared_prefix_tokens > 0:
                salt = rec.shared_prefix_id or f"{rec.session_id}:system"
                out.append({"role": "system", "content": text_of_tokens(rec.shared_prefix_tokens, salt)})
            out.append({"role": "user", "content": text_of_tokens(rec.input_delta, f"{rec.session_id}:in{rec.turn}")})
            return out
        content = text_of_tokens(rec.input_delta, f"{rec.session_id}:in{rec.turn}")
        last = messages[-1] if messages else {}
        calls = last.get("tool_calls") if last.get("role") == "assistant" else None
        if rec.role == "tool" and calls:
            return [*messages, {"role": "tool", "tool_call_id": calls[0].get("id", "call-0"), "content": content}]
        return [*messages, {"role": "user", "content": content}]

    def _body(self, rec: TraceRecord, messages: list[dict[str, Any]]) -> dict[str, Any]:
        if rec.is_batch:
            return self._batch_body(rec, messages)
        body: dict[str, Any] = {
            "model": self.opts.model,
            "messages": messages,
            "max_tokens": rec.output_length,
            "min_tokens": rec.output_length,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if rec.tenant != DEFAULT_TENANT:
            body["user"] = rec.tenant
        if rec.is_interactive:
            if rec.priority:
                body["priority"] = rec.priority
            return body
        if self.opts.agentic_context != "none":
            first = self.sessions[rec.session_id][0]
            ctx: dict[str, Any] = {
                "program_id": rec.session_id,
                "task_id": rec.task_id or rec.session_id,
                "agent_id": rec.agent_id,
                "step_id": rec.turn,
                "expected_resume": True,
                # agentd's convention (larger first) of the trace's vLLM-convention priority
                "priority": -rec.priority,
            }
            if first.parent_session_id is not None:
                ctx["parent_program_id"] = first.parent_session_id
                ctx["blocks_parent"] = first.blocks_parent
            body["vllm_xargs"] = {"agentic_context": json.dumps(ctx) if self.opts.agentic_context == "string" else ctx}
        hints = self._sim_hints(rec)
        if hints:
            body["vllm_xargs"] = {**body.get("vllm_xargs", {}), **hints}
        return body

    def _sim_hints(self, rec: TraceRecord) -> dict[str, Any]:
        """How the simulated backend should end this agent turn (docs/traces.md, "Replay semantics"):
        a turn recorded as ``tool_calls`` whose next turn carries a named tool's result calls that
        tool; a ``stop`` turn stops; anything else ends by length, as before."""
        if not self.opts.sim_hints:
            return {}
        if rec.finish_reason == "stop":
            return {"sim_finish_reason": "stop"}
        if rec.finish_reason != "tool_calls":
            return {}
        recs = self.sessions[rec.session_id]
        nxt = recs[rec.turn + 1] if rec.turn + 1 < len(recs) else None
        if nxt is None or nxt.role != "tool" or not nxt.tool_name or nxt.compaction:
            return {}
        name = nxt.tool_name[:64]
        if rec.output_length < len(tokenize(name)) + 4:  # too short for the call's tokens
            return {}
        return {"sim_finish_reason": "tool_calls", "sim_tool_name": name}

    def _batch_body(self, rec: TraceRecord, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.opts.model,
            "messages": messages,
            "max_tokens": rec.output_length,
            "min_tokens": rec.output_length,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": rec.stream,
        }
        if rec.stream:
            body["stream_options"] = {"include_usage": True}
        if rec.finish_reason == "stop":
            # exactly output_length tokens and a natural stop: ``sim_output_tokens`` alone reports
            # "length" when it equals max_tokens (docs/simulator.md), and only natural stops feed
            # the batch decode estimates (docs/batch.md §1.2)
            body["vllm_xargs"] = {"sim_output_tokens": rec.output_length, "sim_finish_reason": "stop"}
        if rec.tenant != DEFAULT_TENANT:
            body["user"] = rec.tenant
        if rec.priority:
            body["priority"] = rec.priority
        return body

    def _headers(self, rec: TraceRecord) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if rec.tenant != DEFAULT_TENANT:
            headers[TENANT_HEADER] = rec.tenant
        if rec.is_batch:
            headers[BATCH_CLASS_HEADER] = BATCH_CLASS
            headers["x-request-id"] = f"{rec.session_id}-t{rec.turn}#job_name[{rec.job}]#"
            return headers
        if rec.is_interactive:
            headers[BATCH_CLASS_HEADER] = INTERACTIVE_CLASS
        elif self.opts.session_header:
            headers["x-session-id"] = rec.task_id or rec.session_id
        headers["x-request-id"] = f"{rec.session_id}-t{rec.turn}"
        return headers

    async def _send(
        self, rec: TraceRecord, messages: list[dict[str, Any]]
    ) -> tuple[RequestResult, dict[str, Any] | None]:
        start = trio.current_time()
        first_token: float | None = None
        usage: dict[str, Any] = {}
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        status: int | None = None
        error: str | None = None
        body = self._body(rec, messages)
        self.progress.in_flight += 1
        try:
            with trio.move_on_after(self.opts.request_timeout_seconds) as scope:
                async with self.client.stream(
                    "POST", self.url, json=body, headers=self._headers(rec), timeout=None
                ) as resp:
                    status = resp.status_code
                    if status != 200:
                        text = (await resp.aread()).decode("utf-8", "replace")
                        error = f"http_{status}: {text[:200]}"
                    elif not body["stream"]:
                        payload = json.loads(await resp.aread())
                        if not isinstance(payload, dict):
                            raise ValueError(f"response is not a JSON object: {str(payload)[:100]}")
                        usage = payload.get("usage") or {}
                        message = ((payload.get("choices") or [{}])[0]).get("message") or {}
                        if message.get("content"):
                            content.append(message["content"])
                        for i, call in enumerate(message.get("tool_calls") or []):
                            fn = call.get("function") or {}
                            calls[i] = {
                                "id": call.get("id"),
                                "name": fn.get("name") or "",
                                "arguments": fn.get("arguments") or "",
                            }
                    else:
                        done = False
                        # Read to the end of the body (like an SDK client): closing the stream right
                        # after [DONE] would look like a client disconnect to the server.
                        async for line in resp.aiter_lines():
                            if done or not line.startswith("data:"):
                                continue
                            data = line[5:].strip()
                            if data == "[DONE]":
                                done = True
                                continue
                            chunk = json.loads(data)
                            if "error" in chunk:
                                error = f"stream_error: {str(chunk['error'])[:200]}"
                                done = True
                                continue
                            if chunk.get("usage"):
                                usage = chunk["usage"]
                            for choice in chunk.get("choices") or []:
                                delta = choice.get("delta") or {}
                                piece = delta.get("content")
                                if piece:
                                    content.append(piece)
                                for call in delta.get("tool_calls") or []:
                                    slot = calls.setdefault(
                                        int(call.get("index", 0)), {"id": None, "name": "", "arguments": ""}
                                    )
                                    if call.get("id"):
                                        slot["id"] = call["id"]
                                    fn = call.get("function") or {}
                                    slot["name"] += fn.get("name") or ""
                                    slot["arguments"] += fn.get("arguments") or ""
                                if first_token is None and (piece or delta.get("tool_calls")):
                                    first_token = trio.current_time()
            if scope.cancelled_caught:
                error = "timeout"
        except (httpx.HTTPError, json.JSONDecodeError, ValueError) as exc:
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            self.progress.in_flight -= 1
        end = trio.current_time()
        ok = error is None and status == 200
        details = usage.get("prompt_tokens_details") or {}
        result = RequestResult(
            session_id=rec.session_id,
            turn=rec.turn,
            start=start,
            end=end,
            first_token=first_token,
            ok=ok,
            status=status,
            error=error,
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
            completion_tokens=usage.get("completion_tokens"),
            job=rec.job,
            tenant=rec.tenant,
            klass=rec.klass,
            priority=rec.priority,
        )
        self.results.append(result)
        self.progress.done_requests += 1
        if not ok:
            self.progress.failed_requests += 1
        self.progress.emit()
        if not ok:
            return result, None
        reply: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
        if calls:
            reply["tool_calls"] = [
                {
                    "id": c["id"] or f"call-{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for i, c in sorted(calls.items())
            ]
        return result, reply


def replay_client() -> httpx.AsyncClient:
    """A client for replaying over sockets: no cap on connections (one per in-flight request), no
    client-side timeout (``ReplayOptions.request_timeout_seconds`` bounds each request)."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024), timeout=None)


async def run_replay(
    trace: Trace,
    client: httpx.AsyncClient,
    base_url: str,
    opts: ReplayOptions | None = None,
    *,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> ReplayResult:
    """Drive ``trace`` against ``base_url`` through ``client``; returns when every Program ended."""
    opts = opts or ReplayOptions()
    roots = [sid for sid, recs in trace.sessions().items() if recs[0].parent_session_id is None]
    prog = _Progress(len(trace.records), len(roots), progress)
    rep = _Replayer(trace, client, base_url, opts, prog)
    closed = trace.meta.arrival == "closed_loop"
    limit = opts.concurrency if opts.concurrency is not None else (trace.meta.concurrency if closed else None)
    if limit is not None and limit < 1:
        raise ValueError(f"concurrency must be >= 1, got {limit}")
    limiter = trio.CapacityLimiter(limit) if limit is not None else None
    started = trio.current_time()
    tasks: list[TaskResult] = []

    async def one(root: str, token: object | None, stagger: float) -> None:
        try:
            # A distinct start instant per root keeps the arrival order at the system under test
            # independent of Trio's run-queue order (simulate must be deterministic).
            await trio.sleep(stagger)
            await rep.run_task(root, trio.current_time(), tasks)
        finally:
            if limiter is not None and token is not None:
                limiter.release_on_behalf_of(token)

    prog.emit()
    sessions = rep.sessions
    # batch and interactive roots: everything but agent Programs
    open_roots = [(index, root) for index, root in enumerate(roots) if sessions[root][0].klass != "agent"]

    async def open_loop_batch(nursery: trio.Nursery) -> None:
        # Batch and interactive requests are open loop whatever the trace's arrival mode: each
        # starts at its timestamp (a missing one: at once), in timestamp order, outside the
        # concurrency limit.
        order = sorted(open_roots, key=lambda item: (sessions[item[1]][0].timestamp or 0.0, item[0]))
        for index, root in order:
            at = sessions[root][0].timestamp or 0.0
            await trio.sleep_until(started + at / 1000.0 / opts.time_scale)
            nursery.start_soon(one, root, None, (index % 1000) * 1e-6)

    agent_roots = [(index, root) for index, root in enumerate(roots) if sessions[root][0].klass == "agent"]
    if not closed:
        # Open loop: each root starts at its timestamp whatever its place in the file (a root
        # without one: at once), so the roots are walked in timestamp order (the file order
        # breaks ties); walking them in file order would hold an early root behind a later one.
        agent_roots.sort(key=lambda item: (sessions[item[1]][0].timestamp or 0.0, item[0]))

    async with trio.open_nursery() as nursery:
        if open_roots:
            nursery.start_soon(open_loop_batch, nursery)
        for index, root in agent_roots:
            first = sessions[root][0]
            if not closed and first.timestamp is not None:
                await trio.sleep_until(started + first.timestamp / 1000.0 / opts.time_scale)
            token = object()
            if limiter is not None:
                await limiter.acquire_on_behalf_of(token)
            nursery.start_soon(one, root, token, (index % 1000) * 1e-6)
    return ReplayResult(
        started=started,
        finished=trio.current_time(),
        requests=tuple(rep.results),
        tasks=tuple(sorted(tasks, key=lambda t: t.task_id)),
        planned_requests=len(trace.records),
        planned_tasks=len(roots),
        planned_batch_requests=sum(1 for rec in trace.records if rec.is_batch),
        planned_batch_tasks=sum(1 for _index, root in open_roots if sessions[root][0].is_batch),
        planned_interactive_tasks=sum(1 for _index, root in open_roots if sessions[root][0].is_interactive),
    )


if __name__ == "__main__":
    import sys

    from bench.interrupt import not_a_command

    sys.exit(not_a_command("bench.replay", "agentd replay"))
