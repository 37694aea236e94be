"""The ``Host`` check of every listener against DNS rebinding (docs/operations.md §10.7).

:func:`guard` puts a listener's app behind its :class:`~daemon.hostnames.HostPolicy`.  A request
without ``Host`` (HTTP/1.0, tools) passes: browsers always send one.  The probes (``/health``,
``/liveness``, ``/readiness``) pass whatever they name, so an orchestrator's probe with a ``Host``
header of its own keeps working.  A refusal is a JSON 403 ``host_not_allowed`` naming the host and
the field to change.  A request whose ``Origin`` (sent by browsers with every cross-site POST)
names a host the listener would not answer as ``Host`` is a 403 ``origin_not_allowed``: a page of
another site cannot even send requests blind.
"""

from __future__ import annotations

from typing import Any

from daemon.hostnames import HostPolicy
from daemon.http.app import AsgiSink
from daemon.http.diagnostics import PROBE_PATHS
from daemon.http.errors import ApiError
from daemon.http.proxy import send_error

_CACHE_LIMIT = 256  # verdicts remembered per listener (the Host values one client population sends)


def refusal(header: str, value: str, listener: str) -> ApiError:
    shown = value[:120]
    if header == "origin":
        message = (
            f"Origin {shown!r} is not allowed on this listener ({listener}): a web page of another site "
            "cannot use it; add the page's host name to server.allowed_hosts to allow it (docs/operations.md §10.7)"
        )
    else:
        message = (
            f"Host {shown!r} is not allowed on this listener ({listener}): it answers IP addresses, localhost "
            "and the names in server.allowed_hosts; add the name there to use it (docs/operations.md §10.7)"
        )
    return ApiError(403, message, code=f"{header}_not_allowed", param=header)


def guard(app: Any, policy: HostPolicy, listener: str) -> Any:
    """``app`` behind ``policy``: ``app`` itself when the policy checks nothing (no cost per request)."""
    if not policy.enforce:
        return app
    verdicts: dict[tuple[bytes, bytes], bool] = {}

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in PROBE_PATHS:
            for key, value in scope["headers"]:
                if key != b"host" and key != b"origin":  # (ASGI header names are lower case)
                    continue
                ok = verdicts.get((key, value))
                if ok is None:
                    text = value.decode("latin-1")
                    ok = policy.allows(text) if key == b"host" else policy.allows_origin(text)
                    if len(verdicts) >= _CACHE_LIMIT:
                        verdicts.clear()
                    verdicts[(key, value)] = ok
                if not ok:  # (the body stays unread: the server handles that as any early answer)
                    await send_error(AsgiSink(send), refusal(key.decode(), value.decode("latin-1"), listener))
                    return
        await app(scope, receive, send)

    return guarded
