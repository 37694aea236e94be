#!/usr/bin/env bash
# The batch-job benchmarks of issue 12 (docs/batch.md section 5), side by side in one run,
# each system simulated in virtual time with `agentd simulate` (deterministic; no sockets):
#
#   1. batch only, KV pressure (the `batch` trace profile: four jobs with different decode lengths):
#        fcfs          native dispatch, [batch_jobs] enabled = false (batch takes the native path),
#                      engines fcfs
#        agentd        Program scheduling + [batch_jobs] enabled = true (router-side batch
#                      scheduling), engines fcfs
#        engine-bja    native dispatch, engines --scheduling-policy batch_job_aware (the seed's
#                      scheduler inside each simulated engine)
#   2. agents (swe-short) + a batch job merged into one trace (`agentd trace merge`):
#        fcfs          native dispatch of everything (FCFS co-location), engines fcfs
#        agentd-ps     Program scheduling, batch on the native path
#        agentd        Program scheduling + [batch_jobs] enabled = true
#        engine-bja    native dispatch, engines batch_job_aware
#
#   bench/batch_bench.sh [OUT_DIR]        (default OUT_DIR: batch-bench-out)
#
# Prints a ratio table per scenario (python -m bench.batch_compare; report / first column), the
# batch-only trace's makespan floor for any order (python -m bench.batch_bound), and writes them to
# OUT_DIR/summary.md; every report is OUT_DIR/<scenario>/<system>.json, configs in OUT_DIR/configs.
# Environment: AGENTD (default: agentd on PATH, else this checkout's .venv/bin/agentd), PYTHON
# (the interpreter agentd is installed in, for the
# table; default: the one running agentd), BATCH_REQUESTS (default 400), MIX_PROGRAMS (swe-short
# Programs of scenario 2, default 8: a light agent fleet), MIX_BATCH_REQUESTS (default 800: a batch
# job that saturates the cluster for about 100 s), BLOCKS_BATCH and
# BLOCKS_MIX (KV blocks per rank; defaults 2048 and 1500), MIX_SEED (scenario 2's trace seed: agents
# MIX_SEED, batch MIX_SEED + 1; default 1), SOCKETS=1 (also run the batch-only
# trace over sockets with `agentd bench`, native dispatch, fcfs vs batch_job_aware engines, at
# TIME_SCALE, default 4), SCENARIOS (which scenarios to run: `batch-only`, `mixed` or both,
# space-separated; unset or empty: both; bench/batch_sweep.py runs one per KV size).
set -euo pipefail
OUT="${1:-batch-bench-out}"
source "$(dirname "$0")/agentd_env.sh"  # AGENTD and PYTHON
BATCH_REQUESTS="${BATCH_REQUESTS:-400}"
MIX_PROGRAMS="${MIX_PROGRAMS:-8}"
MIX_BATCH_REQUESTS="${MIX_BATCH_REQUESTS:-800}"
BLOCKS_BATCH="${BLOCKS_BATCH:-2048}"
BLOCKS_MIX="${BLOCKS_MIX:-1500}"
MIX_SEED="${MIX_SEED:-1}"
SCENARIOS="${SCENARIOS:-batch-only mixed}"
run_batch_only=0
run_mixed=0
for scenario in $SCENARIOS; do
  case "$scenario" in
    batch-only) run_batch_only=1 ;;
    mixed) run_mixed=1 ;;
    *)
      echo "batch_bench.sh: SCENARIOS: unknown scenario '$scenario' (batch-only, mixed)" >&2
      exit 2
      ;;
  esac
done
if [ "$run_batch_only$run_mixed" = 00 ]; then
  echo "batch_bench.sh: SCENARIOS is empty (batch-only, mixed)" >&2
  exit 2
fi
mkdir -p "$OUT/configs"
start=$(date +%s)

# config NAME BLOCKS WORKERS ENGINE_POLICY PROGRAM_SCHEDULING(0|1) BATCH_JOBS(0|1)
config() {
  local name=$1 blocks=$2 workers=$3 policy=$4 ps=$5 bj=$6
  {
    [ "$ps" = 1 ] && echo "enable_program_scheduling = true"
    cat <<EOF
[server]
log_level = "warning"

[routing]
policy = "consistent_hash"

[embedded]
num_workers = $workers
dp_size = 2
num_gpu_blocks = $blocks
block_size = 16
scheduling_policy = "$policy"
seed = 0
EOF
    if [ "$ps" = 1 ]; then
      cat <<EOF

[program_scheduling]
global_queue = true
resume_order = "mru"
token_capacity_per_dp_rank = $((blocks * 16))
binding_strategy = "reasoning_token_balance"
EOF
    fi
    if [ "$bj" = 1 ]; then
      cat <<EOF

[batch_jobs]
enabled = true
EOF
    fi
  } > "$OUT/configs/$name.toml"
}

simulate() {  # SCENARIO SYSTEM CONFIG TRACE
  local t0=$(date +%s)
  "$AGENTD" simulate --config "$OUT/configs/$3.toml" --trace "$4" --out "$OUT/$1/$2.json" || {
    echo "batch bench: $1/$2 had failed requests (see $OUT/$1/$2.json)" >&2
  }
  echo "batch bench: $1/$2 simulated in $(( $(date +%s) - t0 )) s" >&2
}

