"""Bounded mailboxes and the one-shot reply helper used by every actor.

Every actor owns exactly one inbox: a bounded ``trio`` memory channel.  :func:`open_mailbox`
creates it with a *name* (shown in ``/scheduling/diagnostics``) and a buffer size that the caller
must justify in a comment next to the call.  :func:`channel_statistics` turns trio's
``statistics()`` into a plain dict for diagnostics.

Request/reply: the requester opens a one-slot reply channel and sends it inside its message;
the actor answers exactly once with :func:`reply_nowait` (one slot can never block the actor).
A requester whose reply channel is closed without an answer raises :class:`ActorGone`.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import trio
from attrs import frozen

T = TypeVar("T")
R = TypeVar("R")


class ActorGone(RuntimeError):
    """The actor closed its side before answering (it is shutting down)."""


@frozen(eq=False)
class Mailbox(Generic[T]):
    """An actor's inbox: the send side is cloned to producers, the receive side is the actor's."""

    name: str
    send: trio.MemorySendChannel[T]
    recv: trio.MemoryReceiveChannel[T]

    def statistics(self) -> dict[str, Any]:
        return channel_statistics(self.name, self.send)


def open_mailbox(name: str, max_buffer_size: int) -> Mailbox[Any]:
    """A named bounded inbox.  ``max_buffer_size`` must be finite: unbounded inboxes are banned."""
    if not isinstance(max_buffer_size, int) or max_buffer_size < 0:
        raise ValueError(f"mailbox {name!r}: max_buffer_size must be a finite integer >= 0 (got {max_buffer_size!r})")
    send, recv = trio.open_memory_channel[Any](max_buffer_size)
    return Mailbox(name=name, send=send, recv=recv)


def channel_statistics(
    name: str, channel: trio.MemorySendChannel[Any] | trio.MemoryReceiveChannel[Any]
) -> dict[str, Any]:
    """The channel's ``statistics()`` as a JSON-ready dict."""
    st = channel.statistics()
    return {
        "name": name,
        "current_buffer_used": st.current_buffer_used,
        "max_buffer_size": st.max_buffer_size,
        "open_send_channels": st.open_send_channels,
        "open_receive_channels": st.open_receive_channels,
        "tasks_waiting_send": st.tasks_waiting_send,
        "tasks_waiting_receive": st.tasks_waiting_receive,
    }


def reply_nowait(reply: trio.MemorySendChannel[R], value: R) -> bool:
    """Answer a request exactly once and close the reply channel.

    Returns False when the requester is already gone (it closed its side): the answer is dropped
    because nobody can receive it; the caller decides what that means (for example an ``Admit``
    nobody waits for any more is followed by the requester's ``Abandoned``).
    """
    with reply:
        try:
            reply.send_nowait(value)
        except trio.BrokenResourceError:
            return False
    return True


class ReplySlot(Generic[R]):
    """A one-consumer reply box for one request: what a memory channel of ``max_buffer_size``
    gives a waiting handler, without a channel pair (and a clone) per request
    (docs/benchmarks.md §10.4.1).

    The actor's side is the ``ReplySink`` protocol (actors/messages.py): ``send_nowait`` buffers a
    value (``trio.WouldBlock`` when full, ``trio.ClosedResourceError`` after ``close``,
    ``trio.BrokenResourceError`` once the handler has left), ``close`` ends it, ``statistics``
    reports ``current_buffer_used``.  The handler's side: ``await receive()`` (the buffered values
    in order, then ``trio.EndOfChannel`` once closed; the same checkpoints as a channel's
    ``receive``) and ``leave()`` when it stops listening.
    """

    __slots__ = ("_items", "_limit", "_task", "_closed", "_left")

    def __init__(self, max_buffer_size: int) -> None:
        self._items: list[R] = []
        self._limit = max_buffer_size
        self._task: Any = None  # the handler's task while it waits in ``receive``
        self._closed = False
        self._left = False

    # ---- the actor's side -------------------------------------------------------------------

    def send_nowait(self, value: R, /) -> None:
        if self._left:
            raise trio.BrokenResourceError("the handler stopped listening")
        if self._closed:
            raise trio.ClosedResourceError("the reply slot was closed")
        if len(self._items) >= self._limit:
            raise trio.WouldBlock
        self._items.append(value)
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def statistics(self) -> _SlotStatistics:
        return _SlotStatistics(len(self._items))

    def _wake(self) -> None:
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)

    # ---- the handler's side -----------------------------------------------------------------

    async def receive(self) -> R:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._items:
            if self._closed:
                raise trio.EndOfChannel
            self._task = trio.lowlevel.current_task()

            def abort(_: Any) -> trio.lowlevel.Abort:
                self._task = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
            if not self._items:  # woken by ``close``
                raise trio.EndOfChannel
            return self._items.pop(0)
        value = self._items.pop(0)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return value

    def receive_nowait(self) -> R:
        """The next buffered value without a checkpoint (``trio.WouldBlock`` when there is none,
        ``trio.EndOfChannel`` once closed and empty): for a reply already given while the handler
        ran (``SchedulerHandle.handle_now``)."""
        if self._items:
            return self._items.pop(0)
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    def leave(self) -> None:
        self._left = True
        self._items.clear()


@frozen
class _SlotStatistics:
    current_buffer_used: int
