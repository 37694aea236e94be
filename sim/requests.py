"""Validation of the simulated server's OpenAI requests and planning of their deterministic output.

Errors are ``ApiError`` with vLLM's JSON shape ``{"error": {"message", "type", "param", "code"}}``
and a message naming the offending field.

Simulation hints (documented in docs/simulator.md), sent inside ``vllm_xargs`` so that stock
clients can pass them through ``extra_body`` and stock vLLM simply ignores them:

* ``sim_output_tokens`` (int >= 1, <= max_tokens): generate this many tokens, then finish with
  ``"stop"``, or ``"length"`` when it equals ``max_tokens`` (default: exactly ``max_tokens`` tokens
  and ``"length"``, i.e. ignore-EOS semantics);
* ``sim_finish_reason`` (``"stop"`` | ``"length"`` | ``"tool_calls"``): force the finish reason;
  ``"tool_calls"`` (chat only) makes the output one tool call to the first declared tool (or
  ``sim_tool``) whose arguments are ``{"q": "<words>"}`` (a value of the tool's ``parameters`` when
  they list properties, docs/simulator.md §3); the call's tokens, rendered by the chat template in
  the next request, extend the prompt exactly;
* ``sim_tool_name`` (a non-empty string of at most 64 characters): the function the
  ``"tool_calls"`` answer calls, instead of the first declared tool (the trace replay names the
  tool whose result the next turn carries, docs/traces.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from sim import structured, tokenizer

if TYPE_CHECKING:
    from sim.cluster import SimCluster

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FINISH_REASONS = ("stop", "length", "tool_calls")


class ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param)


@attrs.frozen
class ToolCall:
    id: str
    name: str
    arguments: str
    name_tokens: int


@attrs.frozen
class PlannedOutput:
    token_ids: list[int]
    pieces: list[str]  # per output token: its text (content) or argument text (tool call)
    finish_reason: str
    tool_call: ToolCall | None = None
    # characters before each piece, filled on first use (logprobs' text_offset of a streamed chunk
    # without summing every earlier piece again: that made a long stream quadratic)
    _starts: list[int] = attrs.field(factory=list, init=False, eq=False, repr=False)

    def text_start(self, index: int) -> int:
        """Characters of the pieces before ``pieces[index]`` (``index`` may be ``len(pieces)``)."""
        starts = self._starts
        if not starts:
            total = 0
            for piece in self.pieces:
                starts.append(total)
                total += len(piece)
            starts.append(total)
        return starts[index]


@attrs.frozen
class ParsedRequest:
    prompt_ids: list[int]
    output: PlannedOutput
    priority: int
    cache_salt: str | None
    skip_prefix_cache: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    logprobs: int | None = None  # top alternatives per token when logprobs are requested, else None
    echo_text: str = ""  # completions ``echo``: the prompt text that precedes the output text


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_bool(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(key, f"must be a boolean, got {v!r}")
    return v


def _missing_or_wrong(body: Mapping[str, Any], key: str, what: str) -> ApiError:
    """The 400 for a field that is absent ("field required") or not ``what`` (naming what came)."""
    value = body.get(key)
    if value is None:
        return bad(key, f"field required: {what}")
    shown = repr(value)
    return bad(key, f"must be {what}, got {shown if len(shown) <= 80 else shown[:77] + '...'}")


def _prompt_ids(body: Mapping[str, Any], chat: bool) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _missing_or_wrong(body, "messages", "a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad(f"messages[{i}]", "must be an object with a string 'role'")
            content = m.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise bad(f"messages[{i}].content", "must be a string, a list of parts or null")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad("tools", "must be a list")
        agp = _opt_bool(body, "add_generation_prompt", True)
        return tokenizer.render_chat(messages, tools=tools, add_generation_prompt=agp)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.tokenize(prompt)
    elif isinstance(prompt, list) and prompt and all(_is_int(t) and 0 <= t < tokenizer.VOCAB_SIZE for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        raise bad("prompt", f"token ids must be integers from 0 to {tokenizer.VOCAB_SIZE - 1}")
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad("prompt", "batched prompts are not supported by the simulator; send one prompt per request")
    else:
        raise _missing_or_wrong(body, "prompt", "a string or a list of token ids")
    if not ids:
        raise bad("prompt", "must not be empty")
    return ids


def parse_tokenize(body: Mapping[str, Any], *, chat: bool) -> list[int]:
    return _prompt_ids(body, chat)


EMBEDDING_DIMENSIONS = 64  # the simulated model's embedding size (docs/simulator.md §3)


def parse_embeddings(body: Mapping[str, Any], *, model: str, max_model_len: int) -> list[list[int]]:
    """The token ids of each input of a ``/v1/embeddings`` request (OpenAI's shapes: a string, a
    list of strings, a list of token ids, a list of token-id lists; or vLLM's chat form,
    ``messages``), in order; errors name the field as vLLM's do."""
    requested = body.get("model")
    if requested is not None and requested != model:
        raise ApiError(404, f"The model `{requested}` does not exist.", "NotFoundError", param="model")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad("encoding_format", f"must be 'float' or 'base64', got {fmt!r}")
    dims = body.get("dimensions")
    if dims is not None and (not _is_int(dims) or not 1 <= dims <= EMBEDDING_DIMENSIONS):
        raise bad("dimensions", f"must be an integer from 1 to {EMBEDDING_DIMENSIONS}, got {dims!r}")
    if "messages" in body and "input" not in body:
        inputs = [_prompt_ids(body, True)]
    else:
        given = body.get("input")
        if isinstance(given, str):
            inputs = [tokenizer.tokenize(given)]
        elif isinstance(given, list) and given and all(_is_int(t) for t in given):
            inputs = [list(given)]
        elif isinstance(given, list) and given and all(isinstance(x, (str, list)) for x in given):
            inputs = [tokenizer.tokenize(x) if isinstance(x, str) else list(x) for x in given]
        else:
            raise _missing_or_wrong(body, "input", "a string, a list of strings or a list of token ids")
    for i, ids in enumerate(inputs):
        if not all(_is_int(t) and 0 <= t < tokenizer.VOCAB_SIZE for t in ids):
            raise bad(f"input[{i}]", f"token ids must be integers from 0 to {tokenizer.VOCAB_SIZE - 1}")
        if not ids:
            raise bad(f"input[{i}]", "must not be empty")
        if len(ids) > max_model_len:
            raise bad(
                f"input[{i}]",
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{len(ids)} tokens in the input for embedding generation. Please reduce the length of the input.",
            )
    return inputs


