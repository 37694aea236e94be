"""Synthetic agent traces calibrated to published agent-workload statistics (docs/traces.md, "Profiles").

Five profiles: ``swe-short``, ``coding-long``, ``bfcl``, ``chat-human``, ``batch``. Each is
a function ``(rng, programs, knobs) -> (records, meta)`` driven only by one ``random.Random(seed)``,
so the same (profile, programs, seed, knobs) always yields byte-identical JSONL. Token counts are
*content* tokens (the chat template's overhead is added by the backend's tokenizer at replay).

Calibration (the sources are listed in docs/traces.md, "Profiles"):

- tool gaps: log-normal(median 0.3 s, sigma 2.9) — TraceLab per-call latency — mixed with an
  "instant" (<= 50 ms) component of weight 0.6 for the router-RFC-like ``swe-short`` (86% < 1 s,
  95% < 10 s); capped at 5 minutes;
- human gaps: log-normal(median 84 s, sigma 2.1), capped (anything past the TTL horizon behaves the
  same for scheduling);
- coding-long turns: log-normal(median 40, p90 ~135), appends log-normal(median 1.5K) with rare
  10-50K file dumps, compaction above 128K, ~40% of sessions spawn 1-3 subagents;
- swe-short: normal(11, 2) turns, 2-4K initial prefix, 0.5-2K appends, 100-300 output tokens;
- bfcl: p50 4 user turns x 1-2 steps, function docs 1.5-4.5K shared per API-class set, tool results
  50-500, outputs 30-150, in-process tool gaps of 1-10 ms;
- chat-human: ShareGPT-like (p50 3 assistant turns, human message ~20 tokens, answers ~300);
- batch: one-turn non-agent requests of four jobs (``BATCH_JOBS``) with clearly different
  decode lengths (16-32, 64-128, 150-300, 400-800 tokens), submitted in one burst.

``input_scale`` / ``output_scale`` shrink token counts so a benchmark fits a CPU-only simulated
cluster; ``gap_cap_seconds`` / ``human_gap_cap_seconds`` bound the gap tails and ``max_turns`` the
session lengths (tail targets such as ``turns_per_program.p90`` then report a miss on purpose). The
stats module compares a trace against ``targets_for(profile, knobs)``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import attrs

from bench.trace.format import HashChain, Trace, TraceMeta, TraceRecord

PROFILES = ("swe-short", "coding-long", "bfcl", "chat-human", "batch", "agent-tools")

TOOL_MEDIAN_SECONDS = 0.3
TOOL_SIGMA = 2.9
HUMAN_MEDIAN_SECONDS = 84.0
HUMAN_SIGMA = 2.1

BFCL_CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)


@attrs.frozen
class Knobs:
    """Generator parameters a user may override; ``None`` means the profile default."""

    input_scale: float = 1.0
    output_scale: float = 1.0
    gap_cap_seconds: float = 300.0
    human_gap_cap_seconds: float | None = None
    arrival_rate_per_second: float | None = None
    concurrency: int | None = None
    max_turns: int | None = None  # cap on turns per session (bench budgets); None = the profile's own


@attrs.frozen
class Target:
    metric: str
    value: float
    rel_tol: float = 0.0
    abs_tol: float = 0.0
    scaled_by: str | None = None  # "input" / "output": the value is for input_scale / output_scale 1

    def accepts(self, observed: float) -> bool:
        return abs(observed - self.value) <= max(self.abs_tol, self.rel_tol * abs(self.value))

    def scaled(self, knobs: Knobs) -> Target:
        """This target for a trace synthesized with ``knobs`` (token counts follow the scales)."""
        if self.scaled_by is None:
            return self
        scale = knobs.input_scale if self.scaled_by == "input" else knobs.output_scale
        return attrs.evolve(self, value=self.value * scale, scaled_by=None)


@attrs.frozen
class _Draft:
    """One session being built: its records, in turn order."""

    session_id: str
    records: list[TraceRecord]


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def _itok(x: float, scale: float, floor: int = 1) -> int:
    return max(floor, int(round(x * scale)))


def _cap(turns: int, k: Knobs) -> int:
    return min(turns, k.max_turns) if k.max_turns is not None else turns


def _tool_gap(rng: random.Random, instant_weight: float, cap_seconds: float) -> tuple[float, str | None, str]:
    """``(gap_ms, tool_name, "tool")``: an instant/log-normal mixture; the name follows the latency class."""
    if rng.random() < instant_weight:
        seconds = rng.uniform(0.001, 0.050)
    else:
        seconds = min(cap_seconds, _lognormal(rng, TOOL_MEDIAN_SECONDS, TOOL_SIGMA))
    if seconds <= 0.05:
        name = rng.choice(("str_replace_editor", "view_file"))
    elif seconds <= 0.5:
        name = rng.choice(("ls", "cat", "grep"))
    elif seconds <= 2.0:
        name = "bash"
    elif seconds <= 30.0:
        name = "run_tests"
    else:
        name = rng.choice(("install_deps", "web_fetch"))
    return round(seconds * 1000.0, 3), name, "tool"


def _human_gap_ms(rng: random.Random, cap_seconds: float) -> float:
    return round(min(cap_seconds, _lognormal(rng, HUMAN_MEDIAN_SECONDS, HUMAN_SIGMA)) * 1000.0, 3)


def _session(
    session_id: str,
    turns: list[dict[str, Any]],
    *,
    shared_prefix_id: str | None,
    shared_prefix_tokens: int,
    common: dict[str, Any] | None = None,
    compaction_tokens: int | None = None,
    summary_tokens: Callable[[], int] | None = None,
) -> _Draft:
    """Turn dicts (input_delta, output_length, pre_gap_ms, role, tool_name) -> chained records.

    ``common`` holds record fields shared by every turn; ``task_id`` defaults to the session's id.
    """
    common = {"task_id": session_id, **(common or {})}
    recs: list[TraceRecord] = []
    prev: TraceRecord | None = None
    for t, turn in enumerate(turns):
        compaction = False
        delta = turn["input_delta"]
        if prev is None:
            length = shared_prefix_tokens + delta
        else:
            length = prev.input_length + prev.output_length + delta
            if compaction_tokens is not None and summary_tokens is not None and length > compaction_tokens:
                compaction = True
                delta = summary_tokens()
                length = shared_prefix_tokens + delta
        is_last = t == len(turns) - 1
        rec = TraceRecord(
            session_id=session_id,
            turn=t,
            input_delta=delta,
            output_length=turn["output_length"],
            input_length=length,
            pre_gap_ms=turn.get("pre_gap_ms", 0.0),
            role=turn.get("role", "user"),
            tool_name=turn.get("tool_name"),
            finish_reason="stop" if is_last else turn.get("finish_reason", "tool_calls"),
            shared_prefix_id=shared_prefix_id,
            shared_prefix_tokens=shared_prefix_tokens,
            compaction=compaction,
            **common,
        )
        recs.append(rec)
        prev = rec
    return _Draft(session_id, recs)


def _agent_turns(
    rng: random.Random,
    n: int,
    first_delta: int,
    append: Callable[[], int],
    output: Callable[[], int],
    gap: Callable[[], tuple[float, str | None, str]],
) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [{"input_delta": first_delta, "output_length": output(), "role": "user"}]
    for _ in range(1, n):
        gap_ms, tool, role = gap()
        if role == "user":  # a human answers next: the previous turn ended without a tool call
            turns[-1]["finish_reason"] = "stop"
        turns.append(
            {"input_delta": append(), "output_length": output(), "pre_gap_ms": gap_ms, "tool_name": tool, "role": role}
        )
    return turns


# --------------------------------------------------------------------------------------- profiles


def _swe_short(rng: random.Random, programs: int, k: Knobs) -> tuple[list[_Draft], dict[str, Any]]:
    prefix_tokens = _itok(1500, k.input_scale)
    drafts = []
    for i in range(programs):
        sid = f"swe-{i:05d}"
        n = _cap(min(40, max(2, int(round(rng.gauss(11.0, 2.0))))), k)
        turns = _agent_turns(
            rng,
            n,
            first_delta=_itok(rng.uniform(500, 2500), k.input_scale),
            append=lambda: _itok(rng.uniform(500, 2000), k.input_scale),
            output=lambda: _itok(rng.uniform(100, 300), k.output_scale),
            gap=lambda: _tool_gap(rng, 0.6, k.gap_cap_seconds),
        )
        drafts.append(_session(sid, turns, shared_prefix_id="swe-short-system", shared_prefix_tokens=prefix_tokens))
    return drafts, {"arrival": "closed_loop", "concurrency": k.concurrency or 16}


def _coding_long(rng: random.Random, programs: int, k: Knobs) -> tuple[list[_Draft], dict[str, Any]]:
    human_cap = k.human_gap_cap_seconds if k.human_gap_cap_seconds is not None else 600.0
    systems = [(f"coding-long-system-{j}", _itok(rng.uniform(10_000, 20_000), k.input_scale)) for j in range(2)]
    sub_system = ("coding-long-subagent-system", _itok(rng.uniform(3_000, 5_000), k.input_scale))
    compaction_at = _itok(128_000, k.input_scale)

    def append() -> int:
        if rng.random() < 0.03:
            return _itok(rng.uniform(10_000, 50_000), k.input_scale)
        return _itok(min(60_000.0, _lognormal(rng, 1500.0, 1.0)), k.input_scale)

    def output() -> int:
        return _itok(min(4096.0, _lognormal(rng, 400.0, 0.8)), k.output_scale)

    def lead_gap() -> tuple[float, str | None, str]:
        if rng.random() < 1.0 / 7.8:  # tool-initiated steps per human request avg 7.8 (TraceLab)
            return _human_gap_ms(rng, human_cap), None, "user"
        return _tool_gap(rng, 0.0, k.gap_cap_seconds)

    def sub_gap() -> tuple[float, str | None, str]:
        return _tool_gap(rng, 0.0, k.gap_cap_seconds)

    def summary() -> int:
        return _itok(rng.uniform(4_000, 10_000), k.input_scale)

    rate = k.arrival_rate_per_second or (1.0 / 30.0)
    now_ms = 0.0
    drafts: list[_Draft] = []
    for i in range(programs):
        sid = f"code-{i:05d}"
        n = _cap(min(400, max(3, int(round(_lognormal(rng, 40.0, 0.95))))), k)
        sys_id, sys_tokens = systems[rng.randrange(len(systems))]
        turns = _agent_turns(rng, n, _itok(rng.uniform(200, 2000), k.input_scale), append, output, lead_gap)
        lead = _session(
            sid,
            turns,
            shared_prefix_id=sys_id,
            shared_prefix_tokens=sys_tokens,
            compaction_tokens=compaction_at,
            summary_tokens=summary,
        )
        lead.records[0] = attrs.evolve(lead.records[0], timestamp=round(now_ms, 3))
        now_ms += rng.expovariate(rate) * 1000.0
        drafts.append(lead)
        if rng.random() < 0.40 and n >= 2:
            spawn_turns = sorted(rng.sample(range(n - 1), min(n - 1, rng.randint(1, 3))))
            for j, at in enumerate(spawn_turns):
                cid = f"{sid}.sub{j}"
                m = _cap(min(60, max(1, int(round(_lognormal(rng, 8.0, 0.6))))), k)
                cturns = _agent_turns(rng, m, _itok(rng.uniform(200, 800), k.input_scale), append, output, sub_gap)
                cturns[0]["pre_gap_ms"] = round(rng.uniform(1.0, 50.0), 3)
                child = _session(
                    cid,
                    cturns,
                    shared_prefix_id=sub_system[0],
                    shared_prefix_tokens=sub_system[1],
                    common={
                        "task_id": sid,
                        "agent_id": f"sub{j}",
                        "parent_session_id": sid,
                        "blocks_parent": rng.random() < 0.6,
                    },
                    compaction_tokens=compaction_at,
                    summary_tokens=summary,
                )
                child.records[0] = attrs.evolve(child.records[0], parent_turn=at)
                for r in range(1, len(child.records)):
                    child.records[r] = attrs.evolve(child.records[r], parent_turn=None)
                drafts.append(child)
    return drafts, {"arrival": "poisson", "concurrency": k.concurrency or 12, "arrival_rate_per_second": rate}


# The agent-tools profile's tools: (name, weight, gap sampler in seconds, result tokens (lo, hi)).
# Gaps follow the named tools: a file read is instant, grep and edit_file sub-second,
# web_fetch about 2 s, run_tests about 6 s (docs/traces.md, "Profiles").
AGENT_TOOLS: tuple[tuple[str, float, Callable[[random.Random], float], tuple[int, int]], ...] = (
    ("read_file", 0.30, lambda r: r.uniform(0.001, 0.050), (500, 2000)),
    ("grep", 0.20, lambda r: min(1.0, _lognormal(r, 0.25, 0.5)), (100, 800)),
    ("edit_file", 0.20, lambda r: min(1.0, _lognormal(r, 0.4, 0.4)), (50, 300)),
    ("web_fetch", 0.15, lambda r: _lognormal(r, 2.0, 0.35), (1000, 3000)),
    ("run_tests", 0.15, lambda r: _lognormal(r, 6.0, 0.3), (200, 1500)),
)
SPAWN_TOOL = "task"  # the lead's call that runs a blocking subagent


def _agent_tools(rng: random.Random, programs: int, k: Knobs) -> tuple[list[_Draft], dict[str, Any]]:
    """swe-short's shape with named tools whose gaps differ, and 25% of leads spawning one or two
    blocking subagents (the lead's ``task`` call returns when its subagent finished)."""
    lead_prefix = _itok(1500, k.input_scale)
    sub_prefix = _itok(1000, k.input_scale)
    weights = [w for _, w, _, _ in AGENT_TOOLS]

    def tool_turn() -> dict[str, Any]:
        name, _, gap, (lo, hi) = rng.choices(AGENT_TOOLS, weights=weights)[0]
        return {
            "input_delta": _itok(rng.uniform(lo, hi), k.input_scale),
            "output_length": _itok(rng.uniform(100, 300), k.output_scale),
            "pre_gap_ms": round(min(k.gap_cap_seconds, gap(rng)) * 1000.0, 3),
            "tool_name": name,
            "role": "tool",
        }

    def first(lo: int, hi: int) -> dict[str, Any]:
        return {
            "input_delta": _itok(rng.uniform(lo, hi), k.input_scale),
            "output_length": _itok(rng.uniform(100, 300), k.output_scale),
            "role": "user",
        }

    drafts: list[_Draft] = []
    for i in range(programs):
        sid = f"tools-{i:05d}"
        n = _cap(min(40, max(3, int(round(rng.gauss(11.0, 2.0))))), k)
        turns = [first(500, 2500)] + [tool_turn() for _ in range(1, n)]
        spawns: list[int] = []
        if rng.random() < 0.25:
            spawns = sorted(rng.sample(range(n - 1), min(n - 1, rng.randint(1, 2))))
            for at in spawns:  # the lead's next turn carries the subagent's result
                turns[at + 1].update(
                    tool_name=SPAWN_TOOL,
                    pre_gap_ms=round(rng.uniform(1.0, 20.0), 3),
                    input_delta=_itok(rng.uniform(200, 800), k.input_scale),
                )
        lead = _session(sid, turns, shared_prefix_id="agent-tools-system", shared_prefix_tokens=lead_prefix)
        drafts.append(lead)
        for j, at in enumerate(spawns):
            cid = f"{sid}.sub{j}"
            m = _cap(rng.randint(3, 6), k)
            cturns = [first(200, 800)] + [tool_turn() for _ in range(1, m)]
            cturns[0]["pre_gap_ms"] = round(rng.uniform(1.0, 20.0), 3)
            child = _session(
                cid,
                cturns,
                shared_prefix_id="agent-tools-subagent-system",
                shared_prefix_tokens=sub_prefix,
                common={"task_id": sid, "agent_id": f"sub{j}", "parent_session_id": sid, "blocks_parent": True},
            )
            child.records[0] = attrs.evolve(child.records[0], parent_turn=at)
            drafts.append(child)
    return drafts, {"arrival": "closed_loop", "concurrency": k.concurrency or 16}


def _bfcl(rng: random.Random, programs: int, k: Knobs) -> tuple[list[_Draft], dict[str, Any]]:
    doc_tokens = {name: _itok(rng.uniform(1_200, 2_100), k.input_scale) for name in BFCL_CLASSES}
    base = _itok(300, k.input_scale)
    user_turn_weights = (0.05, 0.12, 0.20, 0.38, 0.15, 0.07, 0.03)  # 1..7 user turns, p50 4
    drafts = []
    for i in range(programs):
        sid = f"bfcl-{i:05d}"
        classes = sorted(rng.sample(BFCL_CLASSES, 1 if rng.random() < 0.6 else 2))
        prefix_id = "bfcl-docs:" + "+".join(classes)
        prefix_tokens = base + sum(doc_tokens[c] for c in classes)
        users = rng.choices(range(1, 8), weights=user_turn_weights)[0]
        turns: list[dict[str, Any]] = []
        for u in range(users):
            user_msg = {
                "input_delta": _itok(rng.uniform(20, 80), k.input_scale),
                "output_length": _itok(rng.uniform(30, 150), k.output_scale),
                "role": "user",
            }
            if u > 0:
                user_msg["pre_gap_ms"] = round(rng.uniform(1.0, 10.0), 3)
            turns.append(user_msg)
            if rng.random() < 0.5:  # a second step after the tool result
                turns.append(
                    {
                        "input_delta": _itok(rng.uniform(50, 500), k.input_scale),
                        "output_length": _itok(rng.uniform(30, 150), k.output_scale),
                        "pre_gap_ms": round(rng.uniform(1.0, 10.0), 3),
                        "role": "tool",
                        "tool_name": rng.choice(classes),
                    }
                )
        drafts.append(_session(sid, turns, shared_prefix_id=prefix_id, shared_prefix_tokens=prefix_tokens))
    return drafts, {"arrival": "closed_loop", "concurrency": k.concurrency or 32}


def _chat_human(rng: random.Random, programs: int, k: Knobs) -> tuple[list[_Draft], dict[str, Any]]:
    human_cap = k.human_gap_cap_seconds if k.human_gap_cap_seconds is not None else 3600.0
    rate = k.arrival_rate_per_second or 0.2
    now_ms = 0.0
    drafts = []
    for i in range(programs):
        sid = f"chat-{i:05d}"
        n = _cap(min(63, max(1, int(round(_lognormal(rng, 3.0, 0.66))))), k)
        turns = []
        for t in range(n):
            turn = {
                "input_delta": _itok(min(4000.0, _lognormal(rng, 20.0, 1.56)), k.input_scale),
                "output_length": _itok(min(2048.0, _lognormal(rng, 300.0, 0.58)), k.output_scale),
                "role": "user",
                "finish_reason": "stop",
            }
            if t > 0:
                turn["pre_gap_ms"] = _human_gap_ms(rng, human_cap)
            turns.append(turn)
        d = _session(sid, turns, shared_prefix_id=None, shared_prefix_tokens=0)
        d.records[0] = attrs.evolve(d.records[0], timestamp=round(now_ms, 3))
        now_ms += rng.expovariate(rate) * 1000.0
        drafts.append(d)
    return drafts, {"arrival": "poisson", "concurrency": k.concurrency or 64, "arrival_rate_per_second": rate}


# The batch profile's jobs, in submission order: (name, decode tokens, per-request prompt tokens,
# job-level shared prompt tokens).  Clearly different decode lengths: short (classification,
# at most the engine's short-decode threshold of 32), two medium and one long (generation).  The
# short job is submitted first and the long one last, the order in which FCFS starts the long
# decodes latest (docs/traces.md, "Profiles").
BATCH_JOBS: tuple[tuple[str, tuple[int, int], tuple[int, int], int], ...] = (
    ("classify", (16, 32), (300, 900), 600),
    ("extract", (64, 128), (1_000, 2_500), 1_000),
    ("summarize", (150, 300), (2_000, 4_000), 500),
    ("generate", (400, 800), (100, 400), 300),
)


def _batch(rng: random.Random, programs: int, k: Knobs) -> tuple[list[_Draft], dict[str, Any]]:
    """``programs`` one-turn batch requests split evenly over ``BATCH_JOBS`` (the first jobs take
    the remainder), submitted job after job in one burst: job ``j``'s requests arrive within
    ``[j, j + 1) / rate`` seconds (rate default 20 jobs per second: the whole batch within
    200 ms).  Records are non-streaming, end with a natural stop and carry no Program identity
    (``job`` set, docs/traces.md)."""
    rate = k.arrival_rate_per_second or 20.0
    timed: list[tuple[float, int, dict[str, Any], tuple[str, int]]] = []
    n_jobs = len(BATCH_JOBS)
    for j, (name, (out_lo, out_hi), (in_lo, in_hi), shared) in enumerate(BATCH_JOBS):
        count = programs // n_jobs + (1 if j < programs % n_jobs else 0)
        start_ms = j * 1000.0 / rate
        for _ in range(count):
            turn = {
                "input_delta": _itok(rng.uniform(in_lo, in_hi), k.input_scale),
                "output_length": _itok(rng.randint(out_lo, out_hi), k.output_scale),
            }
            at = round(start_ms + rng.uniform(0.0, 1000.0 / rate), 3)
            timed.append((at, len(timed), turn, (name, _itok(shared, k.input_scale))))
    timed.sort(key=lambda item: (item[0], item[1]))
    drafts: list[_Draft] = []
    for i, (at, _seq, turn, (name, shared_tokens)) in enumerate(timed):
        d = _session(
            f"batch-{i:05d}",
            [turn],
            shared_prefix_id=f"batch-{name}-prompt",
            shared_prefix_tokens=shared_tokens,
            common={"job": name, "stream": False},
        )
        d.records[0] = attrs.evolve(d.records[0], timestamp=at)
        drafts.append(d)
    return drafts, {"arrival": "bursts", "concurrency": k.concurrency or 256, "arrival_rate_per_second": rate}


_GENERATORS: dict[str, Callable[[random.Random, int, Knobs], tuple[list[_Draft], dict[str, Any]]]] = {
    "swe-short": _swe_short,
    "coding-long": _coding_long,
    "bfcl": _bfcl,
    "chat-human": _chat_human,
    "batch": _batch,
    "agent-tools": _agent_tools,
}


# progress(phase, done, total): what a long synthesis has done so far (``agentd trace synth --progress``)
Progress = Callable[[str, int, int], None]


def _with_hash_ids(drafts: list[_Draft], progress: Progress | None = None) -> list[TraceRecord]:
    ids: dict[tuple[Any, ...], int] = {}
    out: list[TraceRecord] = []
    for done, d in enumerate(drafts):
        if progress is not None:
            progress("hashing prompts of session", done, len(drafts))
        chain = HashChain(ids)
        prev: TraceRecord | None = None
        for rec in d.records:
            if prev is None or rec.compaction:
                chain = HashChain(ids)
                chain.extend(rec.shared_prefix_id or f"{d.session_id}:none", rec.shared_prefix_tokens)
            else:
                chain.extend(f"{d.session_id}:out{prev.turn}", prev.output_length)
            chain.extend(f"{d.session_id}:in{rec.turn}", rec.input_delta)
            out.append(attrs.evolve(rec, hash_ids=chain.hash_ids()))
            prev = rec
    return out


def synthesize(
    profile: str, programs: int, seed: int, knobs: Knobs | None = None, progress: Progress | None = None
) -> Trace:
    """Generate ``programs`` root Programs (subagents come on top) of ``profile``; ``progress`` is
    told each phase's progress (the sessions' prompts are hashed block by block, most of the time)."""
    _check_profile(profile)
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    knobs = knobs or Knobs()
    if knobs.input_scale <= 0 or knobs.output_scale <= 0:
        raise ValueError("input_scale and output_scale must be > 0")
    if knobs.max_turns is not None and knobs.max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {knobs.max_turns}")
    rng = random.Random(seed)
    if progress is not None:
        progress("generating programs", 0, programs)
    drafts, extra = _GENERATORS[profile](rng, programs, knobs)
    params = {"knobs": attrs.asdict(knobs)}
    if "arrival_rate_per_second" in extra:
        params["arrival_rate_per_second"] = extra["arrival_rate_per_second"]
    meta = TraceMeta(
        profile=profile,
        seed=seed,
        programs=programs,
        arrival=extra["arrival"],
        concurrency=extra["concurrency"],
        params=params,
    )
    return Trace(meta=meta, records=tuple(_with_hash_ids(drafts, progress)))


# What a trace of each profile should reproduce: the workload statistics it is calibrated to (the
# sources in the module docstring), with the tolerance a trace of a few hundred Programs meets.
_TARGETS: dict[str, tuple[Target, ...]] = {
    "swe-short": (
        Target("turns_per_program.p50", 11, abs_tol=1.0),
        Target("turns_per_program.mean", 11, abs_tol=0.6),
        Target("initial_input_tokens.p50", 3000, rel_tol=0.12, scaled_by="input"),
        Target("append_tokens.p50", 1250, rel_tol=0.12, scaled_by="input"),
        Target("output_tokens.p50", 200, rel_tol=0.12, scaled_by="output"),
        Target("return_gap.share_under_1s", 0.8646, abs_tol=0.04),
        Target("return_gap.share_under_10s", 0.9512, abs_tol=0.03),
        Target("subagent_session_share", 0.0, abs_tol=0.0),
    ),
    "coding-long": (
        Target("turns_per_program.p50", 40, rel_tol=0.2),
        Target("turns_per_program.p90", 135, rel_tol=0.3),
        Target("initial_input_tokens.p50", 16_000, rel_tol=0.35, scaled_by="input"),
        Target("append_tokens.p50", 1500, rel_tol=0.15, scaled_by="input"),
        Target("output_tokens.p50", 400, rel_tol=0.15, scaled_by="output"),
        Target("tool_gap_seconds.p50", TOOL_MEDIAN_SECONDS, rel_tol=0.35),
        Target("tool_gap_seconds.p90", 12.3, rel_tol=0.4),
        Target("human_gap_seconds.p50", HUMAN_MEDIAN_SECONDS, rel_tol=0.4),
        Target("subagent_session_share", 0.40, abs_tol=0.08),
    ),
    "bfcl": (
        Target("user_turns_per_program.p50", 4, abs_tol=0.5),
        Target("user_turns_per_program.mean", 3.67, abs_tol=0.3),
        Target("initial_input_tokens.p50", 2600, rel_tol=0.35, scaled_by="input"),
        Target("output_tokens.p50", 90, rel_tol=0.15, scaled_by="output"),
        Target("return_gap.share_under_1s", 1.0, abs_tol=0.0),
    ),
    "chat-human": (
        Target("turns_per_program.p50", 3, abs_tol=1.0),
        Target("turns_per_program.p90", 7, abs_tol=2.0),
        Target("initial_input_tokens.p50", 20, rel_tol=0.3, scaled_by="input"),
        Target("output_tokens.p50", 300, rel_tol=0.15, scaled_by="output"),
        Target("human_gap_seconds.p50", HUMAN_MEDIAN_SECONDS, rel_tol=0.4),
        Target("shared_prefix_share", 0.0, abs_tol=0.0),
    ),
    "agent-tools": (
        Target("turns_per_program.p50", 11, abs_tol=2.0),
        Target("initial_input_tokens.p50", 3000, rel_tol=0.15, scaled_by="input"),
        Target("output_tokens.p50", 200, rel_tol=0.12, scaled_by="output"),
        Target("subagent_session_share", 0.25, abs_tol=0.08),
    ),
    "batch": (
        Target("turns_per_program.max", 1, abs_tol=0.0),
        Target("jobs", len(BATCH_JOBS), abs_tol=0.0),
        Target("job_output_tokens_p50.min", 24, rel_tol=0.15, scaled_by="output"),
        Target("job_output_tokens_p50.max", 600, rel_tol=0.1, scaled_by="output"),
        Target("output_short_share", 0.25, abs_tol=0.02),
    ),
}


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")


def targets_for(profile: str, knobs: Knobs | None = None) -> list[Target]:
    """The statistics a trace of ``profile`` synthesized with ``knobs`` should reproduce."""
    _check_profile(profile)
    k = knobs or Knobs()
    return [t.scaled(k) for t in _TARGETS[profile]]


def knobs_from_meta(meta: TraceMeta) -> Knobs:
    raw = meta.params.get("knobs", {}) if isinstance(meta.params, dict) else {}
    known = {f.name for f in attrs.fields(Knobs)}
    return Knobs(**{key: value for key, value in raw.items() if key in known})


if __name__ == "__main__":
    import sys

    from bench.interrupt import not_a_command

    sys.exit(not_a_command("bench.trace.synth", "agentd trace synth"))
