"""The simulated backend's structured output and the Responses API's reasoning input items
(docs/simulator.md §3), through the server's HTTP API in virtual time."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import trio
from sim_fakes import sim_client, sse_payloads

from sim import tokenizer

USER = {"role": "user", "content": "describe the failing test as JSON"}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "failures": {"type": "integer", "minimum": 1},
        "flaky": {"type": "boolean"},
        "files": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "severity": {"enum": ["low", "high"]},
        "owner": {"type": "object", "properties": {"team": {"type": "string"}}, "required": ["team"]},
        "note": {"type": ["string", "null"]},
        "optional": {"type": "string"},
    },
    "required": ["summary", "failures", "flaky", "files", "severity", "owner", "note"],
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "report", "schema": SCHEMA, "strict": True}}


def _check_report(value: Any) -> None:
    assert isinstance(value, dict) and set(value) == set(SCHEMA["required"])
    assert isinstance(value["summary"], str) and isinstance(value["note"], str)
    assert isinstance(value["failures"], int) and value["failures"] >= 1
    assert value["flaky"] is True and value["severity"] == "low"
    assert isinstance(value["files"], list) and len(value["files"]) == 2
    assert all(isinstance(f, str) for f in value["files"])
    assert isinstance(value["owner"], dict) and isinstance(value["owner"]["team"], str)


async def test_json_object_and_json_schema_answers_are_json_of_the_planned_length(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with sim_client() as (_cluster, client):
        for max_tokens in (4, 40, 300):
            body = {"messages": [USER], "max_tokens": max_tokens, "response_format": {"type": "json_object"}}
            doc = (await client.post("/v1/chat/completions", json=body)).json()
            content = doc["choices"][0]["message"]["content"]
            assert isinstance(json.loads(content), dict)
            assert doc["usage"]["completion_tokens"] == tokenizer.count_tokens(content) == max_tokens
            # a whole value ends as guided decoding ends it (the openai client's parse() refuses
            # "length"; "length" before session 41's walk)
            assert doc["choices"][0]["finish_reason"] == "stop"
        for max_tokens in (30, 500):
            body = {"messages": [USER], "max_tokens": max_tokens, "response_format": JSON_SCHEMA}
            doc = (await client.post("/v1/chat/completions", json=body)).json()
            content = doc["choices"][0]["message"]["content"]
            _check_report(json.loads(content))
            assert doc["usage"]["completion_tokens"] == tokenizer.count_tokens(content) == max_tokens
        # a natural stop (the hint) keeps its length too; completions and vLLM's guided_json alike
        body = {"messages": [USER], "max_tokens": 100, "response_format": JSON_SCHEMA}
        doc = (await client.post("/v1/chat/completions", json={**body, "vllm_xargs": {"sim_output_tokens": 25}})).json()
        _check_report(json.loads(doc["choices"][0]["message"]["content"]))
        assert doc["usage"]["completion_tokens"] == 25 and doc["choices"][0]["finish_reason"] == "stop"
        body = {"prompt": "report:", "max_tokens": 20, "guided_json": json.dumps(SCHEMA)}
        doc = (await client.post("/v1/completions", json=body)).json()
        _check_report(json.loads(doc["choices"][0]["text"]))
        assert doc["usage"]["completion_tokens"] == 20


async def test_a_schema_without_strings_ends_with_its_value(autojump_clock: trio.abc.Clock) -> None:
    """No string can carry the planned tokens: the value's own tokens, fewer than planned, and the
    text tokenizes back to exactly the tokens counted (a follow-up turn's prefix)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "flags", "schema": schema}}
    async with sim_client() as (_cluster, client):
        body = {"messages": [USER], "max_tokens": 50, "response_format": fmt}
        doc = (await client.post("/v1/chat/completions", json=body)).json()
    content = doc["choices"][0]["message"]["content"]
    assert json.loads(content) == {"n": 0, "ok": True}
    assert doc["usage"]["completion_tokens"] == tokenizer.count_tokens(content) < 50
    assert doc["choices"][0]["finish_reason"] == "stop"


async def test_a_streamed_json_answer_joins_to_the_same_json(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (_cluster, client):
        body = {"messages": [USER], "max_tokens": 30, "response_format": JSON_SCHEMA, "seed": 1}
        whole = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/chat/completions", json=streamed) as r:
            raw = b"".join([chunk async for chunk in r.aiter_bytes()])
    frames = sse_payloads(raw)
    assert frames[-1] == "[DONE]" and frames[-2]["usage"]["completion_tokens"] == 30
    text = "".join(f["choices"][0]["delta"].get("content", "") for f in frames[:-2])
    assert text == whole
    _check_report(json.loads(text))


async def test_too_few_tokens_for_the_schema_cut_the_json_and_bad_formats_are_refused(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with sim_client() as (_cluster, client):
        body = {"messages": [USER], "max_tokens": 3, "response_format": JSON_SCHEMA}
        doc = (await client.post("/v1/chat/completions", json=body)).json()
        assert doc["usage"]["completion_tokens"] == 3  # cut as max_tokens cuts a real answer: not JSON
        assert doc["choices"][0]["message"]["content"].startswith('{"summary":')
        for response_format, param in (
            ({"type": "yaml"}, "response_format.type"),
            ({"type": "json_schema"}, "response_format.json_schema"),
        ):
            bad = await client.post(
                "/v1/chat/completions", json={"messages": [USER], "response_format": response_format}
            )
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param


async def test_responses_structured_output_and_reasoning_input_items(autojump_clock: trio.abc.Clock) -> None:
    """``text.format`` answers JSON; a ``reasoning`` item sent back from an earlier response is
    input (before session 41 a 400 naming ``input[1].type``), counted as an assistant turn."""
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "the test fails on a timeout"}],
        "encrypted_content": None,
    }
    async with sim_client() as (_cluster, client):
        fmt = {"type": "json_schema", "name": "report", "schema": SCHEMA, "strict": True}
        body = {"input": "report it", "max_output_tokens": 40, "text": {"format": fmt}}
        doc = (await client.post("/v1/responses", json=body)).json()
        _check_report(json.loads(doc["output"][0]["content"][0]["text"]))
        assert doc["usage"]["output_tokens"] == 40 and doc["text"] == {"format": fmt}

        turns = [{"role": "user", "content": "why does it fail?"}, reasoning, {"role": "user", "content": "fix it"}]
        r = await client.post("/v1/responses", json={"input": turns, "max_output_tokens": 2})
        assert r.status_code == 200, r.text
        as_chat = [turns[0], {"role": "assistant", "content": "the test fails on a timeout"}, turns[2]]
        assert r.json()["usage"]["input_tokens"] == len(tokenizer.render_chat(as_chat))
        without = {"input": [turns[0], turns[2]], "max_output_tokens": 2}
        assert (await client.post("/v1/responses", json=without)).json()["usage"]["input_tokens"] < len(
            tokenizer.render_chat(as_chat)
        )
        bad = {"input": [{**reasoning, "summary": [{"type": "summary_text"}]}], "max_output_tokens": 2}
        r = await client.post("/v1/responses", json=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].summary[0]"
        # a bad format is named as the Responses field it came in (was response_format.type)
        for text, param in (
            ({"format": {"type": "yaml"}}, "text.format.type"),
            ({"format": {"type": "json_schema", "name": "x", "schema": 3}}, "text.format.schema"),
        ):
            r = await client.post("/v1/responses", json={"input": "x", "text": text})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        as_object = {"input": "x", "text": {"format": {"type": "json_object"}}}
        doc = (await client.post("/v1/responses", json=as_object)).json()
        assert isinstance(json.loads(doc["output"][0]["content"][0]["text"]), dict)


