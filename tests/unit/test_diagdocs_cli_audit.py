"""Two configuration errors that named the wrong thing (diagdocs audit).

* ``agentd start --prometheus-host X`` (or ``--admin-host X``) without the port: the error named the
  field ``prometheus.port`` but neither the flag the operator typed nor the one to add.  An error
  line names a field with the flag that set it (``routing.policy (--policy): ...``); the other
  fields it mentions are named the same way now.
* A ``worker_urls`` entry that is not http(s): the error listed every URL (the whole tuple), so the
  operator had to find the wrong one; it names each offending URL now, one line each, as the
  other per-URL checks of ``worker_urls`` do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import cli


def errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The error lines under ``agentd: invalid configuration`` (check-config may print a note first)."""
    err = capsys.readouterr().err.splitlines()
    head = next(i for i, line in enumerate(err) if line.startswith("agentd: invalid configuration"))
    return [line.strip() for line in err[head + 1 :]]


@pytest.mark.parametrize("command", ["start", "check-config"])
@pytest.mark.parametrize("listener", ["prometheus", "admin"])
def test_a_listener_host_without_its_port_names_both_flags(
    command: str, listener: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # --port 21010: in case start ever got past the check, it would not take a shared port
    assert cli.main([command, "--port", "21010", f"--{listener}-host", "127.0.0.1"]) == 2
    assert errors(capsys) == [
        f"{listener}.port (--{listener}-port): must be set when {listener}.host (--{listener}-host) is set (got None)"
    ]


def test_a_listener_host_from_a_file_is_named_as_a_field_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text('[prometheus]\nhost = "127.0.0.1"\n')
    assert cli.main(["check-config", str(path)]) == 2
    assert errors(capsys) == ["prometheus.port: must be set when prometheus.host is set (got None)"]


def test_a_worker_url_without_a_scheme_is_named_alone(capsys: pytest.CaptureFixture[str]) -> None:
    urls = ["http://a:8000", "ftp://b:8000", "http://c:8000", "d:8000"]
    assert cli.main(["check-config", "--worker-urls", *urls]) == 2
    assert errors(capsys) == [
        "routing.worker_urls (--worker-urls): must be http:// or https:// URLs (got 'ftp://b:8000')",
        "routing.worker_urls (--worker-urls): must be http:// or https:// URLs (got 'd:8000')",
    ]


def test_a_worker_url_without_a_scheme_in_a_file_is_named_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agentd.toml"
    path.write_text('[routing]\nworker_urls = ["http://a:8000", "b:8000", "https://c:8000"]\n')
    assert cli.main(["check-config", str(path)]) == 2
    assert errors(capsys) == ["routing.worker_urls: must be http:// or https:// URLs (got 'b:8000')"]