def embedding_vector(ids: list[int], dimensions: int) -> list[float]:
    """A deterministic unit vector for ``ids``: each token adds +-1 to two coordinates chosen by its
    hash, so texts sharing words point the same way (docs/simulator.md §3)."""
    acc = [0.0] * EMBEDDING_DIMENSIONS
    for t in ids:
        h = hashlib.blake2b(t.to_bytes(8, "little", signed=False), digest_size=4).digest()
        acc[h[0] % EMBEDDING_DIMENSIONS] += 1.0 if h[1] & 1 else -1.0
        acc[h[2] % EMBEDDING_DIMENSIONS] += 1.0 if h[3] & 1 else -1.0
    acc = acc[:dimensions]
    norm = sum(x * x for x in acc) ** 0.5
    return [round(x / norm, 6) for x in acc] if norm else [0.0] * dimensions


def parse_generation(body: Mapping[str, Any], *, chat: bool, cluster: SimCluster) -> ParsedRequest:
    config = cluster.config
    model = body.get("model")
    if model is not None and model != config.model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", param="model")
    prompt_ids = _prompt_ids(body, chat)

    n = body.get("n", 1)
    if n is not None and n != 1:
        raise bad("n", f"only n=1 is supported by the simulator, got {n!r}")
    max_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(max_key)
    room = config.engine.max_model_len - len(prompt_ids)
    if room < 1:
        # the prompt alone fills the context: vLLM names the input, not a max_tokens never sent
        where = "messages" if chat else "prompt"
        raise ApiError(
            400,
            f"This model's maximum context length is {config.engine.max_model_len} tokens. However, you requested "
            f"{len(prompt_ids)} tokens in the {where}. Please reduce the length of the {where}.",
            param=where,
        )
    if max_tokens is None:
        default = config.default_chat_max_tokens if chat else config.default_completion_max_tokens
        max_tokens = max(1, min(default, room))
    elif not _is_int(max_tokens) or max_tokens < 1:
        raise bad(max_key, f"must be an integer >= 1, got {max_tokens!r}")
    if len(prompt_ids) + max_tokens > config.engine.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {config.engine.max_model_len} tokens. However, you requested "
            f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the "
            f"completion). Please reduce the length of the messages or {max_key}.",
            param=max_key,
        )

    priority = body.get("priority", 0)
    if priority is None:
        priority = 0
    if not _is_int(priority) or not INT64_MIN <= priority <= INT64_MAX:
        raise bad("priority", f"must be a 64-bit signed integer, got {priority!r}")
    if priority != 0 and config.engine.scheduling_policy == "fcfs" and config.priority_under_fcfs == "reject":
        raise ApiError(400, f"Got priority {priority} but Priority scheduling is not enabled.", param="priority")

    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise bad("stream_options", "Stream options can only be defined when `stream=True`.")
        if not isinstance(options, dict):
            raise bad("stream_options", "must be an object")
        include_usage = _opt_bool(options, "include_usage")
        # vLLM honours continuous_usage_stats only together with include_usage (docs/simulator.md §3)
        continuous = include_usage and _opt_bool(options, "continuous_usage_stats")

    xargs = body.get("vllm_xargs")
    if xargs is None:
        xargs = {}
    if not isinstance(xargs, dict):
        raise bad("vllm_xargs", "must be an object")
    if config.strict_xargs:
        for key, value in xargs.items():
            if not _scalar(value) and not (isinstance(value, list) and all(_scalar(v) for v in value)):
                raise bad(f"vllm_xargs.{key}", "Input should be a valid string, integer, number or list of them")

    cache_salt = body.get("cache_salt")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not 1 <= len(cache_salt) <= 1024):
        raise bad("cache_salt", "must be a string of 1 to 1024 characters")
    skip_cache = body.get("prompt_logprobs") is not None

    output = _plan_output(body, xargs, prompt_ids, max_tokens, chat=chat, seed=config.seed)
    logprobs = _logprobs(body, chat=chat)
    echo_text = _echo_text(body) if not chat else ""
    return ParsedRequest(
        prompt_ids, output, priority, cache_salt, skip_cache, stream, include_usage, continuous, logprobs, echo_text
    )


