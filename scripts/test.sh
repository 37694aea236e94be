#!/usr/bin/env bash
# Create .venv (if missing), install agentd with its test extras, and run the whole check:
# ruff (lint and format), mypy (configured in pyproject.toml), then the whole pytest suite.
# As root with apt-get, it also installs Chromium when missing (the dashboard's browser test).
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
# The dashboard's browser test (tests/e2e/test_dashboard_browser.py) needs Chromium: install the
# Debian package quietly when it is missing and we are root (CI runs this script as root on a fresh
# machine); otherwise that one test is skipped and says why.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium for the dashboard browser test ..."
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/tmp/agentd-chromium-install.log 2>&1; then
    echo "could not install chromium (see /tmp/agentd-chromium-install.log): the browser test will be skipped" >&2
  fi
fi
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
