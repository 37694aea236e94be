"""The data-plane frames: every frame type survives encode -> bytes (split anywhere) -> decode."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, NewType

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.model import Usage
from actors.core.placement import CACHE_AWARE_PREFIX_CHARS
from daemon.dataplane.positional import PositionalCodec
from daemon.dataplane.wire import (
    FRAME_TYPES,
    HEADER,
    MAX_FRAME_BYTES,
    Ask,
    Drop,
    Finish,
    FrameError,
    FrameReader,
    Hello,
    Load,
    WireRequest,
    decode,
    encode,
)
from daemon.dispatch import Outcome, ProxyRequest
from daemon.http.identity import parse_identity
from daemon.http.priority import PriorityInfo
from daemon.http.requests import PromptSize

TEXT = st.text(max_size=12)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """Values of a frame field's type: attrs classes field by field, finite floats (JSON has no
    NaN), tuples, optionals and unions, NewTypes as their base type."""
    if isinstance(tp, NewType):
        return strategy_for(tp.__supertype__)
    if attrs.has(tp):
        attrs.resolve_types(tp)
        return st.builds(tp, **{f.name: strategy_for(f.type) for f in attrs.fields(tp) if f.init})
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([strategy_for(arg) for arg in typing.get_args(tp)])
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy_for(args[0]), max_size=3).map(tuple)
        return st.tuples(*(strategy_for(a) for a in args))
    simple: dict[Any, st.SearchStrategy[Any]] = {
        int: st.integers(-(2**63), 2**63),
        float: FLOATS,
        str: TEXT,
        bool: st.booleans(),
        type(None): st.none(),
    }
    if tp in simple:
        return simple[tp]
    raise TypeError(f"no strategy for {tp!r}")


FRAMES = st.one_of([strategy_for(cls) for cls in FRAME_TYPES])


def test_every_frame_type_has_a_strategy() -> None:
    for cls in FRAME_TYPES:
        assert strategy_for(cls) is not None


@settings(max_examples=300, deadline=None)
@given(FRAMES)
def test_every_frame_round_trips(frame: Any) -> None:
    data = encode(frame)
    (size,) = HEADER.unpack_from(data)
    assert size == len(data) - HEADER.size
    assert decode(data[HEADER.size :]) == frame


@settings(max_examples=100, deadline=None)
@given(st.lists(FRAMES, min_size=1, max_size=6), st.data())
def test_a_stream_of_frames_splits_anywhere(frames: list[Any], data: st.DataObject) -> None:
    stream = b"".join(encode(f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    reader = FrameReader()
    out: list[Any] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        out += reader.feed(stream[start:cut])
        start = cut
    assert out == frames
    assert reader.pending_bytes == 0


def test_a_request_keeps_what_the_scheduler_reads_and_drops_the_body() -> None:
    body = {
        "model": "m",
        "max_completion_tokens": 77,
        "messages": [{"role": "user", "content": "x" * 1000}],
        "vllm_xargs": {"agentic_context": {"program_id": "p", "task_id": "t", "priority": 3}},
    }
    identity = parse_identity(body, {"x-session-id": "s"})
    req = ProxyRequest(
        request_id="agentd-1",
        endpoint="chat",
        body=body,
        headers={"authorization": "Bearer secret"},
        model="m",
        stream=True,
        prompt=PromptSize(1000, None),
        routing_text="user:x",
        identity=identity,
        model_pool="m",
        pool_targets=frozenset({2, 0}),
        prio=PriorityInfo("agent", 3, "acme", "header", None),
    )
    frame = Ask(7, "program", WireRequest.of(req, 77))
    back = decode(encode(frame)[HEADER.size :])
    assert back == frame
    rebuilt = back.request.proxy_request()
    assert rebuilt.body == {"max_tokens": 77} and rebuilt.headers == {}  # no body, no credentials
    assert attrs.evolve(rebuilt, body=body, headers=req.headers) == req
    assert b"secret" not in encode(frame) and b"x" * 100 not in encode(frame)


@pytest.mark.parametrize("bound", [0.0, 2.5, None])
def test_an_ask_carries_the_clients_queue_bound(bound: float | None) -> None:
    """``x-agentd-max-queue-seconds`` reaches the scheduler through a relay (docs/program-scheduling.md
    §13): before session 31 the ask dropped it, so with relay processes a request that asked not to
    queue (``0``) waited in the queue instead of getting its 429 at once."""
    req = ProxyRequest(
        request_id="agentd-3",
        endpoint="chat",
        body={},
        headers={},
        model="m",
        stream=False,
        prompt=PromptSize(10, None),
        routing_text="user:x",
        max_queue_seconds=bound,
    )
    back = decode(encode(Ask(9, "program", WireRequest.of(req, None)))[HEADER.size :])
    assert back.request.proxy_request().max_queue_seconds == bound


def test_a_failovers_ask_carries_the_workers_it_could_not_reach() -> None:
    """A relay's failover asks with the workers its request could not reach, which the core's
    placement avoids as in one process (docs/program-scheduling.md §9.1); an ordinary ask carries none."""
    req = ProxyRequest(
        request_id="agentd-4.failover2",
        endpoint="chat",
        body={},
        headers={},
        model="m",
        stream=True,
        prompt=PromptSize(10, None),
        routing_text="user:x",
        avoid_workers=frozenset({"http://w1:8000", "http://w0:8000"}),
    )
    wire = WireRequest.of(req, None)
    assert wire.avoid_workers == ("http://w0:8000", "http://w1:8000")  # sorted: the same bytes every time
    back = decode(encode(Ask(10, "program", wire))[HEADER.size :])
    assert back.request.proxy_request().avoid_workers == req.avoid_workers
    plain = WireRequest.of(attrs.evolve(req, avoid_workers=frozenset()), None)
    assert decode(encode(Ask(11, "program", plain))[HEADER.size :]).request.proxy_request().avoid_workers == frozenset()


def test_an_ask_carries_only_the_prefix_of_a_long_routing_text() -> None:
    """A 20,000-character system prompt crosses the socket as the ``CACHE_AWARE_PREFIX_CHARS``
    characters the scheduler reads, once per Program request (docs/architecture.md §9)."""
    text = "system:" + "s" * 20_000
    req = ProxyRequest(
        request_id="agentd-2",
        endpoint="chat",
        body={},
        headers={},
        model="m",
        stream=False,
        prompt=PromptSize(20_007, None),
        routing_text=text,
    )
    frame = Ask(8, "program", WireRequest.of(req, None))
    assert frame.request.routing_text == text[:CACHE_AWARE_PREFIX_CHARS]
    assert len(encode(frame)) < CACHE_AWARE_PREFIX_CHARS + 1_000
    assert decode(encode(frame)[HEADER.size :]).request.proxy_request().routing_text == text[:CACHE_AWARE_PREFIX_CHARS]


def test_bad_frames_are_protocol_errors() -> None:
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Nope", {}]')
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Hello", {"relay": "one", "pid": 2}]')
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Hello", ["one", 2]]')  # positional fields are checked against their types
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Hello", [1, 2, 3]]')  # and counted
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Hello", [true, 2]]')  # a boolean is no integer
    with pytest.raises(FrameError, match="undecodable"):
        decode(b"{not json")
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Hello",[1,2]]x')  # nothing may follow the frame's value
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Hello",[1,2]] ')
    with pytest.raises(FrameError, match="undecodable"):
        decode(b"")
    with pytest.raises(FrameError, match="undecodable"):
        decode('["Hello",[1,2]]'.encode("utf-16"))  # a frame is UTF-8
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Release",[null]]')  # an integer field is not optional
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Report",["u",true,"d",1]]')  # an integer is no boolean either
    with pytest.raises(FrameError, match="undecodable"):
        decode(b'["Load",[[1,"2"]]]')  # tuple items are checked
    with pytest.raises(FrameError, match="exceeds"):
        FrameReader().feed(HEADER.pack(MAX_FRAME_BYTES + 1))
    with pytest.raises(TypeError, match="not a data-plane frame"):
        encode(PromptSize(1))
    assert FrameReader().feed(encode(Hello(1, 2))[:-1]) == []


def well_typed(tp: Any, value: Any) -> bool:
    """Whether ``value`` is exactly of the field type ``tp`` (attrs values field by field)."""
    if isinstance(tp, NewType):
        return well_typed(tp.__supertype__, value)
    if attrs.has(tp):
        return type(value) is tp and all(well_typed(f.type, getattr(value, f.name)) for f in attrs.fields(tp) if f.init)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(well_typed(arg, value) for arg in typing.get_args(tp))
    if origin is tuple:
        return type(value) is tuple and all(well_typed(typing.get_args(tp)[0], v) for v in value)
    if tp is type(None):
        return value is None
    return type(value) is tp


JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), FLOATS, TEXT, st.lists(st.integers(0, 3), max_size=3), st.just({})
)


def _paths(value: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """Every position in a nested list (the lists themselves included)."""
    out = [prefix]
    if isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


@settings(max_examples=400, deadline=None)
@given(FRAMES, st.data())
def test_a_hostile_field_is_refused_or_decodes_to_a_well_typed_frame(frame: Any, data: st.DataObject) -> None:
    """Any one position of a valid frame replaced by any JSON value: the decoder raises
    ``FrameError`` or returns a frame whose every field has its declared type (never a wrong value)."""
    fields = json.loads(encode(frame)[HEADER.size :])[1]
    path = data.draw(st.sampled_from(_paths(fields)))
    replacement = data.draw(JSON_VALUES)
    if path:
        parent = fields
        for i in path[:-1]:
            parent = parent[i]
        parent[path[-1]] = replacement
    else:
        fields = replacement
    payload = json.dumps([type(frame).__name__, fields]).encode()
    try:
        back = decode(payload)
    except FrameError:
        return
    assert well_typed(type(frame), back)


def test_the_positional_codec_is_compact_and_exact() -> None:
    """No field names on the wire; a float field given an integer decodes as that float."""
    frame = Finish(3, Outcome(True, Usage(12, 0, 2), None, 0.5, None, "stop", ("grep",)))
    data = encode(frame)
    assert data[HEADER.size :] == b'["Finish",[3,[true,[12,0,2],null,0.5,null,"stop",["grep"]]]]'
    back = decode(b'["Finish",[3,[true,[12,0,2],null,1,null,"stop",["grep"]]]]')
    assert back.outcome.first_token_seconds == 1.0 and type(back.outcome.first_token_seconds) is float


def test_the_positional_codec_refuses_unsupported_field_types_when_built() -> None:
    @attrs.frozen
    class Mixed:
        value: int | str

    with pytest.raises(TypeError, match="X \\| None"):
        PositionalCodec((Mixed,))

    @attrs.frozen
    class Listed:
        values: list[int]

    with pytest.raises(TypeError, match="does not support"):
        PositionalCodec((Listed,))


def test_a_relays_report_of_its_view_is_compact_and_checked() -> None:
    """The Load frame (docs/architecture.md §9, "What a relay reports"): native in-flight counts,
    leases, passes, the oldest lease's age (null: none open), the scheduler frames read; a Drop
    names one pass.  A field of the wrong type or a missing one is a protocol error."""
    frame = Load((0, 2), 1, 3, 2.5, 7)
    assert encode(frame)[HEADER.size :] == b'["Load",[[0,2],1,3,2.5,7]]'
    assert decode(b'["Load",[[0,2],1,3,null,7]]') == Load((0, 2), 1, 3, None, 7)
    back = decode(b'["Load",[[],0,0,4,0]]')
    assert back.oldest_lease_seconds == 4.0 and type(back.oldest_lease_seconds) is float
    assert encode(Drop(12))[HEADER.size :] == b'["Drop",[12]]'
    for bad in (
        b'["Load",[[1],"1",0,null,0]]',
        b'["Load",[[1],1,0,"old",0]]',
        b'["Load",[[1],1,true,null,0]]',
        b'["Load",[[1],1,0,null]]',
        b'["Load",[[1],1,0,null,0,0]]',
        b'["Drop",[1.5]]',
        b'["Drop",[true]]',
        b'["Drop",[]]',
    ):
        with pytest.raises(FrameError, match="undecodable"):
            decode(bad)