def _echo_text(body: Mapping[str, Any]) -> str:
    """The prompt text a completions request with ``echo: true`` gets in front of its output."""
    if not _opt_bool(body, "echo"):
        return ""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("echo", "echo of a token-id prompt is not supported by the simulator's hashing tokenizer")
    return prompt


MAX_LOGPROBS = 20  # vLLM's default max_logprobs


def _logprobs(body: Mapping[str, Any], *, chat: bool) -> int | None:
    """How many top alternatives a client asks for per output token (chat: ``logprobs: true`` and
    ``top_logprobs``; completions: ``logprobs: k``), or None when it asks for no logprobs."""
    if chat:
        if not _opt_bool(body, "logprobs"):
            return None
        k = body.get("top_logprobs")
        where = "top_logprobs"
    else:
        k = body.get("logprobs")
        if k is None:
            return None
        where = "logprobs"
    if k is None:
        return 0
    if not _is_int(k) or not 0 <= k <= MAX_LOGPROBS:
        raise bad(where, f"must be an integer from 0 to {MAX_LOGPROBS}, got {k!r}")
    return int(k)


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float))


def _plan_output(
    body: Mapping[str, Any], xargs: Mapping[str, Any], prompt_ids: list[int], max_tokens: int, *, chat: bool, seed: int
) -> PlannedOutput:
    n_out = max_tokens
    finish = "length"
    hint_n = xargs.get("sim_output_tokens")
    if hint_n is not None:
        if not _is_int(hint_n) or not 1 <= hint_n <= max_tokens:
            raise bad(
                "vllm_xargs.sim_output_tokens", f"must be an integer in [1, max_tokens={max_tokens}], got {hint_n!r}"
            )
        n_out = hint_n
        finish = "stop" if hint_n < max_tokens else "length"
    hint_finish = xargs.get("sim_finish_reason")
    if hint_finish is not None:
        if hint_finish not in FINISH_REASONS:
            raise bad(
                "vllm_xargs.sim_finish_reason", f"must be one of {', '.join(FINISH_REASONS)}, got {hint_finish!r}"
            )
        if hint_finish == "tool_calls" and not chat:
            raise bad("vllm_xargs.sim_finish_reason", "'tool_calls' needs /v1/chat/completions")
        finish = hint_finish
    forced = _forced_tool(body) if chat else None
    hint_where = "vllm_xargs.sim_finish_reason"
    if forced is not None and hint_finish is None:
        # vLLM's guided decoding makes a forced tool_choice always answer a tool call: finish
        # "tool_calls" for "required", "stop" for a named function (docs/simulator.md §3)
        name_forced, finish = forced
        hint_where = "tool_choice"
    else:
        name_forced = None
    material = f"{seed}:{hash(tuple(prompt_ids))}:{n_out}"
    if finish != "tool_calls" and name_forced is None:
        try:
            schema = structured.json_target(body)
        except structured.FormatError as exc:
            raise bad(exc.param, exc.message) from None
        if schema is None:
            pieces = tokenizer.generate_pieces(material, n_out)
        else:  # JSON of the same planned length (docs/simulator.md §3, "Structured output")
            pieces, whole = structured.json_pieces(material, n_out, schema)
            # guided decoding ends when the value is complete: "stop", so the openai client's
            # parse() reads it (it refuses "length"); a cut value is "length" (a hint still wins)
            finish = hint_finish or ("stop" if whole else "length")
        return PlannedOutput(tokenizer.piece_ids(pieces), pieces, finish)
    hint_name = xargs.get("sim_tool_name")
    if hint_name is not None and (not isinstance(hint_name, str) or not 1 <= len(hint_name) <= 64):
        raise bad("vllm_xargs.sim_tool_name", f"must be a string of 1 to 64 characters, got {hint_name!r}")
    name = name_forced or hint_name or _first_tool_name(body.get("tools")) or "sim_tool"
    name_ids = tokenizer.tokenize(name)
    k = n_out - 3 - len(name_ids)
    parameters = _tool_parameters(body.get("tools"), name)
    if parameters is not None and k >= 0:
        # arguments of the tool's parameters schema, as guided decoding writes a forced call
        # (before session 41 always {"q": ...}, which a pydantic function tool refused)
        pieces, whole = structured.json_pieces(material, k + 1, parameters)
        if not whole:
            raise bad(hint_where, f"a tool call to {name!r} needs more than {n_out} output tokens for its parameters")
        arguments = "".join(pieces)
    elif k < 1:
        raise bad(hint_where, f"a tool call to {name!r} needs at least {len(name_ids) + 4} output tokens")
    else:
        arguments = tokenizer.tool_call_arguments(material, k)
    ids = tokenizer.render_tool_call(name, arguments)
    pieces = ["", *([""] * len(name_ids)), *tokenizer.split_pieces(arguments), ""]
    call_id = "chatcmpl-tool-" + hashlib.blake2b(material.encode(), digest_size=8).hexdigest()
    return PlannedOutput(ids, pieces, finish, ToolCall(call_id, name, arguments, len(name_ids)))


