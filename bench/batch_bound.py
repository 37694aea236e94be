"""A lower bound on the makespan of a batch-only trace on the simulated engines, for any order.

``python -m bench.batch_bound --trace T --config C [--report LABEL=REPORT.json ...]`` prints the
bound and its parts, and with reports the ratio ``bound / report makespan`` (docs/batch.md §5.4).
The point is to tell how much any dispatch order (FCFS, the seed's, agentd's) could gain on a
workload: what no order can change is a floor under every one of them.

The simulated engine's step takes ``prefill + fixed + per_request x n + per_token x context``
seconds (sim/engine.py, the default cost model of the embedded workers), so over a whole run, on
``R`` ranks of ``C`` KV tokens each:

* prefill: every request's own prompt tokens (``input_delta``, after its job's shared prefix)
  are computed at least once, at the linear-plus-quadratic prefill cost with the shared prefix as
  context; each job's shared prefix at least once;
* per request and per context token: request ``i`` decodes ``out_i - 1`` tokens in decode steps
  (the first comes from its prefill), with contexts ``input_i + 1 .. input_i + out_i - 1``;
* the fixed cost of each decode step: a rank holds at most ``C`` tokens, and request ``i`` holds
  at least ``input_delta_i + k`` private tokens at its ``k``-th decode step, so the decode steps
  number at least ``sum_i sum_k (input_delta_i + k) / (R x C)`` per rank on average, and at least
  ``max_i(out_i) - 1``.

The busiest rank takes at least the average of these per rank.  Everything the bound leaves out
(preemption recompute, chat-template tokens, block rounding, shared prefixes per rank, arrival
times, idle ranks, an unbalanced split) only adds time, so it is a floor, reached only by perfect
packing without preemption.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence

import attrs

from actors.core.config import DecodeThroughputModel, PrefillCostModel
from bench.interrupt import run_main
from bench.trace.format import TraceError, TraceRecord, load_trace
from daemon.config_loading import ConfigError, load_config


@attrs.frozen
class Bound:
    """The floor (seconds) and its parts, per rank."""

    ranks: int
    kv_tokens_per_rank: int
    prefill_seconds: float
    per_request_seconds: float
    context_seconds: float
    decode_steps: float
    fixed_seconds: float

    @property
    def makespan_seconds(self) -> float:
        return self.prefill_seconds + self.per_request_seconds + self.context_seconds + self.fixed_seconds


def prefill_seconds(tokens: int, context: int, model: PrefillCostModel) -> float:
    """The simulated engine's prefill cost of ``tokens`` new tokens after ``context`` computed ones."""
    lin = model.linear_seconds_per_1k_tokens / 1000.0
    quad = 2.0 * model.quadratic_seconds_per_1k_tokens_squared / 1e6
    return lin * tokens + quad * tokens * (context + tokens / 2.0)


def makespan_bound(
    records: Iterable[TraceRecord],
    *,
    ranks: int,
    kv_tokens_per_rank: int,
    prefill: PrefillCostModel | None = None,
    decode: DecodeThroughputModel | None = None,
) -> Bound:
    """The order-independent floor of the batch makespan of ``records`` (module docstring)."""
    if ranks < 1 or kv_tokens_per_rank < 1:
        raise ValueError(f"ranks and kv_tokens_per_rank must be >= 1 (got {ranks}, {kv_tokens_per_rank})")
    prefill = prefill if prefill is not None else PrefillCostModel()
    decode = decode if decode is not None else DecodeThroughputModel()
    pre = 0.0
    decode_tokens = 0
    context = 0
    area = 0
    longest = 0
    shared: dict[str, int] = {}
    for r in records:
        if r.shared_prefix_id is not None:
            shared[r.shared_prefix_id] = max(shared.get(r.shared_prefix_id, 0), r.shared_prefix_tokens)
        pre += prefill_seconds(r.input_delta, r.input_length - r.input_delta, prefill)
        steps = max(0, r.output_length - 1)
        decode_tokens += steps
        context += steps * r.input_length + steps * (steps + 1) // 2
        area += steps * r.input_delta + steps * (steps + 1) // 2
        longest = max(longest, steps)
    pre += sum(prefill_seconds(n, 0, prefill) for n in shared.values())
    steps_floor = max(area / (ranks * kv_tokens_per_rank), float(longest))
    return Bound(
        ranks=ranks,
        kv_tokens_per_rank=kv_tokens_per_rank,
        prefill_seconds=pre / ranks,
        per_request_seconds=decode.batch_step_seconds_per_request * decode_tokens / ranks,
        context_seconds=decode.context_step_seconds_per_token * context / ranks,
        decode_steps=steps_floor,
        fixed_seconds=decode.fixed_step_seconds * steps_floor,
    )


def _makespan(path: str) -> float:
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    value = (report.get("batch") or {}).get("makespan_seconds")
    if not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{path}: no batch makespan in the report")
    return float(value)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.batch_bound", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True, help="a batch-only trace (agentd trace synth --profile batch)")
    ap.add_argument("--config", required=True, help="the agentd config of the run ([embedded] sizes the cluster)")
    ap.add_argument("--report", action="append", default=[], metavar="LABEL=REPORT.json")
    args = ap.parse_args(argv)
    try:
        trace = load_trace(args.trace)
        cfg = load_config(args.config)
        reports = []
        for item in args.report:
            label, sep, path = item.partition("=")
            if not sep or not label or not path:
                raise ValueError(f"--report: expected LABEL=REPORT.json (got {item!r})")
            reports.append((label, _makespan(path)))
    except ConfigError as exc:
        print(f"batch_bound: --config: {'; '.join(exc.lines)}", file=sys.stderr)
        return 2
    except (OSError, ValueError, TraceError) as exc:
        print(f"batch_bound: {exc}", file=sys.stderr)
        return 2
    emb = cfg.embedded
    if any(not r.is_batch for r in trace.records):
        print("batch_bound: --trace: the bound is for batch-only traces (it has agent records)", file=sys.stderr)
        return 2
    b = makespan_bound(
        trace.records, ranks=emb.num_workers * emb.dp_size, kv_tokens_per_rank=emb.num_gpu_blocks * emb.block_size
    )
    print(
        f"makespan floor for any order: {b.makespan_seconds:.2f} s per rank ({b.ranks} ranks x "
        f"{b.kv_tokens_per_rank} KV tokens): prefill {b.prefill_seconds:.2f} + per request "
        f"{b.per_request_seconds:.2f} + context {b.context_seconds:.2f} + fixed {b.fixed_seconds:.2f} "
        f"({b.decode_steps:.0f} decode steps)"
    )
    for label, makespan in reports:
        print(f"floor / {label} makespan ({makespan:.2f} s): {b.makespan_seconds / makespan:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.batch_bound"))
