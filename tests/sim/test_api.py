"""The simulated server's OpenAI API through the in-process transport, in virtual time."""

from __future__ import annotations

import json

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sim_fakes import sim_client, sse_payloads

from actors.core.costs import decode_step_seconds, prefill_seconds
from sim import tokenizer
from sim.cluster import SimConfig
from sim.engine import EngineConfig
from sim.metrics import SimCollector
from sim.stats import CostModel

USER = {"role": "user", "content": "please list the files in the repository"}


async def test_non_streaming_chat_shape_and_exact_virtual_time(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (_cluster, client):
        t0 = trio.current_time()
        r = await client.post("/v1/chat/completions", json={"messages": [USER], "max_tokens": 3})
        elapsed = trio.current_time() - t0
    assert r.status_code == 200
    body = r.json()
    n_prompt = len(tokenizer.render_chat([USER]))
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert r.headers["x-request-id"] == body["id"]
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert tokenizer.count_tokens(choice["message"]["content"]) == 3
    assert body["usage"] == {
        "prompt_tokens": n_prompt,
        "completion_tokens": 3,
        "total_tokens": n_prompt + 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    cost = CostModel()
    expected = (
        prefill_seconds(n_prompt, cost.prefill)
        + decode_step_seconds(1, n_prompt + 1, cost.decode)
        + decode_step_seconds(1, n_prompt + 2, cost.decode)
    )
    assert elapsed == pytest.approx(expected, rel=1e-9)


async def test_streaming_frames_usage_and_done(autojump_clock: trio.abc.Clock) -> None:
    arrivals: list[float] = []
    raw = b""
    async with sim_client() as (_cluster, client):
        payload = {"messages": [USER], "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/chat/completions", json=payload) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for chunk in r.aiter_bytes():
                arrivals.append(trio.current_time())
                raw += chunk
    frames = sse_payloads(raw)
    assert frames[-1] == "[DONE]"
    usage_frame = frames[-2]
    assert usage_frame["choices"] == []
    assert usage_frame["usage"]["completion_tokens"] == 5
    chunks = frames[:-2]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
    assert len(contents) == 5 and tokenizer.count_tokens("".join(contents)) == 5
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert all("usage" not in c for c in chunks)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # fed token by token as the engine steps, not buffered: 5 distinct virtual arrival times
    assert len(set(arrivals)) == 5 and arrivals == sorted(arrivals)


async def test_completions_stream_and_non_stream(autojump_clock: trio.abc.Clock) -> None:
    text = tokenizer.text_of_tokens(40, "c")
    async with sim_client() as (_cluster, client):
        r = await client.post("/v1/completions", json={"prompt": text})
        async with client.stream(
            "POST", "/v1/completions", json={"prompt": text, "max_tokens": 2, "stream": True}
        ) as s:
            raw = b"".join([c async for c in s.aiter_bytes()])
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["usage"]["prompt_tokens"] == 40
    assert body["usage"]["completion_tokens"] == 16  # vLLM's completions default max_tokens
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    frames = sse_payloads(raw)
    assert frames[-1] == "[DONE]" and len(frames) == 3  # no usage frame without include_usage
    assert frames[1]["choices"][0]["finish_reason"] == "length"


async def test_next_turn_extends_prompt_and_hits_prefix_cache(autojump_clock: trio.abc.Clock) -> None:
    system = {"role": "system", "content": tokenizer.text_of_tokens(200, "sys")}
    turn1 = [system, USER]
    async with sim_client(SimConfig(dp_size=1, deterministic=True)) as (_cluster, client):
        r1 = (await client.post("/v1/chat/completions", json={"messages": turn1, "max_tokens": 30})).json()
        reply = {"role": "assistant", "content": r1["choices"][0]["message"]["content"]}
        turn2 = [*turn1, reply, {"role": "user", "content": "and now the tests"}]
        r2 = (await client.post("/v1/chat/completions", json={"messages": turn2, "max_tokens": 5})).json()
    p1 = tokenizer.render_chat(turn1)
    p2 = tokenizer.render_chat(turn2)
    assert p2[: len(p1)] == p1  # the template extends the previous prompt exactly
    computed = len(p1) + 30 - 1  # the last generated token never entered the KV cache
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == (computed // 16) * 16
    assert r2["usage"]["prompt_tokens"] == len(p2)


async def test_tool_call_hint_and_tool_turn_prefix(autojump_clock: trio.abc.Clock) -> None:
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    async with sim_client(SimConfig(dp_size=1, deterministic=True)) as (_cluster, client):
        first = {
            "messages": [USER],
            "tools": tools,
            "max_tokens": 20,
            "vllm_xargs": {"sim_finish_reason": "tool_calls"},
        }
        r1 = (await client.post("/v1/chat/completions", json=first)).json()
        msg = r1["choices"][0]["message"]
        assert r1["choices"][0]["finish_reason"] == "tool_calls"
        assert msg["content"] is None
        (call,) = msg["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "read_file"
        assert json.loads(call["function"]["arguments"])["q"]
        assert r1["usage"]["completion_tokens"] == 20
        turn2 = [
            USER,
            {"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]},
            {"role": "tool", "tool_call_id": call["id"], "content": "README.md setup.py"},
        ]
        r2 = (
            await client.post("/v1/chat/completions", json={"messages": turn2, "tools": tools, "max_tokens": 4})
        ).json()
        stream_req = {**first, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=stream_req) as s:
            frames = sse_payloads(b"".join([c async for c in s.aiter_bytes()]))
    p1 = tokenizer.render_chat([USER], tools=tools)
    computed = len(p1) + 20 - 1
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == (computed // 16) * 16
    deltas = [f["choices"][0]["delta"] for f in frames[:-1]]
    assert deltas[1]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": ""}
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[2:] if "tool_calls" in d)
    assert args == call["function"]["arguments"]
    assert frames[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_sim_tool_name_hint_names_the_call_without_declared_tools(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client(SimConfig(dp_size=1, deterministic=True)) as (_cluster, client):
        body = {
            "messages": [USER],
            "max_tokens": 20,
            "vllm_xargs": {"sim_finish_reason": "tool_calls", "sim_tool_name": "run_tests"},
        }
        r = (await client.post("/v1/chat/completions", json=body)).json()
        assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "run_tests"
        assert r["usage"]["completion_tokens"] == 20
        bad = {**body, "vllm_xargs": {"sim_finish_reason": "tool_calls", "sim_tool_name": ""}}
        err = await client.post("/v1/chat/completions", json=bad)
        assert err.status_code == 400 and err.json()["error"]["param"] == "vllm_xargs.sim_tool_name"


async def test_sim_output_tokens_hint_stops_early(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (_cluster, client):
        r = await client.post(
            "/v1/chat/completions", json={"messages": [USER], "max_tokens": 50, "vllm_xargs": {"sim_output_tokens": 7}}
        )
    assert r.json()["usage"]["completion_tokens"] == 7
    assert r.json()["choices"][0]["finish_reason"] == "stop"


async def test_dp_pinning_and_least_loaded_routing(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client(SimConfig(dp_size=3, deterministic=True)) as (cluster, client):
        r = await client.post(
            "/v1/chat/completions", json={"messages": [USER], "max_tokens": 4}, headers={"X-data-parallel-rank": "2"}
        )
        assert r.status_code == 200
        assert [e.stats.generation_tokens for e in cluster.engines] == [0, 0, 4]
        bad = await client.post(
            "/v1/chat/completions", json={"messages": [USER]}, headers={"x-data-parallel-rank": "3"}
        )
        assert bad.status_code == 400
        assert bad.json()["error"]["message"] == "data_parallel_rank 3 is out of range [0, 3)."
        ignored = await client.post(
            "/v1/chat/completions", json={"messages": [USER], "max_tokens": 1}, headers={"x-data-parallel-rank": "two"}
        )
        assert ignored.status_code == 200
        assert cluster.engines[0].stats.generation_tokens == 1  # unpinned, all idle -> lowest rank

        async def one(i: int) -> None:
            await client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": f"task {i}"}], "max_tokens": 50}
            )

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
        # three concurrent requests spread over the three ranks (waiting*4 + running)
        assert [e.stats.generation_tokens for e in cluster.engines] == [51, 50, 54]


async def test_metrics_exposition_matches_engine_counters(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (cluster, client):
        long_user = {"role": "user", "content": tokenizer.text_of_tokens(100, "metrics")}
        for i in range(3):
            await client.post(
                "/v1/chat/completions",
                json={"messages": [long_user], "max_tokens": 3 + i},
                headers={"x-data-parallel-rank": str(i % 2)},
            )
        text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # family names as the parser reports them (counters lose the _total suffix)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert name in families, name

    def value(sample_name: str, engine: int) -> float:
        for fam in families.values():
            for s in fam.samples:
                if s.name == sample_name and s.labels.get("engine") == str(engine):
                    assert s.labels.get("model_name", "agentd-sim") == "agentd-sim"
                    return s.value
        raise AssertionError(sample_name)

    for rank, engine in enumerate(cluster.engines):
        st = engine.stats
        assert value("vllm:prompt_tokens_total", rank) == st.prompt_tokens
        assert value("vllm:prompt_tokens_cached_total", rank) == st.prompt_tokens_cached
        assert value("vllm:generation_tokens_total", rank) == st.generation_tokens
        assert value("vllm:prefix_cache_queries_total", rank) == st.prefix_cache_queries
        assert value("vllm:prefix_cache_hits_total", rank) == st.prefix_cache_hits
        assert value("vllm:num_preemptions_total", rank) == st.num_preemptions
        assert value("vllm:time_to_first_token_seconds_count", rank) == st.ttft.count
        assert value("vllm:inter_token_latency_seconds_count", rank) == st.itl.count
        assert value("vllm:kv_cache_usage_perc", rank) == engine.kv_cache_usage()
    assert [cluster.engines[r].stats.generation_tokens for r in (0, 1)] == [3 + 5, 4]
    assert value("vllm:prefix_cache_hits_total", 0) > 0  # the third request reused the first's prompt
    info = [s for s in families["vllm:cache_config_info"].samples if s.labels["engine"] == "1"][0]
    assert info.labels["num_gpu_blocks"] == "4096" and info.labels["block_size"] == "16"


async def test_metrics_served_again_while_idle_always_equal_a_fresh_render(autojump_clock: trio.abc.Clock) -> None:
    """While every engine is idle the exposition is served from a cache (docs/simulator.md §3): after
    a completed request, an abort, a request in flight and idle stretches it must still equal
    what rendering the engines now gives."""
    registry = CollectorRegistry(auto_describe=False)
    async with sim_client() as (cluster, client):
        registry.register(SimCollector(cluster))
        seen: list[str] = []

        async def scrape_matches() -> None:
            text = (await client.get("/metrics")).text
            assert text == generate_latest(registry).decode()
            seen.append(text)

        await scrape_matches()
        await trio.sleep(30.0)
        await scrape_matches()
        await client.post("/v1/chat/completions", json={"messages": [USER], "max_tokens": 4})
        await scrape_matches()
        await trio.sleep(5.0)
        await scrape_matches()
        payload = {"messages": [USER], "max_tokens": 200, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=payload) as s:
            async for _chunk in s.aiter_bytes():
                await scrape_matches()  # busy: one request running
                break
        await trio.sleep(1.0)
        await scrape_matches()  # idle again after the abort
        await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        await scrape_matches()
    assert seen[0] == seen[1] and seen[1] != seen[2] and seen[2] == seen[3]
    assert len(set(seen)) == 5


async def test_client_disconnect_aborts_the_request(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (cluster, client):
        payload = {"messages": [USER], "max_tokens": 500, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=payload) as s:
            async for _chunk in s.aiter_bytes():
                break
        await trio.sleep(1.0)
        assert sum(e.stats.request_success["abort"] for e in cluster.engines) == 1
        assert sum(e.num_running + e.num_waiting for e in cluster.engines) == 0
        assert sum(e.stats.generation_tokens for e in cluster.engines) < 500


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": "notalist"}, 400, "messages"),
        ({"messages": [{"content": "x"}]}, 400, "messages[0]"),
        ({"messages": [USER], "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": [USER], "max_tokens": "10"}, 400, "max_tokens"),
        ({"messages": [USER], "priority": "high"}, 400, "priority"),
        ({"messages": [USER], "priority": 2**63}, 400, "priority"),
        ({"messages": [USER], "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ({"messages": [USER], "model": "gpt-4"}, 404, "model"),
        ({"messages": [USER], "n": 2}, 400, "n"),
        ({"messages": [USER], "vllm_xargs": "nope"}, 400, "vllm_xargs"),
        ({"messages": [USER], "vllm_xargs": {"sim_finish_reason": "eos"}}, 400, "vllm_xargs.sim_finish_reason"),
        ({"messages": [USER], "cache_salt": ""}, 400, "cache_salt"),
        ({"messages": [USER], "max_tokens": 70_000}, 400, "max_tokens"),
    ],
)
async def test_bad_requests_name_the_field(
    autojump_clock: trio.abc.Clock, body: dict[str, object], status: int, param: str
) -> None:
    async with sim_client() as (_cluster, client):
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == status
    assert param.split("[")[0] in err["message"] or status == 404


async def test_a_field_sent_with_a_wrong_value_is_not_called_missing(autojump_clock: trio.abc.Clock) -> None:
    """ "field required" only when the field is absent; a value of the wrong shape is named, and an
    out-of-range token id says so (session 41's walk: both read "field required")."""
    cases = [
        ("/v1/chat/completions", {}, "messages", "field required"),
        ("/v1/chat/completions", {"messages": []}, "messages", "must be a non-empty list of messages, got []"),
        ("/v1/completions", {}, "prompt", "field required"),
        ("/v1/completions", {"prompt": 7}, "prompt", "must be a string or a list of token ids, got 7"),
        ("/v1/completions", {"prompt": [1, -5]}, "prompt", "token ids must be integers from 0 to"),
        ("/v1/embeddings", {"input": 3.5}, "input", "got 3.5"),
        ("/v1/responses", {"input": {"x": 1}}, "input", "must be a string or a non-empty list of input items"),
    ]
    async with sim_client() as (_cluster, client):
        for path, body, param, words in cases:
            r = await client.post(path, json=body)
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == param and words in err["message"], (path, body, err)


async def test_strict_xargs_rejects_nested_values_lenient_accepts(autojump_clock: trio.abc.Clock) -> None:
    body = {"messages": [USER], "max_tokens": 2, "vllm_xargs": {"agentic_context": {"program_id": "p1"}, "k": [1, "a"]}}
    async with sim_client(SimConfig(strict_xargs=True, deterministic=True)) as (_c, client):
        strict = await client.post("/v1/chat/completions", json=body)
        scalar = await client.post(
            "/v1/chat/completions", json={**body, "vllm_xargs": {"agentic_context": '{"program_id": "p1"}', "k": [1]}}
        )
    async with sim_client() as (_c, client):
        lenient = await client.post("/v1/chat/completions", json=body)
    assert strict.status_code == 400
    assert strict.json()["error"]["param"] == "vllm_xargs.agentic_context"
    assert scalar.status_code == 200 and lenient.status_code == 200


async def test_priority_under_fcfs_can_be_rejected(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client(SimConfig(priority_under_fcfs="reject", deterministic=True)) as (_c, client):
        r = await client.post("/v1/chat/completions", json={"messages": [USER], "priority": 3})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "Got priority 3 but Priority scheduling is not enabled."


async def test_other_endpoints(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client(SimConfig(dp_size=1, engine=EngineConfig(num_gpu_blocks=101), deterministic=True)) as (
        _c,
        client,
    ):
        assert (await client.get("/health")).status_code == 200
        models = (await client.get("/v1/models")).json()
        assert models["data"][0]["id"] == "agentd-sim" and models["data"][0]["max_model_len"] == 1600
        tok = (await client.post("/tokenize", json={"prompt": "hello big world"})).json()
        assert tok == {"count": 3, "max_model_len": 1600, "tokens": tokenizer.tokenize("hello big world")}
        chat_tok = (await client.post("/tokenize", json={"messages": [USER]})).json()
        assert chat_tok["tokens"] == tokenizer.render_chat([USER])
        render = (await client.post("/v1/chat/completions/render", json={"messages": [USER], "model": "x"})).json()
        assert render["token_ids"] == tokenizer.render_chat([USER])
        assert (await client.get("/get_load")).json() == {"load": 0}
        assert (await client.get("/nope")).status_code == 404
        for path in (
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",  # was a 404: a GET on a served POST endpoint is vLLM's 405
            "/v1/embeddings",
            "/tokenize",
            "/detokenize",
        ):
            wrong_method = await client.get(path)
            assert wrong_method.status_code == 405, path
            assert wrong_method.json()["error"]["type"] == "MethodNotAllowed"
        bad_json = await client.post("/v1/chat/completions", content=b"{not json")
        assert bad_json.status_code == 400 and bad_json.json()["error"]["param"] == "body"


async def test_continuous_usage_and_token_id_prompts(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (_cluster, client):
        payload = {
            "prompt": [101, 102, 103, 104],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        async with client.stream("POST", "/v1/completions", json=payload) as r:
            frames = sse_payloads(b"".join([c async for c in r.aiter_bytes()]))
        batched = await client.post("/v1/completions", json={"prompt": ["a", "b"]})
        alone = {**payload, "stream_options": {"continuous_usage_stats": True}}  # without include_usage
        async with client.stream("POST", "/v1/completions", json=alone) as r:
            plain = sse_payloads(b"".join([c async for c in r.aiter_bytes()]))
    assert plain and all("usage" not in f for f in plain)  # vLLM: continuous only with include_usage
    token_frames = frames[:-2]
    assert [f["usage"]["completion_tokens"] for f in token_frames] == [1, 2, 3]
    assert all(f["usage"]["prompt_tokens"] == 4 for f in frames[:-1])
    assert batched.status_code == 400 and batched.json()["error"]["param"] == "prompt"


async def test_embeddings_shape_formats_and_errors(autojump_clock: trio.abc.Clock) -> None:
    import base64
    import struct

    async with sim_client() as (_cluster, client):
        t0 = trio.current_time()
        r = await client.post("/v1/embeddings", json={"input": ["the cat", "the cat sat"], "dimensions": 8})
        assert trio.current_time() == t0  # served at once, outside the engines (docs/simulator.md §3)
        assert r.status_code == 200, r.text
        doc = r.json()
        vectors = [d["embedding"] for d in doc["data"]]
        assert [len(v) for v in vectors] == [8, 8]
        assert doc["usage"]["prompt_tokens"] == len(tokenizer.tokenize("the cat")) + len(
            tokenizer.tokenize("the cat sat")
        )
        again = (await client.post("/v1/embeddings", json={"input": "the cat", "encoding_format": "base64"})).json()
        packed = base64.b64decode(again["data"][0]["embedding"])
        floats = struct.unpack(f"<{len(packed) // 4}f", packed)
        assert len(floats) == 64 and abs(sum(x * x for x in floats) - 1.0) < 1e-4
        for payload, param in (
            ({"input": []}, "input"),
            ({"input": "x", "dimensions": 65}, "dimensions"),
            ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
            ({"input": [[1, -2]]}, "input[0]"),
        ):
            bad = await client.post("/v1/embeddings", json=payload)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (payload, bad.text)


def _response_events(raw: bytes) -> list[tuple[str, dict[str, object]]]:
    events = []
    for frame in raw.decode().split("\n\n")[:-1]:
        head, data = frame.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: "), frame
        payload = json.loads(data[len("data: ") :])
        assert payload["type"] == head[len("event: ") :]
        events.append((payload["type"], payload))
    return events


async def test_responses_api_runs_as_the_chat_request_it_stands_for(autojump_clock: trio.abc.Clock) -> None:
    # docs/simulator.md §3: the same prompt tokens, timing and output as the chat request
    long_user = {"role": "user", "content": " ".join(f"word{i}" for i in range(200))}  # many KV blocks
    messages = [{"role": "system", "content": "be brief"}, long_user]
    async with sim_client() as (_cluster, client):
        t0 = trio.current_time()
        chat = (await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4})).json()
        chat_seconds = trio.current_time() - t0
        t1 = trio.current_time()
        body = {"instructions": "be brief", "input": long_user["content"], "max_output_tokens": 4}
        r = await client.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        assert trio.current_time() - t1 < chat_seconds  # its prompt was cached by the chat request
        doc = r.json()
    assert doc["object"] == "response" and doc["id"].startswith("resp_")
    assert doc["status"] == "completed" and doc["incomplete_details"] is None  # a natural stop by default
    (item,) = doc["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert doc["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"] == len(tokenizer.render_chat(messages))
    assert doc["usage"]["output_tokens"] == 4 and doc["usage"]["input_tokens_details"]["cached_tokens"] > 0


async def test_responses_api_streams_openai_events(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (_cluster, client):
        body = {"input": [USER], "max_output_tokens": 3, "stream": True}
        async with client.stream("POST", "/v1/responses", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = b"".join([chunk async for chunk in r.aiter_bytes()])
        events = _response_events(raw)
        kinds = [k for k, _ in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-4:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        deltas = "".join(str(p["delta"]) for k, p in events if k == "response.output_text.delta")
        final = events[-1][1]["response"]
        assert isinstance(final, dict) and final["output"][0]["content"][0]["text"] == deltas
        assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
        # a tool call: one function_call item, its arguments streamed
        tools = [{"type": "function", "name": "grep", "parameters": {"type": "object"}}]
        hint = {"vllm_xargs": {"sim_finish_reason": "tool_calls"}}
        body = {"input": "find it", "tools": tools, "stream": True, **hint}
        async with client.stream("POST", "/v1/responses", json=body) as r:
            raw = b"".join([chunk async for chunk in r.aiter_bytes()])
        events = _response_events(raw)
        done = [p for k, p in events if k == "response.function_call_arguments.done"]
        args = "".join(str(p["delta"]) for k, p in events if k == "response.function_call_arguments.delta")
        assert len(done) == 1 and done[0]["arguments"] == args
        assert events[-1][0] == "response.completed"
        final_item = events[-1][1]["response"]["output"][0]  # type: ignore[index]
        assert final_item["type"] == "function_call" and final_item["name"] == "grep"
        # the call and its output go back as input items: the next turn's prompt extends it
        follow = {
            "input": [
                {"role": "user", "content": "find it"},
                {"type": "function_call", "call_id": final_item["call_id"], "name": "grep", "arguments": args},
                {"type": "function_call_output", "call_id": final_item["call_id"], "output": "3 hits"},
            ],
            "tools": tools,
            "max_output_tokens": 2,
        }
        doc = (await client.post("/v1/responses", json=follow)).json()
        assert doc["usage"]["input_tokens_details"]["cached_tokens"] > 0


async def test_responses_api_errors_name_the_field(autojump_clock: trio.abc.Clock) -> None:
    async with sim_client() as (_cluster, client):
        for payload, param in (
            ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
            ({"input": []}, "input"),
            ({"input": [{"type": "reasoning"}]}, "input[0].summary"),  # accepted with its summary since session 41
            ({"input": [{"type": "file_search_call"}]}, "input[0].type"),
            ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
            ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ):
            bad = await client.post("/v1/responses", json=payload)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, (payload, bad.text)
        # the chat default (the limit reached, "length") on request: an incomplete response
        hint = {"vllm_xargs": {"sim_finish_reason": "length"}}
        doc = (await client.post("/v1/responses", json={"input": "x", "max_output_tokens": 2, **hint})).json()
        assert doc["status"] == "incomplete" and doc["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_forced_tool_choice_answers_a_tool_call(autojump_clock: trio.abc.Clock) -> None:
    # vLLM's guided decoding answers a forced tool_choice with a tool call ("required": finish
    # "tool_calls"; a named function: that function, finish "stop"); the simulator answered text
    tools = [
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    ]
    base = {"messages": [USER], "tools": tools, "max_tokens": 12}
    named = {"type": "function", "function": {"name": "get_weather"}}
    async with sim_client() as (_cluster, client):
        for choice, name, finish in (("required", "search", "tool_calls"), (named, "get_weather", "stop")):
            doc = (await client.post("/v1/chat/completions", json={**base, "tool_choice": choice})).json()
            (out,) = doc["choices"]
            (call,) = out["message"]["tool_calls"]
            assert call["function"]["name"] == name and out["finish_reason"] == finish, doc
            assert json.loads(call["function"]["arguments"])["q"]
            assert doc["usage"]["completion_tokens"] == 12
        auto = (await client.post("/v1/chat/completions", json={**base, "tool_choice": "auto"})).json()
        assert auto["choices"][0]["message"]["tool_calls"] == [] and auto["choices"][0]["finish_reason"] == "length"
        streamed = {**base, "tool_choice": named, "stream": True}
        frames = sse_payloads((await client.post("/v1/chat/completions", json=streamed)).content)
        assert frames[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert frames[-2]["choices"][0]["finish_reason"] == "stop" and frames[-1] == "[DONE]"
        responses = {
            "input": "hi",
            "max_output_tokens": 12,
            "tools": [{"type": "function", "name": "lookup", "parameters": {}}],
            "tool_choice": {"type": "function", "name": "lookup"},
        }
        doc = (await client.post("/v1/responses", json=responses)).json()
        assert doc["status"] == "completed" and doc["output"][0]["type"] == "function_call", doc
        assert doc["output"][0]["name"] == "lookup"
        for choice, message in (
            ({"type": "function", "function": {"name": "nope"}}, "Tool 'nope' has not been passed in `tools`."),
            ("required", "When using `tool_choice`, `tools` must be set."),
        ):
            payload = {"messages": [USER], "max_tokens": 12, "tool_choice": choice}
            if choice != "required":
                payload["tools"] = tools
            err = await client.post("/v1/chat/completions", json=payload)
            assert err.status_code == 400 and err.json()["error"]["param"] == "tool_choice"
            assert message in err.json()["error"]["message"]


async def test_logprobs_are_answered_in_openai_shapes(autojump_clock: trio.abc.Clock) -> None:
    # a client asking for logprobs got "logprobs": null, so choice.logprobs.content failed
    async with sim_client() as (_cluster, client):
        chat = {"messages": [USER], "max_tokens": 3, "logprobs": True, "top_logprobs": 2}
        doc = (await client.post("/v1/chat/completions", json=chat)).json()
        content = doc["choices"][0]["logprobs"]["content"]
        assert "".join(t["token"] for t in content) == doc["choices"][0]["message"]["content"]
        assert all(t["logprob"] == 0.0 and t["bytes"] == list(t["token"].encode()) for t in content)
        assert all(t["top_logprobs"][0]["token"] == t["token"] for t in content)
        frames = sse_payloads((await client.post("/v1/chat/completions", json={**chat, "stream": True})).content)
        streamed = [f["choices"][0]["logprobs"] for f in frames[1:-1]]
        assert [lp["content"][0]["token"] for lp in streamed] == [t["token"] for t in content]
        assert frames[0]["choices"][0]["logprobs"] is None
        plain = (await client.post("/v1/chat/completions", json={"messages": [USER], "max_tokens": 3})).json()
        assert plain["choices"][0]["logprobs"] is None

        cmpl = {"prompt": "hello there", "max_tokens": 3, "logprobs": 1}
        doc = (await client.post("/v1/completions", json=cmpl)).json()
        lp = doc["choices"][0]["logprobs"]
        assert "".join(lp["tokens"]) == doc["choices"][0]["text"] and lp["token_logprobs"] == [0.0] * 3
        assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])
        assert lp["top_logprobs"] == [{t: 0.0} for t in lp["tokens"]]
        frames = sse_payloads((await client.post("/v1/completions", json={**cmpl, "stream": True})).content)
        assert [f["choices"][0]["logprobs"]["tokens"][0] for f in frames[:-1]] == lp["tokens"]
        assert [f["choices"][0]["logprobs"]["text_offset"][0] for f in frames[:-1]] == lp["text_offset"]
        bad = await client.post("/v1/chat/completions", json={**chat, "top_logprobs": 21})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_logprobs"


async def test_completions_echo_puts_the_prompt_before_the_output(autojump_clock: trio.abc.Clock) -> None:
    # vLLM's echo: the text starts with the prompt; the simulator ignored echo
    async with sim_client() as (_cluster, client):
        body = {"prompt": "hello there", "max_tokens": 3}
        plain = (await client.post("/v1/completions", json=body)).json()
        text = plain["choices"][0]["text"]
        echoed = (await client.post("/v1/completions", json={**body, "echo": True, "logprobs": 0})).json()
        assert echoed["choices"][0]["text"] == "hello there" + text
        assert echoed["usage"] == plain["usage"]
        assert echoed["choices"][0]["logprobs"]["text_offset"][0] == len("hello there")
        streamed = await client.post("/v1/completions", json={**body, "echo": True, "stream": True})
        frames = sse_payloads(streamed.content)
        assert "".join(f["choices"][0]["text"] for f in frames[:-1]) == "hello there" + text
        ids = await client.post("/v1/completions", json={"prompt": [101, 102], "max_tokens": 2, "echo": True})
        assert ids.status_code == 400 and ids.json()["error"]["param"] == "echo"


async def test_a_prompt_that_fills_the_context_names_the_input(autojump_clock: trio.abc.Clock) -> None:
    # it named max_tokens ("1600 in the messages, 1 in the completion") for a request without it
    config = SimConfig(dp_size=1, engine=EngineConfig(num_gpu_blocks=101), deterministic=True)  # 1600 tokens
    async with sim_client(config) as (_c, client):
        for path, body, where in (
            ("/v1/completions", {"prompt": " ".join(["ab"] * 1600)}, "prompt"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": " ".join(["ab"] * 1600)}]}, "messages"),
        ):
            r = await client.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == where, r.text
            assert "maximum context length is 1600 tokens" in r.json()["error"]["message"]
            assert "completion" not in r.json()["error"]["message"]
        fits = await client.post("/v1/completions", json={"prompt": " ".join(["ab"] * 1599)})
        assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == 1
        over = await client.post("/v1/completions", json={"prompt": " ".join(["ab"] * 1590), "max_tokens": 20})
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