class Step(pydantic.BaseModel):
    title: str
    files: list[str]
    minutes: int = pydantic.Field(ge=5)


class Plan(pydantic.BaseModel):
    goal: str
    lead: Step  # a nested model: {"$ref": "#/$defs/Step"}
    steps: list[Step]
    done: bool
    score: float | None


PLAN = Plan.model_json_schema()


async def test_a_pydantic_schema_with_nested_models_is_answered_and_ends_with_stop(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Session 41's walk: the ``openai`` client's ``chat.completions.parse(response_format=Plan)``
    failed on the quick start, first with ``LengthFinishReasonError`` (a whole value ended with
    ``length``), then with a ``ValidationError`` (a nested model's ``$ref`` was answered as a string)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "plan", "schema": PLAN, "strict": True}}
    async with sim_client() as (_cluster, client):
        body = {"messages": [USER], "max_tokens": 40, "response_format": fmt}
        doc = (await client.post("/v1/chat/completions", json=body)).json()
        (choice,) = doc["choices"]
        plan = Plan.model_validate_json(choice["message"]["content"])
        assert plan.lead.minutes == 5 and choice["finish_reason"] == "stop"
        assert doc["usage"]["completion_tokens"] == 40
        cut = (await client.post("/v1/chat/completions", json={**body, "max_tokens": 5})).json()
        assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 5
        # the Responses API: a cut value is an incomplete response, a whole one completed
        text = {"format": {"type": "json_schema", "name": "plan", "schema": PLAN, "strict": True}}
        for limit, status in ((40, "completed"), (5, "incomplete")):
            body = {"input": "plan it", "max_output_tokens": limit, "text": text}
            doc = (await client.post("/v1/responses", json=body)).json()
            assert doc["status"] == status, doc
        Plan.model_validate_json(
            (await client.post("/v1/responses", json={**body, "max_output_tokens": 40})).json()["output"][0]["content"][
                0
            ]["text"]
        )


async def test_tool_call_arguments_fit_the_tools_parameters(autojump_clock: trio.abc.Clock) -> None:
    """A forced call (and the ``tool_calls`` hint) to a tool whose ``parameters`` list properties
    answers arguments of that schema (before session 41 ``{"q": ...}``, which the ``openai`` client's
    ``pydantic_function_tool`` refused); the next turn's prompt still extends this one exactly."""
    tools = [{"type": "function", "function": {"name": "make_plan", "parameters": PLAN, "strict": True}}]
    named = {"type": "function", "function": {"name": "make_plan"}}
    async with sim_client() as (_cluster, client):
        for extra, finish in (
            ({"tool_choice": "required"}, "tool_calls"),
            ({"tool_choice": named}, "stop"),
            ({"vllm_xargs": {"sim_finish_reason": "tool_calls"}}, "tool_calls"),
        ):
            body = {"messages": [USER], "max_tokens": 64, "tools": tools, **extra}
            doc = (await client.post("/v1/chat/completions", json=body)).json()
            (out,) = doc["choices"]
            message = out["message"]
            (call,) = message["tool_calls"]
            Plan.model_validate_json(call["function"]["arguments"])
            assert out["finish_reason"] == finish and doc["usage"]["completion_tokens"] == 64
            generated = tokenizer.render_tool_call(call["function"]["name"], call["function"]["arguments"])
            first = tokenizer.render_chat([USER], tools=tools)
            after = tokenizer.render_chat([USER, message], tools=tools, add_generation_prompt=False)
            assert after == [*first, *generated, tokenizer.END_TOKEN] and len(generated) == 64
        small = {"messages": [USER], "max_tokens": 8, "tools": tools, "tool_choice": "required"}
        err = await client.post("/v1/chat/completions", json=small)
        assert err.status_code == 400 and err.json()["error"]["param"] == "tool_choice", err.text
