"""The chat prompt-size estimate computed without building its lines (daemon/http/requests.py
``_chat_size``) equals the size of the joined estimation text, for any chat body."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.http.requests import _chat_lines, _chat_size, request_texts

text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)  # no lone surrogates
scalar = st.one_of(text, st.integers(), st.none(), st.booleans())
content = st.one_of(
    text,
    st.none(),
    st.lists(st.one_of(text, st.fixed_dictionaries({"type": st.just("text"), "text": scalar})), max_size=3),
)
call = st.one_of(
    st.fixed_dictionaries({"function": st.fixed_dictionaries({}, optional={"name": scalar, "arguments": scalar})}),
    st.fixed_dictionaries({"function": scalar}),
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), text),
        "content": content,
        "tool_calls": st.lists(call, max_size=2),
        "function_call": st.one_of(st.fixed_dictionaries({"name": scalar, "arguments": scalar}), scalar),
    },
)
tool = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": text, "description": text})}
    ),
    st.fixed_dictionaries({}, optional={"name": scalar, "parameters": st.dictionaries(text, scalar, max_size=2)}),
    scalar,
)


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(message, max_size=5), tools=st.lists(tool, max_size=3))
def test_the_size_without_lines_equals_the_size_of_the_joined_text(messages: list[Any], tools: list[Any]) -> None:
    body = {"messages": messages, "tools": tools}
    routing, lines = _chat_lines(body)
    routing_now, size, count = _chat_size(body)
    assert routing_now == routing and count == len(lines)
    if lines:
        assert size == len("\n".join(lines).encode("utf-8"))
    expected = "\n".join(lines) or routing
    routing_texts, prompt = request_texts("chat", body)
    assert routing_texts == routing and prompt.text_bytes == len(expected.encode("utf-8"))
