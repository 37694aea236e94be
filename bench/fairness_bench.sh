#!/usr/bin/env bash
# The priority and fairness benchmarks of issue 13 (docs/benchmarks.md §7), side by side in one
# run, each system simulated in virtual time with `agentd simulate` (deterministic; no sockets):
#
#   1. noisy neighbour: tenant `flood` starts 2.5x as many swe-short Programs as the cluster's KV
#      holds, all at t = 0; tenant `light` runs a quarter of what fits, spread over the first 8 s
#      (bench/fairness/scenarios.py, kind `flood`).  Each system runs `light` alone and
#      `light` + `flood`; the table gives light's mean JCT ratio (bar <= 1.25) and the total
#      tokens/s with the flood against native's (bar: within 5%).
#   2. interactive under batch: tenant `batch` submits a batch job that keeps the cluster busy
#      for about 30 s; tenant `interactive` sends one-shot interactive requests every 1.5 s (kind
#      `interactive-under-batch`).  The table gives the interactive TTFT p90 with the batch job
#      over alone (bar <= 1.2).
#
#   Systems: native     agentd with Program scheduling off, [batch_jobs] off (everything on the
#                       native consistent-hash path), engines fcfs
#            agentd     configs/quickstart.toml's scheduling: Program scheduling, [batch_jobs] on,
#                       [priority] interactive_scheduling = true,
#                       batch_max_running_near_interactive = 2 and interactive_reserved_ranks = 1
#                       (headroom for interactive, one rank kept free of batch while interactive
#                       traffic is recent), tenant_pause_share = true (fair
#                       share between tenants), heavy_tenant_max_active_per_rank = 0 and
#                       tenant_isolation_tool_call_seconds = 10 (isolating light tenants, through
#                       their tool calls), long_prefill_seconds = 2 (one long prefill at a time
#                       per rank), requeue_long_prefills = true (such a prefill blocking a light
#                       tenant is taken back before its first token), the default class bands (interactive > agent >
#                       batch) and VTC; engines fcfs
#            agentd-cap agentd without interactive_reserved_ranks (the headroom cap on every
#                       rank, as before session 23); interactive under batch only
#            agentd-pe  agentd with the engines in vLLM's priority mode
#                       ([embedded] scheduling_policy = "priority": agentd forwards priorities);
#                       interactive under batch only (the noisy-neighbour trace has no priorities,
#                       so it would repeat agentd's row)
#
#   bench/fairness_bench.sh [OUT_DIR]        (default OUT_DIR: fairness-bench-out)
#
# Environment: AGENTD (default: agentd on PATH, else this checkout's .venv/bin/agentd), PYTHON (the interpreter agentd is installed in; default:
# the one running agentd), SEEDS (scenario seeds, default "1 2 3"), SCALE (scenario size
# multiplier, default 1), BLOCKS (KV blocks per rank, default 4096), WORKERS (embedded workers x 2
# DP ranks, default 1).  Reports: OUT_DIR/<scenario>-seed<S>/<system>.<alone|with>.json; tables
# in OUT_DIR/summary.md.
set -euo pipefail
OUT="${1:-fairness-bench-out}"
source "$(dirname "$0")/agentd_env.sh"  # AGENTD and PYTHON
SEEDS="${SEEDS:-1 2 3}"
SCALE="${SCALE:-1}"
BLOCKS="${BLOCKS:-4096}"
WORKERS="${WORKERS:-1}"
RANKS=$((WORKERS * 2))
mkdir -p "$OUT/configs"
start=$(date +%s)

# config NAME FAIR(0|1) ENGINE_POLICY [RESERVED_RANKS]
config() {
  local name=$1 fair=$2 policy=$3 reserved=${4:-1}
  {
    [ "$fair" = 1 ] && echo "enable_program_scheduling = true"
    cat <<EOF
[server]
log_level = "warning"

[routing]
policy = "consistent_hash"

[embedded]
num_workers = $WORKERS
dp_size = 2
num_gpu_blocks = $BLOCKS
block_size = 16
scheduling_policy = "$policy"
seed = 0
EOF
    if [ "$fair" = 1 ]; then
      cat <<EOF

[program_scheduling]
global_queue = true
resume_order = "mru"
token_capacity_per_dp_rank = $((BLOCKS * 16))
binding_strategy = "reasoning_token_balance"

[batch_jobs]
enabled = true

[priority]
interactive_scheduling = true
batch_max_running_near_interactive = 2
interactive_reserved_ranks = $reserved
tenant_pause_share = true
heavy_tenant_max_active_per_rank = 0
tenant_isolation_tool_call_seconds = 10
long_prefill_seconds = 2
requeue_long_prefills = true
EOF
    else
      printf '\n[batch_jobs]\nenabled = false\n'
    fi
  } > "$OUT/configs/$name.toml"
}

simulate() {  # DIR SYSTEM RUN TRACE
  local t0=$(date +%s)
  # the daemon's start-up warnings go to $1/$2.$3.log
  "$AGENTD" simulate --config "$OUT/configs/$2.toml" --trace "$4" --out "$1/$2.$3.json" > /dev/null \
    2> "$1/$2.$3.log" || {
    echo "fairness bench: $1/$2.$3 had failed requests (see $1/$2.$3.json, $1/$2.$3.log)" >&2
  }
  echo "fairness bench: $1/$2.$3 simulated in $(( $(date +%s) - t0 )) s" >&2
}

systems_of() {  # KIND
  if [ "$1" = flood ]; then echo "native agentd"; else echo "native agentd agentd-cap agentd-pe"; fi
}
config native 0 fcfs
config agentd 1 fcfs
config agentd-cap 1 fcfs 0
config agentd-pe 1 priority

summary=()
for kind in flood interactive-under-batch; do
  for seed in $SEEDS; do
    dir="$OUT/$kind-seed$seed"
    mkdir -p "$dir"
    "$PYTHON" -m bench.fairness.scenarios --kind "$kind" --ranks "$RANKS" --kv-tokens-per-rank $((BLOCKS * 16)) \
      --seed "$seed" --scale "$SCALE" --out "$dir/with.jsonl" --alone-out "$dir/alone.jsonl"
    for system in $(systems_of "$kind"); do
      simulate "$dir" "$system" alone "$dir/alone.jsonl"
      simulate "$dir" "$system" with "$dir/with.jsonl"
    done
    summary+=("$kind:$seed")
  done
done

{
  for item in "${summary[@]}"; do
    kind=${item%%:*}; seed=${item##*:}; dir="$OUT/$kind-seed$seed"
    if [ "$kind" = flood ]; then
      "$PYTHON" -m bench.fairness.compare --kind noisy \
        --title "noisy neighbour, seed $seed ($RANKS ranks x $BLOCKS blocks, scale $SCALE)" \
        $(for s in $(systems_of "$kind"); do echo "$s=$dir/$s.alone.json,$dir/$s.with.json"; done)
    else
      "$PYTHON" -m bench.fairness.compare --kind interactive \
        --title "interactive under batch, seed $seed ($RANKS ranks x $BLOCKS blocks, scale $SCALE)" \
        $(for s in $(systems_of "$kind"); do echo "$s=$dir/$s.alone.json,$dir/$s.with.json"; done)
    fi
    echo
  done
} | tee "$OUT/summary.md.tmp"
mv "$OUT/summary.md.tmp" "$OUT/summary.md"
echo "fairness bench: $(( $(date +%s) - start )) s wall; tables in $OUT/summary.md"
