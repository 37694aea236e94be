#!/usr/bin/env bash
# Create .venv (if missing), install agentd with its test extras, and run the whole suite.
# Extra arguments go to pytest (e.g. ./scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
echo "installing agentd and its test dependencies into .venv ..."
if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[test]'; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "pip install failed" >&2
  exit 1
fi
rm -f "$log"; trap - EXIT
exec .venv/bin/python -m pytest "$@"
