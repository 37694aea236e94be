#!/usr/bin/env bash
# Create .venv (if missing), install agentd with its test extras, and run the whole check:
# ruff (lint and format), mypy (configured in pyproject.toml), then the whole pytest suite.
# Extra arguments go to pytest and skip the linters (e.g. ./scripts/test.sh tests/unit -x).
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
status=0
if [ "$#" -eq 0 ]; then
  echo "ruff check ..."
  .venv/bin/ruff check . || status=1
  echo "ruff format --check ..."
  .venv/bin/ruff format --check . || status=1
  echo "mypy ..."
  .venv/bin/mypy || status=1
fi
# pytest last, so its summary is the closing line; a linter failure still fails the run.
.venv/bin/python -m pytest "$@" || status=$?
exit "$status"