def _tool_parameters(tools: Any, name: str) -> dict[str, Any] | None:
    """The ``parameters`` schema of the declared function ``name`` when it lists properties; a
    tool without them keeps the simulator's ``{"q": ...}`` arguments (docs/simulator.md §3)."""
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            return parameters if isinstance(parameters, dict) and parameters.get("properties") else None
    return None


def _tool_names(tools: Any) -> list[str]:
    if not isinstance(tools, list):
        return []
    names = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
            names.append(function["name"])
    return names


def _forced_tool(body: Mapping[str, Any]) -> tuple[str | None, str] | None:
    """``(function name or None for "any declared tool", finish reason)`` when ``tool_choice``
    forces a tool call (``"required"`` or ``{"type": "function", "function": {"name": ...}}``),
    else None; a forced choice without matching ``tools`` is vLLM's 400."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "none"):
        return None
    names = _tool_names(body.get("tools"))
    if choice == "required":
        if not names:
            raise bad("tool_choice", "When using `tool_choice`, `tools` must be set.")
        return None, "tool_calls"
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise bad("tool_choice", f"must be 'none', 'auto', 'required' or a named function, got {choice!r}")
    if name not in names:
        raise bad("tool_choice", f"Tool '{name}' has not been passed in `tools`.")
    return name, "stop"


def _first_tool_name(tools: Any) -> str | None:
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        function = tools[0].get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
            return str(function["name"])
    return None


# ---------------------------------------------------------------------------- the Responses API
# Body members of POST /v1/responses that carry over to the chat request the engine runs.
_RESPONSES_PASSTHROUGH = ("model", "stream", "vllm_xargs", "priority", "cache_salt", "temperature", "top_p")


def responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat request that a ``POST /v1/responses`` body stands for (docs/simulator.md §3): its
    ``instructions`` as a system message, its ``input`` (a string, or a list of messages,
    ``function_call`` and ``function_call_output`` items) as the conversation, its function
    ``tools`` in chat form and ``max_output_tokens`` as ``max_completion_tokens``.  Errors name
    the Responses field (``input[2].type``, ``tools[0].type``, ``previous_response_id``)."""
    if body.get("previous_response_id") is not None:
        raise bad(
            "previous_response_id",
            "the simulator keeps no responses: send the whole conversation in 'input' (vLLM needs its response store)",
        )
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions", f"must be a string, got {instructions!r}")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            messages.append(_responses_item(item, f"input[{i}]"))
    else:
        raise _missing_or_wrong(body, "input", "a string or a non-empty list of input items")
    chat: dict[str, Any] = {k: body[k] for k in _RESPONSES_PASSTHROUGH if k in body}
    chat["messages"] = messages
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    forced = chat.get("tool_choice") not in (None, "auto", "none")
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    # structured output ends when its value is whole ("stop"), or is cut ("incomplete"), as in chat
    structured_output = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
    xargs = chat.get("vllm_xargs")
    if (
        not forced
        and not structured_output
        and (  # a forced tool_choice answers a tool call, as in chat
            xargs is None
            or (isinstance(xargs, dict) and "sim_output_tokens" not in xargs and "sim_finish_reason" not in xargs)
        )
    ):
        # a natural stop by default, status "completed": agent SDKs treat an "incomplete" response
        # (the chat default's "length") as an error; the hints choose as for chat (docs/simulator.md §3)
        chat["vllm_xargs"] = {**(xargs or {}), "sim_finish_reason": "stop"}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("tools", "must be a list")
        converted = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
                raise bad(f"tools[{i}]", "the simulator runs function tools only: {'type': 'function', 'name': ...}")
            fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
            converted.append({"type": "function", "function": fn})
        if converted:
            chat["tools"] = converted
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        # Responses' structured output, {"type": "json_schema", "name", "schema"}: chat's response_format
        fmt = text["format"]
        kind = fmt.get("type")
        if kind == "json_schema":
            schema = fmt.get("schema", {})
            if not isinstance(schema, dict):
                raise bad("text.format.schema", f"must be an object, got {schema!r}")
            chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        elif kind in ("text", "json_object"):
            chat["response_format"] = {"type": kind}
        else:  # named here, not as the chat field it becomes
            raise bad("text.format.type", f"must be text, json_object or json_schema, got {kind!r}")
    elif text is not None and not isinstance(text, dict):
        raise bad("text", "must be an object")
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not _is_int(limit) or limit < 1:
            raise bad("max_output_tokens", f"must be an integer >= 1, got {limit!r}")
        chat["max_completion_tokens"] = limit
    return chat


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise bad(f"{where}.content[{j}]", "must be a text part: {'type': 'input_text', 'text': ...}")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"{where}.content", "must be a string or a list of text parts")


