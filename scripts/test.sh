#!/usr/bin/env bash
# Create .venv (if missing), install agentd with its test extras, and run the whole check:
# ruff (lint and format), mypy (configured in pyproject.toml), then the whole pytest suite.
# As root with apt-get, it also installs Chromium and wrk when missing (the dashboard's browser test,
# the native benchmark harness's test); with apt-get it fetches Debian's promtool and nginx binaries
# into .venv/bin when missing (the alert rules' unit tests, the native harness's fake worker).
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
# The dashboard's browser test (tests/e2e/test_dashboard_browser.py) needs Chromium, the native
# benchmark harness's test (tests/e2e/test_native_harness.py) wrk: install the Debian packages
# quietly when missing and we are root (CI runs this script as root on a fresh machine); otherwise
# those tests are skipped and say why.
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing$missing for the browser and native-harness tests ..."
  # shellcheck disable=SC2086  # one word per package
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing; } >/tmp/agentd-apt-install.log 2>&1; then
    echo "could not install$missing (see /tmp/agentd-apt-install.log): the tests that need them will be skipped" >&2
  fi
fi
# Two tests need a binary out of a Debian package, taken into .venv/bin without installing the
# package (no service is installed or started): promtool from prometheus (the alert rules' unit
# tests, tests/e2e/test_alert_rules.py) and nginx (the native harness's fake worker). Without
# apt-get, or when the download fails, the test is skipped and says why.
fetch_binary() {  # package, path inside it, name in .venv/bin
  if command -v "$3" >/dev/null 2>&1 || [ -x ".venv/bin/$3" ] || ! command -v apt-get >/dev/null 2>&1; then
    return 0
  fi
  echo "fetching $3 from Debian's $1 package ..."
  local tmp
  tmp="$(mktemp -d)"
  fetch() { (cd "$tmp" && apt-get download -qq "$1"); }
  # a fresh machine has no package lists: as root, update them once and try again
  if { fetch "$1" || { [ "$(id -u)" = 0 ] && apt-get update -qq && fetch "$1"; }; } >"/tmp/agentd-$3-fetch.log" 2>&1 \
    && dpkg-deb --fsys-tarfile "$tmp/$1"_*.deb | tar -x -C "$tmp" "./$2" \
    && cp "$tmp/$2" ".venv/bin/$3.part" && mv ".venv/bin/$3.part" ".venv/bin/$3"; then
    :
  else
    echo "could not fetch $3 (see /tmp/agentd-$3-fetch.log): the test that needs it will be skipped" >&2
  fi
  rm -rf "$tmp"
}
fetch_binary prometheus usr/bin/promtool promtool
fetch_binary nginx usr/sbin/nginx nginx
# .venv/bin first on PATH, so the tests find the binaries fetched above
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
