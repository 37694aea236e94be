"""actors.mailbox: bounded named inboxes, statistics for diagnostics, one-shot replies."""

from __future__ import annotations

import math

import pytest
import trio

from actors.mailbox import ReplySlot, channel_statistics, open_mailbox, reply_nowait


def test_open_mailbox_refuses_unbounded_or_negative_buffers() -> None:
    with pytest.raises(ValueError, match="finite integer"):
        open_mailbox("x", math.inf)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got -1"):
        open_mailbox("x", -1)


async def test_mailbox_statistics_report_buffer_use() -> None:
    box = open_mailbox("inbox", 4)
    box.send.send_nowait(1)
    box.send.send_nowait(2)
    stats = box.statistics()
    assert stats == {
        "name": "inbox",
        "current_buffer_used": 2,
        "max_buffer_size": 4,
        "open_send_channels": 1,
        "open_receive_channels": 1,
        "tasks_waiting_send": 0,
        "tasks_waiting_receive": 0,
    }
    assert channel_statistics("inbox", box.recv)["current_buffer_used"] == 2


async def test_reply_nowait_answers_once_and_reports_a_gone_requester() -> None:
    send, recv = trio.open_memory_channel[int](1)  # one-shot reply channel
    assert reply_nowait(send, 7) is True
    assert await recv.receive() == 7
    with pytest.raises(trio.EndOfChannel):
        await recv.receive()  # the reply channel was closed after the answer
    send2, recv2 = trio.open_memory_channel[int](1)  # requester already gone
    recv2.close()
    assert reply_nowait(send2, 7) is False


async def test_reply_slot_delivers_in_order_and_bounds_its_buffer() -> None:
    slot = ReplySlot[int](2)
    slot.send_nowait(1)
    slot.send_nowait(2)
    assert slot.statistics().current_buffer_used == 2
    with pytest.raises(trio.WouldBlock):
        slot.send_nowait(3)
    assert await slot.receive() == 1
    assert slot.statistics().current_buffer_used == 1
    slot.close()
    assert await slot.receive() == 2  # buffered values outlive the close
    with pytest.raises(trio.EndOfChannel):
        await slot.receive()
    with pytest.raises(trio.ClosedResourceError):
        slot.send_nowait(4)


async def test_reply_slot_wakes_a_waiting_handler_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    slot = ReplySlot[str](1)
    got: list[tuple[str, float]] = []

    async def handler() -> None:
        got.append((await slot.receive(), trio.current_time()))
        try:
            await slot.receive()
        except trio.EndOfChannel:
            got.append(("end", trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler)
        await trio.sleep(1.5)
        slot.send_nowait("admitted")
        await trio.sleep(2.0)
        slot.close()
    assert got == [("admitted", 1.5), ("end", 3.5)]


async def test_reply_slot_after_the_handler_left_or_was_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    slot = ReplySlot[str](1)
    with trio.move_on_after(1.0) as scope:
        await slot.receive()
    assert scope.cancelled_caught and trio.current_time() == 1.0
    slot.send_nowait("late")  # nobody waits, but the handler has not left: buffered
    assert await slot.receive() == "late"
    slot.leave()
    with pytest.raises(trio.BrokenResourceError):
        slot.send_nowait("after leaving")
