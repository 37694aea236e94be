"""Serving an ASGI app with ``hypercorn.trio.serve`` inside the caller's nursery.

:func:`serve_http` builds the hypercorn ``Config`` (bind, graceful timeout, logging through the
``agentd`` logger, no access log) and reports the *bound* URL (the real port when 0 was asked)
through ``task_status`` once the socket listens.  When ``shutdown_trigger`` returns hypercorn
stops accepting, lets in-flight requests finish until ``grace_seconds`` have passed, cancels the
rest and returns - the supervisor's graceful shutdown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from actors.logevents import get_logger
from daemon.http.hypercorn_close import install as install_prompt_close

install_prompt_close()  # close a gone client's socket at once (daemon/http/hypercorn_close.py)

KEEP_ALIVE_MAX_REQUESTS = 1 << 62


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def hypercorn_config(host: str, port: int, grace_seconds: float) -> Config:
    config = Config()
    config.bind = [bind_address(host, port)]
    config.graceful_timeout = grace_seconds
    config.accesslog = None
    config.errorlog = get_logger("hypercorn")
    config.include_server_header = False
    config.keep_alive_timeout = 75.0
    # hypercorn closes a keep-alive connection after 1000 requests by default, and that close races
    # the app's last body write (trio.BusyResourceError): the 1000th response is lost.  Agents keep
    # one connection for a whole session, so agentd never recycles connections by request count.
    config.keep_alive_max_requests = KEEP_ALIVE_MAX_REQUESTS
    return config


async def serve_http(
    app: Any,
    host: str,
    port: int,
    grace_seconds: float,
    shutdown_trigger: Callable[[], Awaitable[None]],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``shutdown_trigger`` returns, then drain within ``grace_seconds``."""
    config = hypercorn_config(host, port, grace_seconds)

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(partial(serve, app, config, shutdown_trigger=shutdown_trigger))
        task_status.started(binds[0])
