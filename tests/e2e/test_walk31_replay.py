"""``agentd replay`` against an agentd with API keys, as docs/traces.md shows it (session 31 walk).

The client key drives the requests, but the daemon's ``/metrics`` is an operator route: with API
keys it needs an admin key (docs/operations.md §10.2), so the default ``--router-metrics``
(``<target>/metrics``) answered 401.  The replay exited 0 with a report whose router figures
(scheduling transitions, router queue wait) were silently empty; only ``metrics_errors`` said
``HTTP 401``.  It now says so on stderr, with the daemon's reason and what to pass instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_walk_replay import KEY, keyed_agentd, replay

__all__ = ["keyed_agentd"]  # the fixture, used by name


def test_a_router_metrics_url_that_refuses_the_key_is_reported_on_stderr(
    tmp_path: Path, trace: str, keyed_agentd: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "r.json"
    code, requests, err = replay(capsys, trace, keyed_agentd, out, "--api-key", KEY)
    assert (code, requests["failed"]) == (0, 0), err
    report = json.loads(out.read_text())
    url = f"{keyed_agentd}/metrics"
    reason = "HTTP 401 (an admin key is required for this route (or use the admin listener))"
    assert report["metrics_errors"] == [f"{url}: {reason}", f"{url}: {reason}"]  # before and after
    assert err.count(f"agentd replay: warning: could not read {url}: {reason}\n") == 2
    assert "pass --router-metrics URL (or --router-metrics none)" in err
    # told where to look, the operator skips it: nothing to warn about
    code, requests, err = replay(capsys, trace, keyed_agentd, out, "--api-key", KEY, "--router-metrics", "none")
    assert (code, requests["failed"], err) == (0, 0, "")
    assert json.loads(out.read_text())["metrics_errors"] == []
