"""Properties of the Host/Origin policy against DNS rebinding (docs/operations.md §10.7), over
generated names, addresses and ports: an address always passes (it cannot be re-pointed), a name
passes only when it is a localhost name or listed, case and a trailing dot do not matter, and a
page's ``Origin`` passes exactly when its host would pass as ``Host``."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from daemon.hostnames import host_policy

LABEL = st.from_regex(r"[a-z][a-z0-9-]{0,14}[a-z0-9]", fullmatch=True)
NAME = st.lists(LABEL, min_size=2, max_size=4).map(".".join)
PORT = st.one_of(st.none(), st.integers(1, 65535))
LOOPBACK = host_policy((), "127.0.0.1")


def _with_port(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


@given(address=st.ip_addresses(), port=PORT)
def test_an_address_always_passes(address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int | None) -> None:
    host = str(address) if address.version == 4 else f"[{address}]"
    assert LOOPBACK.allows(_with_port(host, port))
    assert LOOPBACK.allows_origin("http://" + _with_port(host, port))


@given(name=NAME, port=PORT, upper=st.booleans(), dot=st.booleans())
def test_a_name_passes_only_when_listed_or_a_localhost_name(
    name: str, port: int | None, upper: bool, dot: bool
) -> None:
    sent = (name.upper() if upper else name) + ("." if dot else "")
    localhost = name == "localhost" or name.endswith(".localhost")
    assert LOOPBACK.allows(_with_port(sent, port)) is localhost
    listed = host_policy((name,), "127.0.0.1")
    assert listed.allows(_with_port(sent, port))
    # a listed domain covers the names under it, not names that merely end with its text
    domain = host_policy(("." + name,), "127.0.0.1")
    assert domain.allows(_with_port("api." + sent, port)) and domain.allows(_with_port(sent, port))
    assert domain.allows(_with_port("x" + sent, port)) is localhost


@given(name=st.one_of(NAME, st.just("localhost")), port=PORT, scheme=st.sampled_from(["http", "https"]))
def test_an_origin_passes_exactly_when_its_host_would(name: str, port: int | None, scheme: str) -> None:
    for policy in (LOOPBACK, host_policy((name,), "127.0.0.1"), host_policy((), "0.0.0.0")):
        if policy.enforce:
            assert policy.allows_origin(f"{scheme}://{_with_port(name, port)}") is policy.allows(_with_port(name, port))
