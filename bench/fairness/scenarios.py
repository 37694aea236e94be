"""Adversarial multi-tenant traces sized to a simulated cluster (docs/priority.md §6).

Each scenario is a victim workload and an adversary workload in one trace (``Scenario.trace``) and
the victim's workload alone (``Scenario.alone``: the same sessions at the same times), so a
property compares the victim's service with and without the adversary.  Every trace is open loop
(each root starts at its ``timestamp``) so the adversary's flood and the victim's arrivals are
fixed by the trace, not by a shared concurrency limit, and the whole scenario is a function of
``(kind, cluster, seed, scale)``.

Kinds:

* ``flood`` — tenant ``flood`` starts ``3 x`` as many agent Programs as the cluster's KV holds, all
  at t = 0; tenant ``light`` runs a few Programs (about a fifth of what fits) spread over the first
  seconds.  Victim: ``light``.
* ``hogs`` — tenant ``hog`` runs two long-context Programs per DP rank, each holding about 45% of a
  rank's KV; ``light`` as above.  Victim: ``light``.
* ``priority-flood`` — the ``flood`` tenant of ``flood``, every request at the most urgent vLLM
  priority (-10); ``light`` at priority 0.  Victim: ``light`` (a starvation check: priority may
  order work inside a class, it must not starve another tenant past the documented bound).
* ``interactive-under-batch`` — tenant ``batch`` submits a batch job that saturates the cluster at
  t = 0; tenant ``interactive`` sends one-shot interactive requests, one every 1.5 s.  Victim:
  ``interactive``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from bench.interrupt import run_main
from bench.trace.format import Trace, TraceMeta, TraceRecord, merge_traces, validate_structure
from bench.trace.synth import Knobs, synthesize

KINDS = ("flood", "hogs", "priority-flood", "interactive-under-batch")

# the agent workload every scenario's light tenant (and the flood) runs: swe-short, shrunk so a
# check fits a 2-core budget (docs/priority.md §6, "Cost")
AGENT_KNOBS = Knobs(input_scale=1.0, output_scale=0.25, gap_cap_seconds=5.0, max_turns=4)
URGENT_PRIORITY = -10  # vLLM convention: lower runs first


@attrs.frozen
class ClusterSize:
    """What the scenarios are sized to: the number of DP ranks and the KV tokens of one rank."""

    ranks: int
    kv_tokens_per_rank: int

    @property
    def kv_tokens(self) -> int:
        return self.ranks * self.kv_tokens_per_rank


@attrs.frozen
class Scenario:
    kind: str
    victim: str  # the tenant whose service the properties measure
    adversary: str
    seed: int
    trace: Trace  # victim + adversary
    alone: Trace  # the victim's sessions only

    def sessions_of(self, tenant: str) -> list[str]:
        return [sid for sid, recs in self.trace.sessions().items() if recs[0].tenant == tenant]


def _relabel(
    trace: Trace,
    tenant: str,
    prefix: str,
    *,
    starts: Sequence[float] | None = None,
    priority: int = 0,
    request_class: str | None = None,
) -> list[TraceRecord]:
    """``trace``'s records as ``tenant``'s: session ids prefixed, task ids to match, root ``k``
    starting at ``starts[k]`` ms (default: its own timestamp, else 0)."""
    roots = [sid for sid, recs in trace.sessions().items() if recs[0].parent_session_id is None]
    start_of = {sid: (starts[k] if starts is not None else None) for k, sid in enumerate(roots)}
    out = []
    for rec in trace.records:
        changes: dict[str, Any] = {
            "session_id": f"{prefix}{rec.session_id}",
            "task_id": f"{prefix}{rec.task_id or rec.session_id}",
            "tenant": tenant,
            "priority": priority,
            "request_class": request_class,
        }
        if rec.parent_session_id is not None:
            changes["parent_session_id"] = f"{prefix}{rec.parent_session_id}"
        if rec.turn == 0 and rec.session_id in start_of:
            at = start_of[rec.session_id]
            changes["timestamp"] = at if at is not None else (rec.timestamp or 0.0)
        out.append(attrs.evolve(rec, **changes))
    return out


def _in_start_order(trace: Trace) -> Trace:
    """``trace`` with its root sessions in start order (each with its subagents, records of a
    session kept together and in turn order).  The replay starts the open-loop agent roots in file
    order, each waiting for its ``timestamp`` (bench/replay.py), so a root listed after a later
    one would start late: merged as victim then adversary, the flood "at t = 0" began only when
    the light tenant's last root arrived (up to 8 s in).  Batch and interactive roots are started
    in timestamp order by the replay whatever the file order, so a trace without agent roots is
    returned as it is."""
    sessions = trace.sessions()
    if all(recs[0].klass != "agent" for recs in sessions.values()):
        return trace
    root_of: dict[str, str] = {}
    for sid, recs in sessions.items():
        parent = recs[0].parent_session_id
        root_of[sid] = root_of.get(parent, parent) if parent is not None else sid
    start = {sid: recs[0].timestamp or 0.0 for sid, recs in sessions.items() if recs[0].parent_session_id is None}
    order = sorted(sessions, key=lambda sid: start.get(root_of[sid], 0.0))  # stable: file order on ties
    records = [rec for sid in order for rec in sessions[sid]]
    return attrs.evolve(trace, records=validate_structure(records))


def _part(name: str, records: Iterable[TraceRecord], seed: int) -> Trace:
    recs = validate_structure(list(records))
    roots = sum(1 for r in recs if r.turn == 0 and r.parent_session_id is None)
    return Trace(TraceMeta(profile=name, seed=seed, programs=roots, arrival="poisson", concurrency=1), recs)


def _peak_context(trace: Trace) -> float:
    """Mean over sessions of the largest prompt + output of a session (tokens of KV it needs)."""
    peaks = [max(r.input_length + r.output_length for r in recs) for recs in trace.sessions().values()]
    return sum(peaks) / len(peaks)


def programs_that_fit(cluster: ClusterSize, seed: int) -> int:
    """How many of the light tenant's Programs the cluster's KV holds at their peak context."""
    probe = synthesize("swe-short", 16, seed, AGENT_KNOBS)
    return max(2, int(cluster.kv_tokens // _peak_context(probe)))


def _light(cluster: ClusterSize, seed: int, scale: float) -> list[TraceRecord]:
    fit = programs_that_fit(cluster, seed)
    n = max(3, round(fit * 0.25 * scale))
    trace = synthesize("swe-short", n, seed + 1, AGENT_KNOBS)
    rng = random.Random(seed)
    starts = sorted(round(rng.uniform(0.0, 8_000.0), 3) for _ in range(n))
    return _relabel(trace, "light", "light-", starts=starts)


def _flood(cluster: ClusterSize, seed: int, scale: float, priority: int = 0) -> list[TraceRecord]:
    n = max(4, round(programs_that_fit(cluster, seed) * 2.5 * scale))
    trace = synthesize("swe-short", n, seed + 2, AGENT_KNOBS)
    return _relabel(trace, "flood", "flood-", starts=[0.0] * n, priority=priority)


def _hogs(cluster: ClusterSize, seed: int, scale: float) -> list[TraceRecord]:
    rng = random.Random(seed + 3)
    n = max(1, round(2 * cluster.ranks * scale))
    prompt = int(cluster.kv_tokens_per_rank * 0.45)
    records = []
    for i in range(n):
        sid = f"hog-{i:03d}"
        length = 0
        for turn in range(4):
            delta = prompt if turn == 0 else rng.randint(200, 600)
            output = rng.randint(60, 120)
            prev_len = length
            length = delta if turn == 0 else prev_len + delta
            records.append(
                TraceRecord(
                    session_id=sid,
                    turn=turn,
                    input_delta=delta,
                    output_length=output,
                    input_length=length,
                    pre_gap_ms=0.0 if turn == 0 else round(rng.uniform(50.0, 500.0), 3),
                    timestamp=0.0 if turn == 0 else None,
                    finish_reason="stop" if turn == 3 else "tool_calls",
                    role="user" if turn == 0 else "tool",
                    task_id=sid,
                    tenant="hog",
                )
            )
            length += output
    return records


def _batch_job(cluster: ClusterSize, seed: int, scale: float) -> list[TraceRecord]:
    # enough requests to keep every rank busy through the interactive requests' window (about
    # 30 s of simulated time at the seed's cost model, whatever the cluster's size)
    n = max(8, round(cluster.kv_tokens / 600 * scale))
    trace = synthesize("batch", n, seed + 4, Knobs(output_scale=0.5))
    return _relabel(trace, "batch", "batch-", request_class="batch")


def _interactive(seed: int, scale: float) -> list[TraceRecord]:
    rng = random.Random(seed + 5)
    n = max(4, round(16 * scale))
    return [
        TraceRecord(
            session_id=f"interactive-{i:03d}",
            turn=0,
            input_delta=rng.randint(300, 900),
            output_length=rng.randint(48, 96),
            timestamp=round(1_000.0 + 1_500.0 * i, 3),
            finish_reason="stop",
            task_id=f"interactive-{i:03d}",
            tenant="interactive",
            request_class="interactive",
        )
        for i in range(n)
    ]


def build(kind: str, cluster: ClusterSize, seed: int = 0, scale: float = 1.0) -> Scenario:
    """The ``kind`` scenario for ``cluster``; ``scale`` multiplies the number of sessions."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "interactive-under-batch":
        victim, adversary = "interactive", "batch"
        victim_recs, adversary_recs = _interactive(seed, scale), _batch_job(cluster, seed, scale)
    else:
        victim, victim_recs = "light", _light(cluster, seed, scale)
        if kind == "hogs":
            adversary, adversary_recs = "hog", _hogs(cluster, seed, scale)
        else:
            urgent = URGENT_PRIORITY if kind == "priority-flood" else 0
            adversary, adversary_recs = "flood", _flood(cluster, seed, scale, urgent)
    victim_part = _part(f"{kind}:{victim}", victim_recs, seed)
    adversary_part = _part(f"{kind}:{adversary}", adversary_recs, seed)
    merged = merge_traces([(victim, victim_part), (adversary, adversary_part)])
    meta = attrs.evolve(merged.meta, profile=f"fairness:{kind}", seed=seed, params={"scenario": kind, "scale": scale})
    return Scenario(
        kind=kind,
        victim=victim,
        adversary=adversary,
        seed=seed,
        trace=_in_start_order(attrs.evolve(merged, meta=meta)),
        alone=attrs.evolve(victim_part, meta=attrs.evolve(meta, profile=f"fairness:{kind}:alone")),
    )


