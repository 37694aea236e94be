"""Session 41's walk with the official ``openai`` client, over real sockets: agentd with two relay
processes in front of an ``agentd sim-backend`` worker.

Structured outputs (docs/simulator.md §3): before session 41 the simulated worker answered
pseudo-words whatever ``response_format``, the Responses API's ``text.format`` or a tool's
``parameters`` asked for, so the client's ``chat.completions.parse`` (a ``LengthFinishReasonError``
or a JSON error), a pydantic function tool (a ``ValidationError``: arguments ``{"q": ...}``) and
``responses.parse`` all failed against the quick start.
"""

from __future__ import annotations

import sys

import openai
import pydantic
import pytest
import trio
from test_program_process import _start, _stop

MODEL = "agentd-sim"
CONTEXT = {"vllm_xargs": {"agentic_context": {"program_id": "walk41:lead", "task_id": "walk41"}}}


class Step(pydantic.BaseModel):
    title: str
    files: list[str]


class Plan(pydantic.BaseModel):
    goal: str
    steps: list[Step]
    done: bool


async def test_structured_outputs_through_relays_with_the_openai_client() -> None:
    procs: list[trio.Process] = []
    try:
        worker = await _start(
            [sys.executable, "-m", "daemon", "sim-backend", "--port", "0", "--time-scale", "100", "--model", MODEL],
            "agentd sim-backend listening on",
            procs,
        )
        agentd = await _start(
            [
                sys.executable,
                "-m",
                "daemon",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--worker-urls",
                worker,
                "--data-plane-processes",
                "2",
                "--enable-program-scheduling",
                "--log-level",
                "warning",
            ],
            "agentd listening on",
            procs,
        )
        messages = [{"role": "user", "content": "plan the refactor"}]
        async with openai.AsyncOpenAI(base_url=agentd + "/v1", api_key="unused", max_retries=0) as client:
            parsed = await client.chat.completions.parse(
                model=MODEL, messages=messages, max_tokens=48, response_format=Plan, extra_body=CONTEXT
            )
            choice = parsed.choices[0]
            assert isinstance(choice.message.parsed, Plan) and choice.finish_reason == "stop"
            assert parsed.usage is not None and parsed.usage.completion_tokens == 48
            async with client.chat.completions.stream(
                model=MODEL, messages=messages, max_tokens=48, response_format=Plan
            ) as stream:
                final = await stream.get_final_completion()
            assert final.choices[0].message.parsed == choice.message.parsed  # the same deterministic plan
            tooled = await client.chat.completions.parse(
                model=MODEL,
                messages=messages,
                max_tokens=48,
                tools=[openai.pydantic_function_tool(Plan)],
                tool_choice="required",
                extra_body=CONTEXT,
            )
            (call,) = tooled.choices[0].message.tool_calls or []
            assert call.function.name == "Plan" and isinstance(call.function.parsed_arguments, Plan)
            response = await client.responses.parse(
                model=MODEL, input="plan the refactor", max_output_tokens=48, text_format=Plan, extra_body=CONTEXT
            )
            assert response.status == "completed" and isinstance(response.output_parsed, Plan)
            too_short = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4, response_format={"type": "json_object"}
            )
            assert too_short.choices[0].finish_reason == "stop"  # {"answer": "..."} fits in 4 tokens
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=4,
                    response_format={"type": "yaml"},  # type: ignore[arg-type,misc]
                )
            assert refused.value.param == "response_format.type"
    finally:
        codes = [await _stop(p) for p in reversed(procs)]
    assert codes == [0, 0]
