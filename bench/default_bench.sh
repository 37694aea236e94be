#!/usr/bin/env bash
# The default side-by-side bench of issue 6: swe-short at the thrash point and at the eviction
# point, each through native agentd, agentd with Program scheduling, and (when the vllm-router
# executable is found: VLLM_ROUTER=path or PATH) vllm-router and vllm-router-ps.
#
#   bench/default_bench.sh [OUT_DIR]        (default OUT_DIR: bench-out)
#
# Environment: VLLM_ROUTER (the vllm-router executable), AGENTD (default: agentd on PATH, else
# this checkout's .venv/bin/agentd), TIME_SCALE_THRASH (default 2) and TIME_SCALE_EVICTION
# (default 5): larger scales shorten the run and handicap the slower proxy more (below).
#
# Traces are generated with fixed seeds; the KV sizes put native serving at a token cache hit of
# about 0.6 (thrash: 32 agents, recompute preemptions) and about 0.8 (eviction: 12 agents), as
# measured with `agentd simulate` (docs/benchmarks.md section 4).  Time scales 2 (thrash) and 5
# (eviction: 12 agents, fewer concurrent streams) keep the whole run under 20 minutes on a 2-core
# machine.  Time scaling speeds up the simulated workers but not the routers' per-token CPU cost,
# so a larger scale handicaps the slower proxy (docs/benchmarks.md section 4.3).
set -euo pipefail
OUT="${1:-bench-out}"
source "$(dirname "$0")/agentd_env.sh"  # AGENTD
TS_THRASH="${TIME_SCALE_THRASH:-2}"
TS_EVICTION="${TIME_SCALE_EVICTION:-5}"
mkdir -p "$OUT"
router=()
if [ -n "${VLLM_ROUTER:-}" ]; then router=(--vllm-router "$VLLM_ROUTER"); fi
start=$(date +%s)
"$AGENTD" trace synth --profile swe-short --programs 48 --seed 1 --out "$OUT/swe48.jsonl"
"$AGENTD" trace synth --profile swe-short --programs 40 --seed 1 --out "$OUT/swe40.jsonl"
"$AGENTD" bench --trace "$OUT/swe48.jsonl" --out "$OUT/thrash" "${router[@]}" \
  --kv-blocks 4500 --concurrency 32 --time-scale "$TS_THRASH"
"$AGENTD" bench --trace "$OUT/swe40.jsonl" --out "$OUT/eviction" "${router[@]}" \
  --kv-blocks 2500 --concurrency 12 --time-scale "$TS_EVICTION"
echo "default bench: $(( $(date +%s) - start )) s wall; reports in $OUT/thrash/report.md and $OUT/eviction/report.md"
