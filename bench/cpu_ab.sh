#!/usr/bin/env bash
# The scheduler-CPU benchmarks of docs/benchmarks.md §1.1 and §10.4.1, this checkout against
# another one (e.g. a detached worktree of an older main), alternated in the same minutes.
#
#   bench/cpu_ab.sh OTHER_CHECKOUT [OUT_DIR] [VLLM_ROUTER]
#
# Runs with this checkout's .venv python (or $PYTHON); a module started from OTHER_CHECKOUT's directory
# imports OTHER_CHECKOUT's code (the working directory comes before the editable install).
# Writes OUT_DIR/{core_bench,program_probe,admission,proxy_overhead}.log (default /tmp/cpu-ab)
# and prints a summary.  About 25 minutes on an idle 2-core machine.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
other="$(cd "${1:?usage: bench/cpu_ab.sh OTHER_CHECKOUT [OUT_DIR] [VLLM_ROUTER]}" && pwd)"
out="${2:-/tmp/cpu-ab}"
router="${3:-/tmp/h7/vr/venv/bin/vllm-router}"
py="${PYTHON:-$here/.venv/bin/python}"  # PYTHON=...: another venv with agentd installed
[ -f "$other/daemon/__main__.py" ] || { echo "OTHER_CHECKOUT: $other is not an agentd checkout" >&2; exit 2; }
mkdir -p "$out"
echo "cpu_ab: this $here ($(git -C "$here" rev-parse --short HEAD)), other $other ($(git -C "$other" rev-parse --short HEAD)); $(date -u '+%Y-%m-%d %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. the pure core's cycle (bench/core_bench.py of this checkout, each side's core)
: > "$out/core_bench.log"
for round in 1 2 3; do
  for side in other this; do
    dir="$other"; [ "$side" = this ] && dir="$here"
    for mode in "" "--tools"; do
      line=$(cd "$dir" && "$py" -c "import runpy, sys; sys.argv = ['core_bench', '--cycles', '10000', *sys.argv[1:]]; runpy.run_path('$here/bench/core_bench.py', run_name='__main__')" $mode | grep -E "median CPU|machine speed" | tr '\n' ' ' || true)  # (exit 1: target missed)
      echo "round $round $side ${mode:-default} :: $line" | tee -a "$out/core_bench.log"
    done
  done
done

# 1b. the same, both cores in one process, interleaved block by block (robust to the machine's drift)
"$py" -m bench.core_ab "$other" | tee -a "$out/core_bench.log"
"$py" -m bench.core_ab "$other" --tools | tee -a "$out/core_bench.log"

# 2. agentd's CPU per Program request: c=1 with N = 1, c=32 with N = 2 (alternated inside)
"$py" -m bench.program_probe --compare "$other" --rounds 3 --seconds 5 | tee "$out/program_probe.log"
"$py" -m bench.program_probe --compare "$other" --rounds 3 --seconds 5 --processes 2 --concurrency 32 | tee -a "$out/program_probe.log"

# 3. the admission ceiling through the real scheduler actor
: > "$out/admission.log"
for round in 1 2 3; do
  for side in other this; do
    dir="$other"; [ "$side" = this ] && dir="$here"
    line=$(cd "$dir" && "$py" -m bench.admission_bench --cycles 10000 | grep "CPU per cycle" || true)
    echo "round $round $side :: $line" | tee -a "$out/admission.log"
  done
done

# 4. the overhead bench's Program cells, N = 1 and 2, with vllm-router when installed
: > "$out/proxy_overhead.log"
for side in other this; do
  dir="$other"; [ "$side" = this ] && dir="$here"
  echo "== $side ($dir)" | tee -a "$out/proxy_overhead.log"
  args=(--bodies 1 --identity program --processes 1,2)
  if [ -x "$router" ]; then args+=(--vllm-router "$router"); else args+=(--no-router); fi
  (cd "$dir" && "$py" -m bench.proxy_overhead "${args[@]}") | tee -a "$out/proxy_overhead.log"
done
echo "cpu_ab: done $(date -u '+%H:%M UTC'); logs in $out"
