"""Close a client connection's socket as soon as the client has gone (hypercorn 0.18, trio).

When a client closes (or resets) a connection that hypercorn considers idle - after a complete
response on a keep-alive connection, before a request head arrived, or during a request that then
ends - hypercorn's trio ``TCPServer`` leaves its read loop but then waits for its keep-alive idle
task (``keep_alive_timeout``) before it closes the socket: the socket sits in CLOSE_WAIT, holding a file
descriptor, for that long.  Clients that drop connections quickly can exhaust descriptors.  The
subclass below stops the idle task when the read loop ends and never restarts it after that, so
the socket closes as soon as the connection's request task is done
(found by the fault suite's descriptor check, docs/operations.md §11).

:mod:`daemon.http.serve` runs its own accept loop (connection cap, write timeout, drain) and
instantiates the subclass directly; :func:`install` swaps it in for the class hypercorn's own trio
runner (``hypercorn.trio.serve``) instantiates, for any code that still serves through that.
"""

from __future__ import annotations

import contextvars

import hypercorn.trio.run
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio.tcp_server import TCPServer

# Set by the app around an ASGI send whose bytes should leave with the next write of the same
# connection: a complete response's head then goes out with its body in one socket write
# (daemon.http.app.AsgiSink; one send system call less per response, docs/benchmarks.md §10.2).
# hypercorn turns an ASGI send into socket writes in the sending task, so the flag is seen there.
HOLD_WRITE: contextvars.ContextVar[bool] = contextvars.ContextVar("agentd_hold_write", default=False)


class PromptCloseTCPServer(TCPServer):
    _peer_gone = False
    _held = b""  # bytes held back by HOLD_WRITE, sent before the connection's next write

    async def _read_data(self) -> None:
        try:
            await super()._read_data()
        finally:
            self._peer_gone = True
            await self.idle_task.stop()  # the peer is gone: nothing is left to time out

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData):
            if HOLD_WRITE.get():
                self._held += event.data
                return
            if self._held:
                event, self._held = RawData(data=self._held + event.data), b""
        elif isinstance(event, Closed) and self._held:
            held, self._held = self._held, b""
            await super().protocol_send(RawData(data=held))
        # a request that ends after its client left turns the connection idle again: no new idle
        # wait then (the socket closes as soon as the request's task is done)
        if self._peer_gone and isinstance(event, Updated) and event.idle:
            return
        await super().protocol_send(event)


def install() -> None:
    hypercorn.trio.run.TCPServer = PromptCloseTCPServer  # type: ignore[misc]
