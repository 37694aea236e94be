#!/usr/bin/env bash
# Create .venv (if missing), install agentd, and start it on the shipped quick-start config
# (embedded simulated backend: no GPU and no worker needed).  Extra arguments go to `agentd start`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "installing agentd into .venv ..."
if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e .; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "pip install failed" >&2
  exit 1
fi
rm -f "$log"; trap - EXIT
exec .venv/bin/agentd start --config configs/quickstart.toml "$@"