if [ "$run_batch_only" = 1 ]; then
  mkdir -p "$OUT/batch-only"
  "$AGENTD" trace synth --profile batch --programs "$BATCH_REQUESTS" --seed 1 --out "$OUT/batch.jsonl"
  # 1. batch only: one worker x 2 DP ranks under KV pressure
  config batch-fcfs "$BLOCKS_BATCH" 1 fcfs 0 0
  config batch-agentd "$BLOCKS_BATCH" 1 fcfs 1 1
  config batch-engine-bja "$BLOCKS_BATCH" 1 batch_job_aware 0 0
  simulate batch-only fcfs batch-fcfs "$OUT/batch.jsonl"
  simulate batch-only agentd batch-agentd "$OUT/batch.jsonl"
  simulate batch-only engine-bja batch-engine-bja "$OUT/batch.jsonl"
fi

if [ "$run_mixed" = 1 ]; then
  mkdir -p "$OUT/mixed"
  "$AGENTD" trace synth --profile swe-short --programs "$MIX_PROGRAMS" --seed "$MIX_SEED" --input-scale 0.5 \
    --out "$OUT/agents.jsonl"
  "$AGENTD" trace synth --profile batch --programs "$MIX_BATCH_REQUESTS" --seed $((MIX_SEED + 1)) \
    --out "$OUT/mix-batch.jsonl"
  "$AGENTD" trace merge "$OUT/agents.jsonl" "$OUT/mix-batch.jsonl" -o "$OUT/mixed.jsonl"
  # 2. agents + batch: two workers x 2 DP ranks
  config mix-fcfs "$BLOCKS_MIX" 2 fcfs 0 0
  config mix-agentd-ps "$BLOCKS_MIX" 2 fcfs 1 0
  config mix-agentd "$BLOCKS_MIX" 2 fcfs 1 1
  config mix-engine-bja "$BLOCKS_MIX" 2 batch_job_aware 0 0
  simulate mixed fcfs mix-fcfs "$OUT/mixed.jsonl"
  simulate mixed agentd-ps mix-agentd-ps "$OUT/mixed.jsonl"
  simulate mixed agentd mix-agentd "$OUT/mixed.jsonl"
  simulate mixed engine-bja mix-engine-bja "$OUT/mixed.jsonl"
fi

{
  if [ "$run_batch_only" = 1 ]; then
    "$PYTHON" -m bench.batch_compare --title "batch only ($BATCH_REQUESTS requests, $BLOCKS_BATCH blocks/rank)" \
      fcfs="$OUT/batch-only/fcfs.json" agentd="$OUT/batch-only/agentd.json" \
      engine-bja="$OUT/batch-only/engine-bja.json"
    echo
    # what no dispatch order can beat on this trace and cluster (docs/batch.md §5.4)
    "$PYTHON" -m bench.batch_bound --trace "$OUT/batch.jsonl" --config "$OUT/configs/batch-fcfs.toml" \
      --report fcfs="$OUT/batch-only/fcfs.json" --report agentd="$OUT/batch-only/agentd.json" \
      --report engine-bja="$OUT/batch-only/engine-bja.json"
  fi
  if [ "$run_mixed" = 1 ]; then
    [ "$run_batch_only" = 1 ] && echo
    "$PYTHON" -m bench.batch_compare \
      --title "agents + batch ($MIX_PROGRAMS swe-short Programs + $MIX_BATCH_REQUESTS batch requests, $BLOCKS_MIX blocks/rank)" \
      fcfs="$OUT/mixed/fcfs.json" agentd-ps="$OUT/mixed/agentd-ps.json" agentd="$OUT/mixed/agentd.json" \
      engine-bja="$OUT/mixed/engine-bja.json"
  fi
  if [ "${SOCKETS:-0}" = 1 ] && [ "$run_batch_only" = 1 ]; then
    # optional: the batch-only trace over loopback sockets (`agentd bench`: real agentd and
    # sim-backend processes, time-scaled), native dispatch with fcfs vs batch_job_aware engines
    for policy in fcfs batch_job_aware; do
      "$AGENTD" bench --trace "$OUT/batch.jsonl" --out "$OUT/sockets-$policy" --systems native \
        --workers 1 --kv-blocks "$BLOCKS_BATCH" --time-scale "${TIME_SCALE:-4}" \
        --scheduling-policy "$policy" --no-progress > /dev/null
    done
    echo
    "$PYTHON" -m bench.batch_compare --title "batch only over sockets (agentd bench, time scale ${TIME_SCALE:-4})" \
      fcfs="$OUT/sockets-fcfs/native.json" engine-bja="$OUT/sockets-batch_job_aware/native.json"
  fi
} | tee "$OUT/summary.md.tmp"
mv "$OUT/summary.md.tmp" "$OUT/summary.md"
echo "batch bench: $(( $(date +%s) - start )) s wall; tables in $OUT/summary.md"
