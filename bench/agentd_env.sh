# Sourced by bench/default_bench.sh, bench/fairness_bench.sh and bench/batch_bench.sh: finds the
# agentd to run and the Python it is installed in.
#
#   AGENTD  the agentd executable: $AGENTD if set, else `agentd` on PATH, else this checkout's
#           .venv/bin/agentd (the one ./scripts/run.sh and ./scripts/test.sh create)
#   PYTHON  the interpreter of that agentd (for python -m bench.*): $PYTHON if set, else the one
#           in its #! line, else python3
# Without any agentd it stops with exit 2 and says how to get one (it exited 1 silently, or with
# "agentd: command not found", when agentd was not on PATH).
#
# It also checks the script's arguments (each takes one optional OUT_DIR): -h/--help prints the
# script's header comment and exits 0; another option or a second argument exits 2 (--help was
# taken for OUT_DIR: mkdir printed its own help, or failed on "--help/configs").
case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -euo pipefail/{/^set -euo pipefail/d;s/^# \{0,1\}//;p;}' "$0"
    exit 0
    ;;
  -*)
    echo "$(basename "$0"): unknown option $1 (usage: $(basename "$0") [OUT_DIR]; --help for more)" >&2
    exit 2
    ;;
esac
if [ "$#" -gt 1 ]; then
  echo "$(basename "$0"): one OUT_DIR at most, got $# arguments (usage: $(basename "$0") [OUT_DIR])" >&2
  exit 2
fi
_checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${AGENTD:-}" ]; then
  if command -v agentd >/dev/null 2>&1; then
    AGENTD=agentd
  elif [ -x "$_checkout/.venv/bin/agentd" ]; then
    AGENTD="$_checkout/.venv/bin/agentd"
  else
    echo "$(basename "$0"): no agentd: not on PATH and no $_checkout/.venv/bin/agentd;" \
      "run ./scripts/run.sh (or ./scripts/test.sh) once, or set AGENTD=/path/to/agentd" >&2
    exit 2
  fi
elif ! command -v "$AGENTD" >/dev/null 2>&1; then
  echo "$(basename "$0"): AGENTD=$AGENTD: not an executable" >&2
  exit 2
fi
if [ -z "${PYTHON:-}" ]; then
  PYTHON="$(head -1 "$(command -v "$AGENTD")" 2>/dev/null | sed -n 's/^#!\(.*python[0-9.]*\)$/\1/p' || true)"
  [ -n "$PYTHON" ] || PYTHON=python3
fi
