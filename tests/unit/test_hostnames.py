"""The Host policy against DNS rebinding (docs/operations.md §10.7): which names a listener answers."""

from __future__ import annotations

import pytest

from daemon.hostnames import allowed_hosts_problem, host_name, host_policy, is_loopback_host


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("127.0.0.1:3001", "127.0.0.1"),
        ("LocalHost:3001", "localhost"),
        ("agentd.example.:443", "agentd.example"),
        ("[::1]:3001", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        (" example.com ", "example.com"),
        ("", ""),
        ("[::1", None),
        ("[::1]x", None),
        ("[::1]:x", None),
        ("example.com:", None),
        ("example.com:80x", None),
    ],
)
def test_host_name(value: str, name: str | None) -> None:
    assert host_name(value) == name


@pytest.mark.parametrize(
    ("bind", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.7", False),
        ("agentd.internal", False),
    ],
)
def test_loopback_listeners(bind: str, loopback: bool) -> None:
    assert is_loopback_host(bind) is loopback


def test_a_loopback_listener_answers_addresses_and_localhost_only() -> None:
    policy = host_policy((), "127.0.0.1")
    assert policy.enforce
    for ok in (
        "127.0.0.1:3001",
        "127.1:3001",
        "10.1.2.3",
        "[::1]:3001",
        "[fe80::1]",
        "localhost:3001",
        "LOCALHOST",
        "localhost.",
        "app.localhost:3001",
        "",
    ):
        assert policy.allows(ok), ok
    for refused in ("rebound.example:3001", "example.com", "localhost.example.com", "127.0.0.1.nip.io", "[::1"):
        assert not policy.allows(refused), refused


def test_allowed_hosts_add_names_and_domains() -> None:
    policy = host_policy(("agentd.corp", ".svc.cluster.local"), "127.0.0.1")
    assert policy.allows("agentd.corp:3001")
    assert policy.allows("AGENTD.CORP.")
    assert policy.allows("svc.cluster.local")
    assert policy.allows("agentd.default.svc.cluster.local:3001")
    assert not policy.allows("agentd.corp.evil.example")
    assert not policy.allows("xsvc.cluster.local")
    assert not policy.allows("other.corp")


def test_a_listener_beyond_loopback_checks_only_when_names_are_listed() -> None:
    assert not host_policy((), "0.0.0.0").enforce
    assert not host_policy((), "10.0.0.7").enforce
    listed = host_policy(("agentd.corp",), "0.0.0.0")
    assert listed.enforce
    assert listed.allows("agentd.corp") and listed.allows("10.0.0.7:3001")
    assert not listed.allows("rebound.example")


def test_a_star_answers_every_name() -> None:
    assert not host_policy(("*",), "127.0.0.1").enforce


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("agentd.corp", None),
        (".corp", None),
        ("*", None),
        ("", "must be a non-empty string"),
        (3, "must be a non-empty string"),
        ("agentd.corp:3001", "without scheme, port or path"),
        ("http://agentd.corp", "without scheme, port or path"),
        ("agentd corp", "without scheme, port or path"),
        ("*.corp", "without scheme, port or path"),
        ("[::1]", "without scheme, port or path"),
        ("...", "must name a domain"),
        ("a" * 254, "at most 253 characters"),
    ],
)
def test_allowed_hosts_entries(entry: object, problem: str | None) -> None:
    found = allowed_hosts_problem(entry)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_an_origin_is_checked_as_its_host_name() -> None:
    policy = host_policy(("agentd.corp",), "127.0.0.1")
    for ok in (
        "http://localhost:8080",
        "http://127.0.0.1:3001",
        "https://agentd.corp",
        "http://[::1]:5173",
        "http://app.localhost",
    ):
        assert policy.allows_origin(ok), ok
    for refused in (
        "https://evil.example",
        "null",
        "",
        "http://",
        "file://",
        "https://agentd.corp.evil.example",
        "https://agentd.corp/path",
        "http://user@localhost",
        "localhost:8080",
    ):
        assert not policy.allows_origin(refused), refused
