"""Start-up warnings for configurations that are legal but expose what the rest protects (found by
the session-44 security audit): an operator listener bound to every interface, which never asks for
a key (docs/operations.md §10.2), and TLS to https:// workers without certificate checks (§10.6).
``agentd check-config`` prints them and ``agentd start`` logs them, like every configuration warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.config_loading import config_from_dict, config_warnings

ROOT = Path(__file__).resolve().parents[2]


def _warnings(raw: dict[str, object]) -> dict[str, dict[str, object]]:
    return {w.event: dict(w.fields) for w in config_warnings(config_from_dict(raw))}


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_an_operator_listener_on_every_interface_warns(host: str) -> None:
    admin = _warnings({"admin": {"host": host, "port": 3002}})
    assert admin["operator_listener_on_every_interface"] == {"listener": "admin", "host": host, "port": 3002}
    metrics = _warnings({"prometheus": {"host": host, "port": 29000}})
    assert metrics["operator_listener_on_every_interface"] == {"listener": "prometheus", "host": host, "port": 29000}


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"admin": {"host": "127.0.0.1", "port": 3002}},
        {"admin": {"host": "10.0.0.5", "port": 3002}},  # a management interface: what docs/operations.md §10.2 advises
        {"prometheus": {"port": 29000}},  # the default host, 127.0.0.1
    ],
)
def test_loopback_or_named_operator_listeners_do_not_warn(raw: dict[str, object]) -> None:
    assert "operator_listener_on_every_interface" not in _warnings(raw)


def test_unverified_tls_to_https_workers_warns() -> None:
    https = {"worker_urls": ["https://w0:8000", "http://w1:8000", "https://w2:8000"]}
    assert _warnings({"routing": https, "worker_tls": {"verify": False}})["worker_tls_unverified"] == {
        "https_workers": 2
    }
    assert "worker_tls_unverified" not in _warnings({"routing": https})
    plain = {"worker_urls": ["http://w1:8000"]}
    assert "worker_tls_unverified" not in _warnings({"routing": plain, "worker_tls": {"verify": False}})


def test_check_config_prints_them(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[routing]\nworker_urls = ["https://w0:8000"]\n[worker_tls]\nverify = false\n'
        '[admin]\nhost = "0.0.0.0"\nport = 3002\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "check-config", str(config)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout + done.stderr
    assert "event=operator_listener_on_every_interface listener=admin host=0.0.0.0 port=3002" in text, text
    assert "event=worker_tls_unverified https_workers=1" in text, text
