"""The ASGI lifespan protocol for the daemon's hand-written ASGI apps (the standalone metrics
listener and the relay process's app): nothing to set up or tear down, so each event is
acknowledged at once."""

from __future__ import annotations

from typing import Any


async def answer_lifespan(receive: Any, send: Any) -> None:
    """Acknowledge ``lifespan.startup`` and ``lifespan.shutdown``; return after the shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
