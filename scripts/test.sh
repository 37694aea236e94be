#!/usr/bin/env bash
# Create .venv (if missing), install agentd with its test extras, and run the whole check:
# ruff (lint and format), mypy (configured in pyproject.toml), then the whole pytest suite.
# As root with apt-get, it also installs Chromium when missing (the dashboard's browser test); with
# apt-get it fetches Debian's promtool into .venv/bin when missing (the alert rules' unit tests).
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
# The alert rules' unit tests (tests/e2e/test_alert_rules.py) run Prometheus's promtool: take the
# binary out of Debian's prometheus package into .venv/bin (no service is installed or started);
# without apt-get, or when the download fails, that one test is skipped and says why.
if ! command -v promtool >/dev/null 2>&1 && [ ! -x .venv/bin/promtool ] && command -v apt-get >/dev/null 2>&1; then
  echo "fetching promtool for the alert rules' unit tests ..."
  tmp="$(mktemp -d)"
  fetch_promtool() { (cd "$tmp" && apt-get download -qq prometheus); }
  # a fresh machine has no package lists: as root, update them once and try again
  if { fetch_promtool || { [ "$(id -u)" = 0 ] && apt-get update -qq && fetch_promtool; }; } >/tmp/agentd-promtool-fetch.log 2>&1 \
    && dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool \
    && cp "$tmp/usr/bin/promtool" .venv/bin/promtool.part && mv .venv/bin/promtool.part .venv/bin/promtool; then
    :
  else
    echo "could not fetch promtool (see /tmp/agentd-promtool-fetch.log): the promtool test will be skipped" >&2
  fi
  rm -rf "$tmp"
fi
# .venv/bin first on PATH, so the tests find the promtool fetched above
export PATH="$PWD/.venv/bin:$PATH"
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
# The whole suite runs in one pytest-xdist worker per core (at most 4: most of the slow tests are
# real sockets and child processes, which more workers than cores would only slow down); tests picked
# by arguments run in this process, where a failure is easier to follow (add -n auto for the pool).
if [ "$#" -eq 0 ]; then
  set -- -n auto --maxprocesses 4
fi
.venv/bin/python -m pytest "$@" || status=$?
exit "$status"
