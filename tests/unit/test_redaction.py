"""Credentials never shown, control characters never logged raw (docs/operations.md §10)."""

from __future__ import annotations

import io
import json
import logging

from actors.logevents import get_logger, log_event
from daemon.config import AgentdConfig, RoutingConfig
from daemon.http.errors import error_body
from daemon.logs import configure_logging
from daemon.redact import redact, redact_url


def test_redact_masks_user_info_bearer_tokens_and_key_values() -> None:
    assert redact("http://bob:s3cret@w0:8000/v1") == "http://***@w0:8000/v1"
    assert redact("Authorization: Bearer sk-abc.def") == "Authorization: Bearer ***"
    assert redact("api_key=abc123 next") == "api_key=*** next"
    # a target id's @rank is not user-info; Program ids with ':' are not key values
    assert redact("target=http://w0:8000@1 program=task-a:lead") == "target=http://w0:8000@1 program=task-a:lead"
    assert redact_url("https://u:p@10.0.0.1:8000") == "https://***@10.0.0.1:8000"


def test_redact_masks_basic_credentials_only() -> None:
    """A worker URL's user-info goes out as HTTP Basic; a worker that echoed its Authorization in an
    error put the base64 of user:password into agentd's 502 and log (session-35 security walk)."""
    echoed = "401: your auth was Basic ZXZ1c2VyOkVWUEFTUy1TRUNSRVQ= (denied)"
    assert redact(echoed) == "401: your auth was Basic *** (denied)"
    assert redact("authorization: basic dXNlcjpwdw") == "authorization: basic ***"  # unpadded
    assert redact("basic questions, Basic ZGVm") == "basic questions, Basic ZGVm"  # no user:password inside


def test_target_ids_and_error_bodies_carry_no_credentials() -> None:
    cfg = AgentdConfig(routing=RoutingConfig(worker_urls=("http://bob:s3cret@w0:8000",)))
    [target] = cfg.targets()
    assert target.target_id == "http://***@w0:8000"
    assert target.worker_url == "http://bob:s3cret@w0:8000"  # still used to connect
    body = json.loads(error_body("worker http://bob:s3cret@w0:8000 failed", "upstream_error", None, "x"))
    assert "s3cret" not in body["error"]["message"]


def _logged(fmt: str, **fields: object) -> str:
    stream = io.StringIO()
    configure_logging("info", fmt, stream)
    log_event(get_logger("test"), logging.INFO, "probe", **fields)
    return stream.getvalue()


def test_log_values_are_redacted_and_control_characters_escaped() -> None:
    hostile = "evil\x1b[31m\nts=forged level=error\u2028\x85\x00"
    for fmt in ("kv", "json"):
        line = _logged(fmt, url="http://bob:s3cret@w0:8000", session=hostile)
        assert line.count("\n") == 1 and line.endswith("\n")
        assert "s3cret" not in line
        for raw in ("\x1b", "\u2028", "\x85", "\x00"):
            assert raw not in line
    kv = _logged("kv", session=hostile)
    assert "\\u001b[31m\\nts=forged" in kv
    assert json.loads(_logged("json", session=hostile))["session"] == hostile
