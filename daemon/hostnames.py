"""Which ``Host`` names a listener answers: the policy against DNS rebinding (docs/operations.md §10.7).

A web page cannot send agentd an API key, but when agentd answers without keys on loopback, a page
whose name an attacker re-points at 127.0.0.1 reads whatever it asks for: the browser sends that
name as ``Host`` and treats the answer as the page's own.  A listener bound to loopback therefore
answers only requests that name it by an IP address, ``localhost`` (or a ``*.localhost`` name,
which browsers resolve to loopback themselves) or a name listed in ``server.allowed_hosts``; a
listener bound elsewhere is reached by names agentd cannot guess, so it checks only when
``server.allowed_hosts`` lists some.  ``["*"]`` turns the check off.  Pure: the HTTP side is
:mod:`daemon.http.hostguard`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

import attrs

ANY_HOST = "*"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def allowed_hosts_problem(entry: Any) -> str | None:
    """Why one ``server.allowed_hosts`` entry cannot be used, or None (docs/config.md [server])."""
    if not isinstance(entry, str) or not entry:
        return "must be a non-empty string"
    if entry == ANY_HOST:
        return None
    if len(entry) > 253:
        return "must be a host name of at most 253 characters"
    if any(ch.isspace() or ch in "/:[]@*?#" or not ch.isprintable() for ch in entry):
        return "must be a host name or .domain, without scheme, port or path (IP addresses always pass)"
    if entry.strip(".") == "":
        return "must name a domain"
    return None


def is_loopback_host(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable only from this machine."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _is_ip_literal(name: str) -> bool:
    if name and all(ch in "0123456789." for ch in name):
        return True  # dotted or shortened IPv4 (127.1): browsers never look these up in DNS
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_name(value: str) -> str | None:
    """The host of a ``Host`` value without its port, lower case, without a trailing dot; None when
    the value is malformed (an unclosed ``[``, a bad port)."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        rest = value[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return value[1:end].lower()
    if value.count(":") == 1:
        value, _, port = value.partition(":")
        if not port.isdigit():
            return None
    elif value.count(":") > 1:  # a bare IPv6 address (not valid HTTP, but nothing to rebind)
        return value.lower()
    return value.rstrip(".").lower()


@attrs.frozen
class HostPolicy:
    """Which ``Host`` names one listener answers (see the module doc)."""

    enforce: bool
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # ".example.com": example.com and every name under it

    def allows(self, value: str) -> bool:
        """Whether a ``Host`` value names this listener acceptably (an empty one: not a browser)."""
        name = host_name(value)
        if name is None:
            return False
        return not name or self._allows_name(name)

    def allows_origin(self, value: str) -> bool:
        """Whether a page of this ``Origin`` may use the listener: the same names as ``Host``.  A
        browser sends ``Origin`` with every cross-site POST, even one it sends without asking the
        server first (a ``text/plain`` body); ``null`` (a local file, a sandboxed frame) is refused."""
        scheme, sep, authority = value.strip().partition("://")
        if not sep or not scheme or not authority or "/" in authority or "@" in authority:
            return False
        name = host_name(authority)
        return name is not None and name != "" and self._allows_name(name)

    def _allows_name(self, name: str) -> bool:
        if _is_ip_literal(name) or name in _LOOPBACK_NAMES or name.endswith(".localhost"):
            return True
        if name in self.names:
            return True
        return any(name.endswith(s) or name == s[1:] for s in self.suffixes)


def host_policy(allowed_hosts: Iterable[str], bind_host: str) -> HostPolicy:
    """The policy of a listener bound to ``bind_host`` under ``server.allowed_hosts``."""
    entries = [e.lower().rstrip(".") if not e.startswith(".") else e.lower() for e in allowed_hosts]
    if ANY_HOST in entries:
        return HostPolicy(enforce=False)
    names = frozenset(e for e in entries if not e.startswith("."))
    suffixes = tuple(e.rstrip(".") for e in entries if e.startswith("."))
    return HostPolicy(enforce=bool(entries) or is_loopback_host(bind_host), names=names, suffixes=suffixes)
