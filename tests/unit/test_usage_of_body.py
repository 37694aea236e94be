"""``usage_of_body``: the usage of a whole JSON answer from its last ``"usage"`` member alone
(docs/priority.md §5.6), the same values as parsing the whole body (``UsageAccumulator.feed_json``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.model import Usage
from daemon.upstream import UsageAccumulator, usage_of_body

CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 18, "total_tokens": 30, "prompt_tokens_details": None},
}


def _whole(body: bytes) -> Usage | None:
    accumulator = UsageAccumulator()
    accumulator.feed_json(body)
    return accumulator.usage


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (CHAT, Usage(prompt_tokens=12, cached_prompt_tokens=None, completion_tokens=18)),
        # the answer's text names "usage" (its quotes are escaped), and a later member is the string "usage"
        (
            {
                **CHAT,
                "choices": [{"index": 0, "message": {"content": 'say "usage": {"prompt_tokens": 9}'}}],
                "prompt_logprobs": [{"7": {"decoded_token": "usage"}}],
            },
            Usage(prompt_tokens=12, cached_prompt_tokens=None, completion_tokens=18),
        ),
        # cached tokens, and the Responses API's names
        (
            {"usage": {"prompt_tokens": 40, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 32}}},
            Usage(prompt_tokens=40, cached_prompt_tokens=32, completion_tokens=2),
        ),
        (
            {"object": "response", "usage": {"input_tokens": 7, "output_tokens": 4}},
            Usage(prompt_tokens=7, cached_prompt_tokens=None, completion_tokens=4),
        ),
        ({"id": "c1", "choices": []}, None),
        ({"usage": None}, None),
    ],
)
def test_usage_of_an_answer(answer: dict[str, object], expected: Usage | None) -> None:
    body = json.dumps(answer).encode()
    assert usage_of_body(body) == expected


def test_a_usage_member_that_does_not_parse_is_none() -> None:
    assert usage_of_body(b'{"usage": {"prompt_tokens": 3,') is None
    assert usage_of_body(b"not json") is None
    assert usage_of_body(b"") is None


@given(
    prompt=st.integers(0, 10**9),
    completion=st.integers(0, 10**9),
    text=st.text(max_size=40),
    compact=st.booleans(),
)
def test_the_same_usage_as_the_whole_body(prompt: int, completion: int, text: str, compact: bool) -> None:
    answer = {
        **CHAT,
        "choices": [{"index": 0, "message": {"content": text}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }
    separators = (",", ":") if compact else (", ", ": ")
    body = json.dumps(answer, separators=separators, ensure_ascii=False).encode()
    assert usage_of_body(body) == _whole(body)
