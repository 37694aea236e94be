"""Every message between the actors is a plain value: cattrs (un)structures it, through JSON and
back, to an equal value, so the messages could cross a process boundary (docs/architecture.md §3)."""

from __future__ import annotations

import json
import typing

import pytest
import trio
from cattrs.preconf.json import make_converter

from actors.core.config import BackendTarget
from actors.core.effects import ArmTimer, CancelTimer
from actors.core.errors import QUEUE_TIMEOUT, Rejection
from actors.core.events import RequestAbandoned, RequestCompleted, RequestSubmitted, TimerFired
from actors.core.ids import ProgramRef, RequestId, TargetId
from actors.core.model import RequestHints, Usage
from actors.messages import (
    Admitted,
    ObservationReceived,
    ObservationRoundStarted,
    ProgramCommand,
    QueuePosition,
    RepairTick,
    Reply,
    SchedulerMessage,
    Submission,
)
from daemon.http.identity import parse_identity

TARGET = BackendTarget(worker_url="http://w0:8000", dp_rank=1, target_id="http://w0:8000@1", index=1)
REF = ProgramRef("default", "task-a:lead", 3)


def _submitted() -> RequestSubmitted:
    body = {"vllm_xargs": {"agentic_context": {"program_id": "task-a:lead", "task_id": "task-a", "priority": 2}}}
    parsed = parse_identity(body, {"x-session-id": "s"})
    assert parsed is not None
    return RequestSubmitted(
        request_id=RequestId("agentd-1"),
        identity=parsed.identity,
        estimated_prompt_tokens=1234,
        hints=parsed.hints,
        routing_text="system:You are a coder",
        targets=(TARGET,),
    )


MESSAGES: list[object] = [
    _submitted(),
    RequestCompleted(
        RequestId("agentd-1"), True, Usage(prompt_tokens=10, cached_prompt_tokens=4, completion_tokens=2), 0.5
    ),
    RequestCompleted(RequestId("agentd-2"), False),
    RequestAbandoned(RequestId("agentd-3")),
    TimerFired(program=REF, kind="acting_ttl", token=7),
    ObservationRoundStarted(epoch=2, target_ids=(TARGET.target_id,)),
    ObservationReceived(
        target_id=TargetId(TARGET.target_id),
        epoch=2,
        kv_cache_usage=0.5,
        running_requests=3,
        waiting_requests=0,
        observed_at=12.5,
        kv_capacity_tokens=64000,
    ),
    ObservationReceived(TargetId(TARGET.target_id), 3, None, 4, None),
    RepairTick(deadline=14.0),
    RepairTick(),
    ArmTimer(program=REF, kind="force_resume", deadline=300.25, token=8),
    CancelTimer(program=REF, kind="force_resume"),
    Admitted(request_id="agentd-1", target=TARGET, program="0123456789abcdef", queue_seconds=0.25),
    Rejection(reason="queue_timeout", status_hint=429, message="late", retry_after_seconds=1.0),
    QueuePosition(request_id="agentd-1", position=3, eta_seconds=4.25),
    QUEUE_TIMEOUT,
]
UNIONS = {"scheduler": SchedulerMessage, "program": ProgramCommand, "reply": Reply}


def _union_members(union: object) -> set[type]:
    return set(typing.get_args(union))


def test_the_cases_cover_every_message_type() -> None:
    covered = {type(m) for m in MESSAGES}
    for name, union in UNIONS.items():
        assert _union_members(union) <= covered, name


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_message_round_trips_through_json(message: object) -> None:
    converter = make_converter()
    wire = json.dumps(converter.unstructure(message))
    back = converter.structure(json.loads(wire), type(message))
    assert back == message
    assert type(back) is type(message)


def test_submitted_identity_and_hints_survive_the_wire() -> None:
    converter = make_converter()
    message = _submitted()
    back = converter.structure(json.loads(json.dumps(converter.unstructure(message))), RequestSubmitted)
    assert back.identity.program_id == "task-a:lead" and back.hints == RequestHints(priority=2)
    assert back.targets == (TARGET,) and isinstance(back.targets[0], BackendTarget)
    assert isinstance(back.request_id, str) and back.request_id == "agentd-1"
    assert TargetId(TARGET.target_id) == back.targets[0].target_id


def test_a_submission_carries_its_reply_channel_beside_the_message() -> None:
    send, recv = trio.open_memory_channel[Reply](1)
    with send, recv:
        submission = Submission(event=_submitted(), reply=send)
        assert submission.event == _submitted()  # the message itself is a value
        assert submission != Submission(event=_submitted(), reply=send)  # the delivery has identity
