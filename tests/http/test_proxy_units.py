"""Units of the proxy path: usage extraction, the usage-chunk filter, headers, routing, logs."""

from __future__ import annotations

import io
import json
import logging
import random

import httpx
import pytest

from actors.core.batchjobs import job_name
from actors.logevents import get_logger, log_event
from daemon.config import AgentdConfig, RoutingConfig
from daemon.dispatch import Usage
from daemon.http.errors import ApiError, error_dict, sse_error_tail
from daemon.http.requests import PromptSize, parse_json_body, request_texts, validate_body
from daemon.logs import configure_logging
from daemon.request_ids import upstream_request_id
from daemon.routing import ConsistentHash, PowerOfTwo, routing_key
from daemon.upstream import (
    UsageAccumulator,
    UsageChunkFilter,
    client_headers,
    map_httpx_error,
    upstream_headers,
    usage_from_object,
)


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_usage_chat_completions_format() -> None:
    obj = {"usage": {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 6}}}
    assert usage_from_object(obj) == Usage(prompt_tokens=10, cached_prompt_tokens=6, completion_tokens=4)


def test_usage_responses_format_nested_in_response() -> None:
    obj = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 9, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 1}}},
    }
    assert usage_from_object(obj) == Usage(prompt_tokens=9, cached_prompt_tokens=1, completion_tokens=2)


def test_usage_anthropic_semantics_no_double_counting() -> None:
    obj = {
        "message": {
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 30,
                "cache_creation_input_tokens": 20,
                "output_tokens": 5,
            }
        }
    }
    assert usage_from_object(obj) == Usage(prompt_tokens=60, cached_prompt_tokens=30, completion_tokens=5)


def test_usage_accumulator_sse_split_across_chunks_and_merging() -> None:
    stream = (
        sse({"choices": [{"delta": {"content": "x"}}]})
        + sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
        + b"data: [DONE]\n\n"
    )
    acc = UsageAccumulator()
    for i in range(0, len(stream), 5):  # 5-byte pieces split lines anywhere
        acc.feed_sse(stream[i : i + 5])
    assert acc.finish() == Usage(prompt_tokens=7, cached_prompt_tokens=None, completion_tokens=3)
    acc2 = UsageAccumulator()
    acc2.feed_sse(sse({"usage": {"prompt_tokens": 7, "completion_tokens": 1}}))
    acc2.feed_sse(sse({"usage": {"prompt_tokens": 5, "completion_tokens": 3}}))
    assert acc2.finish() == Usage(prompt_tokens=7, cached_prompt_tokens=None, completion_tokens=3)  # per-field max


def test_usage_accumulator_last_line_without_newline() -> None:
    acc = UsageAccumulator()
    acc.feed_sse(b'data: {"usage": {"prompt_tokens": 3}}')
    assert acc.finish() == Usage(prompt_tokens=3, cached_prompt_tokens=None, completion_tokens=None)