def _responses_item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise bad(where, "must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise bad(f"{where}.role", f"must be user, assistant, system or developer, got {role!r}")
        return {"role": "system" if role == "developer" else role, "content": _text_of(item.get("content"), where)}
    if kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
            raise bad(where, "a function_call item needs string 'call_id', 'name' and 'arguments'")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not (isinstance(call_id, str) and isinstance(output, str)):
            raise bad(where, "a function_call_output item needs string 'call_id' and 'output'")
        return {"role": "tool", "tool_call_id": call_id, "content": output}
    if kind == "reasoning":
        # an earlier response's reasoning sent back (as agent SDKs do): input like the others, its
        # summary and content texts as an assistant turn (docs/simulator.md §3); before session 41 a 400
        texts = []
        for part_key in ("summary", "content"):
            parts = item.get(part_key)
            if parts is None:
                continue
            if not isinstance(parts, list):
                raise bad(f"{where}.{part_key}", "must be a list of text parts")
            for j, part in enumerate(parts):
                if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                    raise bad(f"{where}.{part_key}[{j}]", "must be a text part: {'type': 'summary_text', 'text': ...}")
                texts.append(part["text"])
        if "summary" not in item:
            raise bad(f"{where}.summary", "field required: a reasoning item needs its 'summary' list")
        return {"role": "assistant", "content": "\n".join(texts)}
    raise bad(f"{where}.type", f"must be message, function_call, function_call_output or reasoning, got {kind!r}")
