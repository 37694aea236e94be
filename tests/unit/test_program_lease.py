"""A Program lease's re-admission (docs/priority.md §3, "Re-queueing a blocking long prefill"):
a refusal of the re-admission is worded by the dispatcher, so a ``no_targets`` refusal names each
worker's reason as the first admission's refusal does (docs/operations.md §11.3)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.core.config import BackendTarget
from actors.core.errors import NO_TARGETS, Rejection
from actors.core.events import RequestRequeued
from actors.messages import Submission
from daemon.dispatch import DispatchRejected
from daemon.program_dispatch import ProgramDispatcher, ProgramLease


class Board:
    def unhealthy_reason(self) -> str:
        return "http://w0:8000: HTTP 503"


async def refuse_requeue(inbox: trio.MemoryReceiveChannel[Any], rejection: Rejection) -> None:
    submission = await inbox.receive()
    assert isinstance(submission, Submission) and isinstance(submission.event, RequestRequeued)
    submission.reply.send_nowait(rejection)


@pytest.mark.parametrize("reason", ["no_targets", "queue_timeout"])
async def test_a_refused_readmission_is_worded_by_the_dispatcher(
    autojump_clock: trio.testing.MockClock, reason: str
) -> None:
    dispatcher = object.__new__(ProgramDispatcher)  # only ``explain`` and its health board are used
    dispatcher.health = Board()  # type: ignore[assignment]
    rejection = NO_TARGETS if reason == "no_targets" else attrs.evolve(NO_TARGETS, reason=reason, status_hint=429)
    send, recv = trio.open_memory_channel[Any](1)
    lease = ProgramLease(
        target=BackendTarget("http://w0:8000", 0, "http://w0:8000", 0, ranked=False),
        request_id="r1",
        program="p",
        queue_seconds=0.0,
        send=send,
        requeueable=True,
        explain=dispatcher.explain,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(refuse_requeue, recv, rejection)
        with pytest.raises(DispatchRejected) as refused:
            await lease.readmit()
    assert lease.dropped
    if reason == "no_targets":
        assert refused.value.rejection.message == "no healthy DP targets are available: http://w0:8000: HTTP 503"
    else:
        assert refused.value.rejection == rejection  # other refusals are unchanged