def test_usage_chunk_filter_drops_only_usage_only_event() -> None:
    keep1 = sse({"choices": [{"delta": {"content": "a"}}], "usage": None})
    drop = sse({"choices": [], "usage": {"prompt_tokens": 1}})
    done = b"data: [DONE]\n\n"
    stream = keep1 + drop + done
    f = UsageChunkFilter()
    out = b"".join(f.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + f.flush()
    assert out == keep1 + done
    assert f.dropped_count == 1


@pytest.mark.parametrize("size", [1, 3, 7, 40, 1000])
def test_usage_chunk_filter_any_split_same_bytes(size: int) -> None:
    """The pass-through of chunks without a usage object and the per-event path agree, whatever
    the chunk boundaries (CRLF events too)."""
    tokens = [sse({"choices": [{"delta": {"content": f"t{i}"}}]}) for i in range(5)]
    crlf = b'data: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\n'
    drop = sse({"choices": [], "usage": {"prompt_tokens": 1}})
    done = b"data: [DONE]\n\n"
    stream = b"".join(tokens[:3]) + crlf + tokens[3] + drop + tokens[4] + done
    f = UsageChunkFilter()
    pieces = [f.feed(stream[i : i + size]) for i in range(0, len(stream), size)]
    assert b"".join(pieces) + f.flush() == b"".join(tokens[:3]) + crlf + tokens[3] + tokens[4] + done
    assert f.dropped_count == 1
    assert all(p.endswith((b"\n\n", b"\r\n\r\n")) for p in pieces if p)  # whole events only


def test_usage_chunk_filter_relays_complete_events_immediately() -> None:
    f = UsageChunkFilter()
    first = sse({"choices": [{"delta": {"content": "a"}}]})
    assert f.feed(first + b'data: {"cho') == first  # the partial second event waits


def test_upstream_headers_drop_hop_by_hop_and_client_dp_rank() -> None:
    headers = {
        "connection": "keep-alive, x-secret-hop",
        "x-secret-hop": "1",
        "keep-alive": "5",
        "transfer-encoding": "chunked",
        "x-data-parallel-rank": "9",
        "host": "agentd",
        "content-length": "12",
        "authorization": "Bearer k",
        "x-session-id": "s",
    }
    out = dict(upstream_headers(headers, 3, "agentd-1"))
    assert out == {
        "authorization": "Bearer k",
        "x-session-id": "s",
        "content-type": "application/json",
        "accept-encoding": "identity",
        "x-data-parallel-rank": "3",
        "x-request-id": "agentd-1",
    }


def test_client_headers_drop_framing() -> None:
    upstream = httpx.Headers(
        {
            "content-type": "text/event-stream",
            "transfer-encoding": "chunked",
            "content-length": "10",
            "connection": "close",
            "x-request-id": "r",
        }
    )
    assert client_headers(upstream) == [("content-type", "text/event-stream"), ("x-request-id", "r")]


def test_map_httpx_errors() -> None:
    request = httpx.Request("POST", "http://w:1/v1/completions")
    assert map_httpx_error("w@0", httpx.ConnectError("refused", request=request)).status == 502
    assert map_httpx_error("w@0", httpx.ReadTimeout("slow", request=request)).status == 504
    err = map_httpx_error("w@0", httpx.RemoteProtocolError("bad", request=request))
    assert err.kind == "stream" and "w@0" in str(err)


def test_routing_key_precedence_and_no_constant_key() -> None:
    body = {"messages": []}
    assert routing_key({"x-session-id": "a", "session-id": "b"}, "t", body) == "header:x-session-id:a"
    assert routing_key({"session-id": "b"}, "t", body) == "header:session-id:b"
    assert routing_key({}, "system\nuser", body) == "text:system\nuser"
    assert routing_key({}, "", {"prompt": [1, 2]}) != routing_key({}, "", {"prompt": [3]})


def test_consistent_hash_only_moves_keys_of_failed_target() -> None:
    targets = AgentdConfig(
        routing=RoutingConfig(worker_urls=("http://a:1", "http://b:1"), intra_node_data_parallel_size=2)
    ).targets()
    ring = ConsistentHash(targets)
    keys = [f"k{i}" for i in range(300)]
    before = {k: ring.choose(targets, k, [0] * 4) for k in keys}
    survivors = tuple(t for t in targets if t.index != 1)
    after = {k: ring.choose(survivors, k, [0] * 4) for k in keys}
    for k in keys:
        if before[k].index != 1:
            assert after[k] == before[k]
        else:
            assert after[k].index != 1
    assert len({t.index for t in before.values()}) == 4


def test_power_of_two_picks_less_loaded_candidate() -> None:
    targets = AgentdConfig(
        routing=RoutingConfig(worker_urls=("http://a:1",), intra_node_data_parallel_size=4)
    ).targets()
    policy = PowerOfTwo(random.Random(0))
    in_flight = [9, 0, 9, 9]
    picks = [policy.choose(targets, "", in_flight).index for _ in range(200)]
    # target 1 wins every time it is sampled (about half the draws) and a loaded one never beats it
    assert 60 < picks.count(1) < 140
    assert all(p == 1 or in_flight[p] == 9 for p in picks)


def test_request_texts_routing_and_prompt_size() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U1"},
            {"role": "user", "content": "U2"},
        ]
    }
    routing, size = request_texts("chat", body)
    assert routing == "S\nU1"
    assert size == PromptSize(text_bytes=24)  # "system:S\nuser:U1\nuser:U2"
    # token ids are counted exactly
    assert request_texts("completions", {"prompt": [1, 2, 3]}) == ("[1, 2, 3]", PromptSize(9, exact_tokens=3))
    assert request_texts("completions", {"prompt": "x" * 400}) == ("x" * 400, PromptSize(400))
    assert request_texts("completions", {"prompt": "é"}) == ("é", PromptSize(2))  # UTF-8 bytes
    routing, size = request_texts("responses", {"instructions": "I", "input": "hello"})
    assert routing == "I\nhello"
    assert size == PromptSize(len("system:I\nuser:hello"))


