"""The CLI audit of session 43: bad input a demanding user gives the commands is an exit 2 naming the
field or flag before any work, and nothing half-made is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import cli


@pytest.mark.parametrize("host", ["", "  "])
def test_prometheus_host_must_not_be_blank_on_the_command_line(capsys: pytest.CaptureFixture[str], host: str) -> None:
    """``--prometheus-host '' --prometheus-port N`` passed and the metrics listener bound 0.0.0.0,
    every interface, where ``--host ''`` and ``--admin-host ''`` are refused (docs/config.md
    [prometheus])."""
    assert cli.main(["check-config", "--prometheus-host", host, "--prometheus-port", "18150"]) == 2
    err = capsys.readouterr().err
    assert f"prometheus.host (--prometheus-host): must be null or a non-empty string (got {host!r})" in err, err


def test_prometheus_host_must_not_be_blank_in_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "metrics.toml"
    path.write_text('[prometheus]\nhost = ""\nport = 18150\n')
    assert cli.main(["check-config", str(path)]) == 2
    assert "prometheus.host: must be null or a non-empty string (got '')" in capsys.readouterr().err
