"""The ``Host`` check of every listener against DNS rebinding (docs/operations.md §10.7).

:func:`guard` puts a listener's app behind its :class:`~daemon.hostnames.HostPolicy`.  A request
without ``Host`` (HTTP/1.0, tools) passes: browsers always send one.  The probes (``/health``,
``/liveness``, ``/readiness``) pass whatever they name, so an orchestrator's probe with a ``Host``
header of its own keeps working.  A refusal is a JSON 403 ``host_not_allowed`` naming the host and
the field to change.
"""

from __future__ import annotations

from typing import Any

from daemon.hostnames import HostPolicy
from daemon.http.app import AsgiSink
from daemon.http.diagnostics import PROBE_PATHS
from daemon.http.errors import ApiError
from daemon.http.proxy import send_error

_CACHE_LIMIT = 256  # verdicts remembered per listener (the Host values one client population sends)


def refusal(value: str, listener: str) -> ApiError:
    shown = value[:120]
    return ApiError(
        403,
        f"Host {shown!r} is not allowed on this listener ({listener}): it answers IP addresses, localhost "
        "and the names in server.allowed_hosts; add the name there to use it (docs/operations.md §10.7)",
        code="host_not_allowed",
        param="host",
    )


def guard(app: Any, policy: HostPolicy, listener: str) -> Any:
    """``app`` behind ``policy``: ``app`` itself when the policy checks nothing (no cost per request)."""
    if not policy.enforce:
        return app
    verdicts: dict[bytes, bool] = {}

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in PROBE_PATHS:
            for key, value in scope["headers"]:
                if key == b"host":  # (ASGI header names are lower case)
                    ok = verdicts.get(value)
                    if ok is None:
                        ok = policy.allows(value.decode("latin-1"))
                        if len(verdicts) >= _CACHE_LIMIT:
                            verdicts.clear()
                        verdicts[value] = ok
                    if not ok:  # (the body stays unread: the server handles that as any early answer)
                        await send_error(AsgiSink(send), refusal(value.decode("latin-1"), listener))
                        return
                    break
        await app(scope, receive, send)

    return guarded