def test_validate_body_accepts_valid_and_names_bad_field() -> None:
    validate_body(
        "chat",
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
            "stream": False,
            "max_tokens": 1,
            "stream_options": None,
        },
    )
    with pytest.raises(ApiError) as info:
        validate_body("chat", {"messages": [{"role": "user", "content": 5}]})
    assert info.value.param == "messages[0].content" and info.value.status == 400
    with pytest.raises(ApiError) as info:
        validate_body("chat", {"messages": [], "max_tokens": True})
    assert info.value.param == "max_tokens"


@pytest.fixture
def restore_agentd_logger() -> object:
    logger = logging.getLogger("agentd")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_log_event_kv_and_json_lines(restore_agentd_logger: object) -> None:
    buffer = io.StringIO()
    configure_logging("debug", "kv", buffer)
    log_event(get_logger("test"), logging.INFO, "thing_done", target="http://w@0", note="two words", n=3)
    line = buffer.getvalue().strip()
    assert ' logger=agentd.test event=thing_done target=http://w@0 note="two words" n=3' in line
    assert line.startswith("ts=") and " level=info " in line
    buffer = io.StringIO()
    configure_logging("info", "json", buffer)
    log_event(get_logger("test"), logging.DEBUG, "hidden")
    log_event(get_logger("test"), logging.WARNING, "shown", ok=True)
    [record] = [json.loads(x) for x in buffer.getvalue().splitlines()]
    assert record["event"] == "shown" and record["ok"] is True and record["level"] == "warning"


