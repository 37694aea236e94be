#!/usr/bin/env bash
# Create .venv (if missing), install agentd, and start it on the shipped quick-start config
# (embedded simulated backend: no GPU and no worker needed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e .
exec .venv/bin/agentd start --config configs/quickstart.toml "$@"
