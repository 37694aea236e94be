"""actors.mailbox: bounded named inboxes, statistics for diagnostics, one-shot replies."""

from __future__ import annotations

import math

import pytest
import trio

from actors.mailbox import channel_statistics, open_mailbox, reply_nowait


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