def subset(trace: Trace, keep: Iterable[str]) -> Trace:
    """``trace`` with only the root sessions in ``keep`` (and their subagents)."""
    keep_roots = set(keep)
    sessions = trace.sessions()
    kept: set[str] = set()
    for sid, recs in sessions.items():
        parent = recs[0].parent_session_id
        if (parent is None and sid in keep_roots) or (parent is not None and parent in kept):
            kept.add(sid)
    records = validate_structure([r for r in trace.records if r.session_id in kept])
    roots = sum(1 for r in records if r.turn == 0 and r.parent_session_id is None)
    return Trace(attrs.evolve(trace.meta, programs=roots), records)


def _parent_kept(rec: TraceRecord, last_turn: dict[str, int]) -> bool:
    owner = rec.parent_session_id or ""
    return rec.parent_turn is not None and rec.parent_turn <= last_turn.get(owner, -1)


def truncate(trace: Trace, max_turns: int) -> Trace:
    """``trace`` with every session cut to its first ``max_turns`` turns (the last one a stop)."""
    records = []
    for rec in trace.records:
        if rec.turn >= max_turns:
            continue
        if rec.turn == max_turns - 1:
            rec = attrs.evolve(rec, finish_reason="stop")
        records.append(rec)
    # a subagent spawned after a dropped parent turn goes too
    turns = {r.session_id: r.turn for r in records}
    records = [r for r in records if r.parent_session_id is None or _parent_kept(r, turns)]
    return Trace(trace.meta, validate_structure(records))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.fairness.scenarios --kind K --ranks R --kv-tokens-per-rank T --out F
    --alone-out G [--seed S] [--scale X]``: write a scenario's traces (bench/fairness_bench.sh)."""
    import argparse

    from bench.trace.format import save_trace
    from daemon.commands.argtypes import positive_float, positive_int

    parser = argparse.ArgumentParser(prog="python -m bench.fairness.scenarios", description=main.__doc__)
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--ranks", required=True, type=positive_int)
    parser.add_argument("--kv-tokens-per-rank", required=True, type=positive_int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=positive_float, default=1.0)
    parser.add_argument("--out", required=True, help="the victim + adversary trace")
    parser.add_argument("--alone-out", required=True, help="the victim-only trace")
    args = parser.parse_args(argv)
    scenario = build(args.kind, ClusterSize(args.ranks, args.kv_tokens_per_rank), args.seed, args.scale)
    save_trace(scenario.trace, args.out)
    save_trace(scenario.alone, args.alone_out)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.fairness.scenarios"))