def test_usage_accumulator_reads_the_first_choices_finish_reason() -> None:
    body = {
        "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    acc = UsageAccumulator()
    acc.feed_json(json.dumps(body).encode())
    assert acc.finish_reason == "stop" and acc.usage is not None and acc.usage.completion_tokens == 2
    # a body without usage still gives its finish reason; null reasons are not one
    acc = UsageAccumulator()
    acc.feed_json(b'{"choices": [{"index": 0, "finish_reason": "length"}]}')
    assert acc.finish_reason == "length"
    acc = UsageAccumulator()
    acc.feed_json(b'{"choices": [{"index": 0, "finish_reason": null}]}')
    assert acc.finish_reason is None


def test_usage_accumulator_finish_reason_from_a_stream_split_across_chunks() -> None:
    events = [
        b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n',
        b'data: {"choices":[{"index":1,"delta":{},"finish_reason":"length"}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason": "tool_calls"}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":4}}\n\ndata: [DONE]\n\n',
    ]
    raw = b"".join(events)
    acc = UsageAccumulator()
    for i in range(0, len(raw), 7):  # 7-byte pieces: every event is split
        acc.feed_sse(raw[i : i + 7])
    usage = acc.finish()
    assert acc.finish_reason == "tool_calls"  # choice 0's, not choice 1's
    assert usage is not None and usage.completion_tokens == 4


def test_a_repeated_attempt_gets_its_own_upstream_request_id() -> None:
    headers = {"x-request-id": "job-1#job_name[j]#", "content-type": "application/json"}
    sent = upstream_request_id("agentd-7", "job-1#job_name[j]#")
    first = dict(upstream_headers(headers, 0, sent))
    again = dict(upstream_headers(headers, 0, sent, attempt=2))
    assert first["x-request-id"] == "job-1#job_name[j]#-agentd-7"  # the client's id never travels alone
    assert again["x-request-id"] == "job-1#job_name[j]#-agentd-7.retry2"
    assert job_name(again["x-request-id"]) == "j"  # the job tag survives (docs/batch.md §2.1)
    assert dict(upstream_headers({}, 1, "agentd-7", attempt=1))["x-request-id"] == "agentd-7.retry1"


def test_usage_accumulator_reads_tool_names_streamed_and_whole() -> None:
    """The called functions' names (docs/program-scheduling.md §12), the relayed bytes untouched."""
    head = {"id": "c", "object": "chat.completion.chunk"}
    stream = (
        sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        + sse(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": 0, "id": "t1", "function": {"name": "grep", "arguments": ""}},
                            ]
                        },
                        "finish_reason": None,
                    }
                ],
            }
        )
        + sse(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"name": "x"}'}}]},
                        "finish_reason": None,
                    }
                ],
            }
        )
        + sse(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 1, "id": "t2", "function": {"name": "read_file"}}]},
                        "finish_reason": "tool_calls",
                    }
                ],
            }
        )
        + sse({**head, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
        + b"data: [DONE]\n\n"
    )
    acc = UsageAccumulator()
    for i in range(0, len(stream), 11):
        acc.feed_sse(stream[i : i + 11])
    acc.finish()
    assert acc.tool_names == ["grep", "read_file"] and acc.finish_reason == "tool_calls"
    whole = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "tool_calls": [{"id": "t", "function": {"name": "edit_file"}}]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    acc = UsageAccumulator()
    acc.feed_json(json.dumps(whole).encode())
    assert acc.tool_names == ["edit_file"]
    responses = {"output": [{"type": "function_call", "name": "web_fetch", "arguments": "{}"}], "usage": {}}
    acc = UsageAccumulator()
    acc.feed_json(json.dumps(responses).encode())
    assert acc.tool_names == ["web_fetch"]
    plain = UsageAccumulator()
    plain.feed_json(b'{"choices": [{"index": 0, "message": {"content": "name"}, "finish_reason": "stop"}]}')
    assert plain.tool_names == []


def test_a_refusal_without_its_own_retry_after_gets_the_configured_one() -> None:
    """A 503 no_targets (every worker out of rotation) or a 429 queue timeout tells the client when
    to try again ([limits] retry_after_seconds); a queue ETA keeps its own; other statuses get none."""
    from actors.core.errors import NO_TARGETS, QUEUE_TIMEOUT, Rejection
    from daemon.http.errors import ApiError

    assert ApiError.from_rejection(NO_TARGETS, 3).headers == (("retry-after", "3"),)
    assert ApiError.from_rejection(QUEUE_TIMEOUT, 1).headers == (("retry-after", "1"),)
    assert ApiError.from_rejection(NO_TARGETS).headers == ()  # (no default given: none)
    eta = Rejection(reason="queue_bound", status_hint=429, message="m", retry_after_seconds=7.2)
    assert ApiError.from_rejection(eta, 1).headers == (("retry-after", "8"),)
    bad = Rejection(reason="too_large", status_hint=400, message="m")
    assert ApiError.from_rejection(bad, 1).headers == ()


def test_an_integer_with_too_many_digits_is_invalid_json_without_python_advice() -> None:
    with pytest.raises(ApiError) as caught:
        parse_json_body(b'{"max_tokens": ' + b"9" * 5000 + b"}")
    assert caught.value.status == 400
    assert caught.value.code == "invalid_json"
    assert str(caught.value.message) == "request body is not valid JSON here: an integer has more than 4300 digits"


def test_a_stream_s_error_event_is_an_openai_error_and_a_responses_error_event() -> None:
    tail = sse_error_tail(error_dict("worker w0 failed mid-response", "upstream_error", None, "upstream_stream"))
    event, done = tail.split(b"\n\n", 1)
    assert done == b"data: [DONE]\n\n"
    assert json.loads(event.removeprefix(b"data: ")) == {
        # the Responses API's error event, read by a client that dispatches on each event's type
        "type": "error",
        "code": "upstream_stream",
        "message": "worker w0 failed mid-response",
        "param": None,
        # the OpenAI error body the openai clients raise as an APIError
        "error": {
            "message": "worker w0 failed mid-response",
            "type": "upstream_error",
            "param": None,
            "code": "upstream_stream",
        },
    }
