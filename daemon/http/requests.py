"""Parsing and validating agent requests into :class:`~daemon.dispatch.ProxyRequest`.

Validation covers what the proxy itself relies on (so a bad value becomes a 400 naming the
field instead of a 500 or a confusing worker error): the body is a JSON object, ``model`` a
string, ``stream`` a bool, ``stream_options`` an object with a bool ``include_usage``,
``messages`` a list of objects with a string ``role`` (chat), ``prompt`` a string / list of
strings / token ids (completions), ``input`` a string or a list of strings and objects
(responses), token limits integers from 1 to :data:`MAX_TOKEN_COUNT`, ``n`` an integer >= 1, ``vllm_xargs`` an object,
``tools`` a list of objects, a message's ``tool_calls`` a list of objects and ``function_call``
an object, ``user`` and ``request_id`` strings.  The OpenAI sampling and output fields agentd
forwards have their JSON types checked too (:data:`_SAMPLING_RULES`: ``temperature``, ``top_p``,
the penalties, ``seed``, ``stop``, ``logprobs``, ``top_logprobs``, ``tool_choice``, ``metadata``,
``logit_bias``, ``response_format``, ``parallel_tool_calls``), so a wrong one is a 400 before a
Program request waits in agentd's queue, not the worker's error after it (and not a 200 from the
embedded simulator, which ignores them); their finer rules stay the worker's.  Everything else is
the worker's business and passes through untouched.

Limits that keep hostile input a 4xx (docs/operations.md, "Bad input"): JSON nesting at most
:data:`MAX_JSON_DEPTH` levels, no lone UTF-16 surrogate escapes, the request headers at most
:data:`MAX_HEADER_BYTES` in all and each id-like header (session, request, trace ids) at most
:data:`MAX_ID_HEADER_BYTES` (431 ``header_too_large``).

What the edge measures for routing and for the prompt-token estimate (docs/architecture.md §4):

* ``routing_text`` = system prompt + first user message (chat), the prompt (completions),
  instructions + first input item (responses) - the native consistent-hash key material;
* :class:`PromptSize`: the UTF-8 size of the prompt text (one role-prefixed line per message
  part plus tool schemas sorted by name) and, for prompts given as token ids, their exact count.
  The token *estimate* is made in one place, by the Program dispatcher
  (``daemon.program_dispatch.TokenEstimator``), which refines its tokens-per-byte coefficient
  from what the workers report.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from daemon.http.errors import ApiError
from daemon.http.identity import MAX_TOKEN_COUNT
from daemon.http.rawbody import MIN_LAYOUT_BYTES, Layout, TooDeep, parse_object

# The agent-facing routes: parsed, validated, scheduled (Program identity, classes, batch jobs).
AGENT_ENDPOINTS: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}
# vLLM's other JSON POST routes that agentd forwards (docs/operations.md §12.1): identity-free,
# through the native policy, with the same limits, keys, model pools, health and failover as an
# identity-free agent request; the body is checked only for what agentd reads (a JSON object, the
# ``model`` a string) and forwarded byte for byte.  Program identity, request classes and batch
# job tags do not apply to them.
FORWARDED_ENDPOINTS: dict[str, str] = {
    "/v1/embeddings": "embeddings",
    "/pooling": "pooling",
    "/classify": "classify",
    "/score": "score",
    "/v1/score": "v1_score",
    "/rerank": "rerank",
    "/v1/rerank": "v1_rerank",
    "/v2/rerank": "v2_rerank",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}
FORWARDED_KINDS: frozenset[str] = frozenset(FORWARDED_ENDPOINTS.values())
ENDPOINTS: dict[str, str] = {**AGENT_ENDPOINTS, **FORWARDED_ENDPOINTS}
_TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n")
# The output caps agentd computes with: an interactive or batch request's charge is its prompt plus
# its cap, added to a float ledger (docs/priority.md §2).  Bounded like ``expected_output_length``
# (docs/operations.md §14): a 400-digit max_tokens overflowed the float conversion inside the
# scheduler and stopped the daemon, and a cap above 2**53 cannot be added and taken back exactly.
_OUTPUT_CAP_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Deeper JSON is refused (400): real requests (tool schemas included) stay far below, and every
# later walk of the body (re-encoding, hashing) stays clear of Python's recursion limit.
MAX_JSON_DEPTH = 64
# Python's own bound on an integer literal's digits (sys.get_int_max_str_digits(), 4300 by default)
_MAX_INT_DIGITS = sys.get_int_max_str_digits()
# The request head as agentd reads it (names + values); Hypercorn refuses larger heads earlier.
MAX_HEADER_BYTES = 12 * 1024
# Headers that carry an id agentd reads, hashes or forwards: bounded, so an over-long id is refused
# at the edge instead of being forwarded to a worker (a batch custom_id may be 512 characters).
MAX_ID_HEADER_BYTES = 1024
ID_HEADERS = (
    "x-request-id", "x-session-id", "x-claude-code-session-id", "x-claude-code-agent-id",
    "x-claude-code-parent-agent-id", "session-id", "thread-id", "x-codex-session-id", "x-user-id",
    "x-tenant-id", "x-correlation-id", "x-trace-id", "x-agentd-class",
)  # fmt: skip


def bad_field(param: str, rule: str, value: Any) -> ApiError:
    shown = json.dumps(value)[:80] if not isinstance(value, str) else json.dumps(value[:80])
    return ApiError(400, f"'{param}' {rule}, got {shown}", code="invalid_type", param=param)


# A JSON string escape of a UTF-16 surrogate (\ud800-\udfff): only then can a parsed body hold a
# lone surrogate, which no UTF-8 encoder (ours or the worker's) accepts.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# A UTF-16 surrogate encoded as UTF-8 bytes (ED A0..BF ..): not valid UTF-8, but Python's JSON
# decoder (like rawbody's) reads bytes with "surrogatepass" and would hand on a lone surrogate.
# In valid UTF-8, ED is always a lead byte, so the pair cannot occur inside another character.
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays/objects more than ``limit`` levels deep: level by level,
    without recursion (one list comprehension per container keeps it cheap)."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for item in level:
            children = item.values() if type(item) is dict else item
            below += [x for x in children if type(x) is dict or type(x) is list]
        level = below
    return False


def _too_deep(what: str) -> ApiError:
    return ApiError(
        400, f"{what} nests JSON arrays or objects more than {MAX_JSON_DEPTH} levels deep", code="invalid_json"
    )


_BAD_HEADER_CHAR = re.compile(r"[^\t\x20-\x7e]")


def check_content_encoding(value: str | None) -> None:
    """A compressed request body (``content-encoding: gzip``, ``deflate``, ``br``, ...) is a 415
    naming the header: agentd reads request bodies as they are (it would otherwise parse the
    compressed bytes as JSON, or forward a body and a header that disagree to the worker)."""
    if value is not None and value.strip().lower() not in ("", "identity"):
        raise ApiError(
            415,
            f"content-encoding {value[:40]!r} is not supported: send the request body uncompressed",
            code="unsupported_content_encoding",
            param="content-encoding",
        )


def _shown_header(value: str) -> str:
    """A header value (its bytes read as latin-1) quoted for an error message: the bytes as the
    client most likely meant them (UTF-8), control characters escaped."""
    return repr(value.encode("latin-1", "replace").decode("utf-8", "replace"))


def check_headers(headers: Mapping[str, str]) -> None:
    """The header budget (431 ``header_too_large`` naming the header, or all of them), and header
    values in visible ASCII (400 ``invalid_header``): they are forwarded to the worker as they are;
    a compressed body (415 ``unsupported_content_encoding``)."""
    check_content_encoding(headers.get("content-encoding"))
    total = 0
    for name, value in headers.items():
        total += len(name) + len(value) + 4  # as on the wire: ": " and the line's CRLF
    if total > MAX_HEADER_BYTES:
        raise ApiError(
            431,
            f"request headers take {total} bytes, more than the limit of {MAX_HEADER_BYTES}",
            code="header_too_large",
            param="headers",
        )
    for name, value in headers.items():
        if _BAD_HEADER_CHAR.search(value) is not None:
            raise ApiError(
                400,
                f"header {name} must be visible ASCII, got {_shown_header(value[:80])}",
                code="invalid_header",
                param=f"headers.{name}",
            )
    for name in ID_HEADERS:
        id_value = headers.get(name)
        if id_value is not None and len(id_value) > MAX_ID_HEADER_BYTES:
            raise ApiError(
                431,
                f"header {name} takes {len(id_value)} bytes, more than the limit of {MAX_ID_HEADER_BYTES}",
                code="header_too_large",
                param=f"headers.{name}",
            )


def parse_json_body(raw: bytes) -> dict[str, Any]:
    return parse_json_body_layout(raw)[0]


def parse_json_body_layout(raw: bytes) -> tuple[dict[str, Any], Layout | None]:
    """The body as a JSON object, and where its top-level members are in ``raw`` (None when the
    raw edits of :mod:`daemon.http.rawbody` cannot be used); 400 ``invalid_json`` for anything else."""
    if (
        not raw.isascii()
        and (found := _SURROGATE_BYTES.search(raw)) is not None
        and json.detect_encoding(raw) == "utf-8"
    ):
        # (before session 34: a 500, the prompt-size estimate or the identity could not encode it)
        raise ApiError(
            400,
            f"request body is not valid UTF-8: bytes {raw[found.start() : found.start() + 3].hex(' ')} at offset "
            f"{found.start()} encode a UTF-16 surrogate",
            code="invalid_json",
        )
    try:
        # the depth limit is checked while parsing (cost: one step per array/object)
        body, layout = parse_object(raw, MIN_LAYOUT_BYTES, MAX_JSON_DEPTH)
    except TooDeep as exc:
        raise _too_deep("request body") from exc
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8: {exc}", code="invalid_json") from exc
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's digit limit, whose message advises a setting
            raise ApiError(
                400,
                f"request body is not valid JSON here: an integer has more than {_MAX_INT_DIGITS} digits",
                code="invalid_json",
            ) from exc
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise _too_deep("request body") from exc
    # A lone surrogate needs a \ud8xx-\udfxx escape.  A non-ASCII body parsed by the Latin-1 scan
    # (layout.text None) holds no \u escape at all (daemon/http/rawbody.py); any other body is
    # searched once (docs/operations.md §13.6)
    # (a UTF-16/32 body, which has a NUL among its first four bytes, holds its escapes as UTF-16/32
    # text the byte search cannot see: its value is checked instead; before session 32 a lone
    # surrogate in one passed, and the prompt-size estimate failed with a 500)
    if ((layout is None or layout.text is not None or raw.isascii()) and _SURROGATE_ESCAPE.search(raw) is not None) or (
        layout is None and b"\x00" in raw[:4]
    ):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ApiError(
                400, "request body contains a lone UTF-16 surrogate escape (not valid Unicode)", code="invalid_json"
            ) from exc
    if not isinstance(body, dict):
        raise ApiError(
            400,
            f"request body must be a JSON object, got {type(body).__name__}",
            code="invalid_json",
        )
    return body, layout


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    # finite: a JSON NaN or Infinity literal (Python's parser takes them) is no sampling value, nor
    # an integer too large for a float, as 1e400 is not (docs/operations.md §14; math.isfinite
    # raised OverflowError on a 400-digit temperature, a 500 before session 43)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _is_str_or_strs(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(x, str) for x in value))


_TOOL_CHOICES = ("none", "auto", "required")

# field -> (check, rule) of the OpenAI fields agentd forwards without reading (null = absent);
# the ranges are those both OpenAI and vLLM enforce, so nothing a worker takes is refused here
_SAMPLING_RULES: dict[str, tuple[Any, str]] = {
    "temperature": (lambda v: _is_number(v) and v >= 0, "must be a finite number >= 0"),
    "top_p": (lambda v: _is_number(v) and 0 <= v <= 1, "must be a number within [0, 1]"),
    "presence_penalty": (lambda v: _is_number(v) and -2 <= v <= 2, "must be a number within [-2, 2]"),
    "frequency_penalty": (lambda v: _is_number(v) and -2 <= v <= 2, "must be a number within [-2, 2]"),
    "seed": (_is_int, "must be an integer"),
    "stop": (_is_str_or_strs, "must be a string or a list of strings"),
    "top_logprobs": (lambda v: _is_int(v) and v >= 0, "must be an integer >= 0"),
    "tool_choice": (
        lambda v: isinstance(v, dict) or v in _TOOL_CHOICES,
        'must be "none", "auto", "required" or an object naming a tool',
    ),
    "metadata": (lambda v: isinstance(v, dict), "must be an object"),
    "logit_bias": (lambda v: isinstance(v, dict), "must be an object"),
    "response_format": (lambda v: isinstance(v, dict), "must be an object"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "must be a boolean"),
    "logprobs": (lambda v: isinstance(v, bool), "must be a boolean"),
}
# the legacy completions API's logprobs is a count
_COMPLETIONS_LOGPROBS = (lambda v: _is_int(v) and v >= 0, "must be an integer >= 0")


def _validate_sampling(endpoint: str, body: Mapping[str, Any]) -> None:
    # walks the body's few keys, not the rules (about 1 us for a typical request on this machine)
    for name in body:
        found = _SAMPLING_RULES.get(name)
        if found is None:
            continue
        value = body[name]
        if value is None:
            continue
        check, rule = _COMPLETIONS_LOGPROBS if name == "logprobs" and endpoint == "completions" else found
        if not check(value):
            raise bad_field(name, rule, value)


def validate_body(endpoint: str, body: Mapping[str, Any]) -> None:
    """Raise :class:`ApiError` (400, ``param`` = field path) for the first invalid field."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_field("model", "must be a string", model)
    if endpoint in FORWARDED_KINDS:  # the rest is the worker's business (docs/operations.md §12.1)
        return
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_field("stream", "must be a boolean", stream)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad_field("stream_options", "must be an object", options)
        include = options.get("include_usage")
        if include is not None and not isinstance(include, bool):
            raise bad_field("stream_options.include_usage", "must be a boolean", include)
    for name in _TOKEN_LIMIT_FIELDS:
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise bad_field(name, "must be an integer >= 1", value)
        if value is not None and value > MAX_TOKEN_COUNT and name in _OUTPUT_CAP_FIELDS:
            raise bad_field(name, f"must be at most {MAX_TOKEN_COUNT}", value)
    xargs = body.get("vllm_xargs")
    if xargs is not None and not isinstance(xargs, dict):
        raise bad_field("vllm_xargs", "must be an object", xargs)
    if xargs and type(xargs.get("agentic_context")) is dict:
        _finite_context(xargs["agentic_context"])
    for name in ("user", "request_id"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise bad_field(name, "must be a string", value)
    _validate_sampling(endpoint, body)
    if endpoint == "chat":
        _validate_messages(body)
    elif endpoint == "completions":
        _validate_prompt(body)
    else:
        _validate_input(body)


def _finite_context(context: dict[str, Any]) -> None:
    """A ``NaN`` or ``Infinity`` (or a number too large for a float) anywhere in an object
    ``agentic_context`` is a 400 naming it (docs/operations.md §12): the context is forwarded as
    JSON text (``routing.agentic_context_forwarding = "json_string"``), which cannot hold one, and
    agentd reads its numbers.  Before session 32 one in a field agentd does not read became a 500
    at forwarding time, after the request had been admitted.  (Paths are made only for the error:
    a context of a few scalars costs well under a microsecond.)"""
    stack: list[Any] = [context]
    while stack:
        value = stack.pop()
        for item in value.values() if type(value) is dict else value:
            kind = type(item)
            if kind is float:
                if not math.isfinite(item):
                    path = _non_finite_path(context, "vllm_xargs.agentic_context")
                    raise ApiError(
                        400,
                        f"'{path}' must be a finite number, got {item}",
                        code="invalid_program_identity",
                        param=path,
                    )
            elif kind is dict or kind is list:
                stack.append(item)


def _non_finite_path(value: Any, path: str) -> str:
    """The path of the first non-finite number in ``value`` (one is there)."""
    items = value.items() if type(value) is dict else enumerate(value)
    for key, item in items:
        sub = f"{path}.{key}" if type(value) is dict else f"{path}[{key}]"
        if type(item) is float and not math.isfinite(item):
            return sub
        if type(item) in (dict, list):
            found = _non_finite_path(item, sub)
            if found:
                return found
    return ""


def _validate_messages(body: Mapping[str, Any]) -> None:
    if "messages" not in body:
        raise ApiError(400, "'messages' is required", code="missing_field", param="messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise bad_field("messages", "must be a list", messages)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_field(f"messages[{i}]", "must be an object", message)
        role = message.get("role")
        if not isinstance(role, str):
            raise bad_field(f"messages[{i}].role", "must be a string", role)
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_field(f"messages[{i}].content", "must be a string, a list or null", content)
        if isinstance(content, list):
            _objects_or_strings(content, f"messages[{i}].content")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            _list_of_objects(tool_calls, f"messages[{i}].tool_calls")
        function_call = message.get("function_call")
        if function_call is not None and not isinstance(function_call, dict):
            raise bad_field(f"messages[{i}].function_call", "must be an object or null", function_call)
    tools = body.get("tools")
    if tools is not None:
        _list_of_objects(tools, "tools")


def _list_of_objects(value: Any, param: str) -> None:
    if not isinstance(value, list):
        raise bad_field(param, "must be a list or null", value)
    for j, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad_field(f"{param}[{j}]", "must be an object", item)


def _objects_or_strings(value: list[Any], param: str) -> None:
    for j, item in enumerate(value):
        if not isinstance(item, dict | str):
            raise bad_field(f"{param}[{j}]", "must be an object or a string", item)


def _validate_prompt(body: Mapping[str, Any]) -> None:
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required", code="missing_field", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and all(
        isinstance(p, str) or _is_int(p) or (isinstance(p, list) and all(_is_int(t) for t in p)) for p in prompt
    ):
        return
    raise bad_field("prompt", "must be a string, a list of strings or a list of token ids", prompt)


def _validate_input(body: Mapping[str, Any]) -> None:
    if "input" not in body:
        raise ApiError(400, "'input' is required", code="missing_field", param="input")
    value = body["input"]
    if not isinstance(value, str | list):
        raise bad_field("input", "must be a string or a list", value)
    if isinstance(value, list):
        _objects_or_strings(value, "input")
        for j, item in enumerate(value):
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, list):
                _objects_or_strings(content, f"input[{j}].content")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_field("instructions", "must be a string", instructions)


def _content_text(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    parts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
    return parts


def _chat_lines(body: Mapping[str, Any]) -> tuple[str, list[str]]:
    """(routing_text, the lines of the estimation text) of a chat request."""
    messages = body.get("messages") or []
    system: list[str] = []
    first_user: str | None = None
    lines: list[str] = []
    for message in messages:
        role = message.get("role", "")
        texts = _content_text(message.get("content"))
        if role in ("system", "developer"):
            system.extend(texts)
        elif role == "user" and first_user is None:
            first_user = "\n".join(texts)
        lines.extend(f"{role}:{text}" for text in texts)
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                fn = call["function"]
                lines.append(f"assistant_tool_call:{fn.get('name', '')}:{fn.get('arguments', '')}")
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            lines.append(
                f"assistant_function_call:{function_call.get('name', '')}:{function_call.get('arguments', '')}"
            )
    tools = [t for t in body.get("tools") or () if isinstance(t, dict)]
    schemas = []
    for tool in tools:
        function = tool.get("function")
        spec: dict[str, Any] = function if isinstance(function, dict) else tool
        name = str(spec.get("name", ""))
        params = json.dumps(spec.get("parameters"), sort_keys=True)
        schemas.append((name, f"tool_schema:{name}:{spec.get('description', '')}:{params}"))
    lines.extend(text for _, text in sorted(schemas))
    routing = "\n".join([*system, first_user or ""]) if (system or first_user) else ""
    return routing, lines


def _chat_size(body: Mapping[str, Any]) -> tuple[str, int, int]:
    """(routing_text, UTF-8 size of the estimation text, its number of lines) of a chat request:
    what ``_lines_size(_chat_lines(body)[1])`` gives, without building a line per text (a large
    body's texts are not copied again; docs/benchmarks.md §10.2).  A plain string content, the
    common case, takes no list and no call per message."""
    messages = body.get("messages") or []
    system: list[str] = []
    first_user: str | None = None
    size = 0
    count = 0
    for message in messages:
        role = message.get("role", "")
        content = message.get("content")
        if type(content) is str and type(role) is str:
            if role in ("system", "developer"):
                system.append(content)
            elif role == "user" and first_user is None:
                first_user = content
            # "role:" + text
            size += _utf8_size(role) + 1
            size += len(content) if content.isascii() else len(content.encode("utf-8"))
            count += 1
        else:
            texts = _content_text(content)
            if role in ("system", "developer"):
                system.extend(texts)
            elif role == "user" and first_user is None:
                first_user = "\n".join(texts)
            if texts:
                role_size = _utf8_size(role if isinstance(role, str) else f"{role}") + 1  # "role:"
                size += role_size * len(texts) + sum(map(_utf8_size, texts))
                count += len(texts)
        calls = message.get("tool_calls")
        if calls:
            for call in calls:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    fn = call["function"]
                    size += _utf8_size(f"assistant_tool_call:{fn.get('name', '')}:") + _utf8_size(
                        _as_text(fn.get("arguments", ""))
                    )
                    count += 1
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            size += _utf8_size(
                f"assistant_function_call:{function_call.get('name', '')}:{function_call.get('arguments', '')}"
            )
            count += 1
    for tool in body.get("tools") or ():
        if isinstance(tool, dict):
            function = tool.get("function")
            spec: dict[str, Any] = function if isinstance(function, dict) else tool
            name = str(spec.get("name", ""))
            params = json.dumps(spec.get("parameters"), sort_keys=True)
            size += _utf8_size(f"tool_schema:{name}:{spec.get('description', '')}:{params}")
            count += 1
    routing = "\n".join([*system, first_user or ""]) if (system or first_user) else ""
    return routing, size + count - 1, count


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else f"{value}"


def chat_texts(body: Mapping[str, Any]) -> tuple[str, str]:
    """(routing_text, estimation_text) of a chat request."""
    routing, lines = _chat_lines(body)
    return routing, "\n".join(lines) or routing


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _lines_size(lines: list[str]) -> int:
    """``len("\\n".join(lines).encode())`` without building the joined text (large bodies)."""
    return sum(map(_utf8_size, lines)) + len(lines) - 1


def completions_text(body: Mapping[str, Any]) -> tuple[str, int | None]:
    """(text, token count when the prompt is given as token ids)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list):
        if prompt and all(_is_int(t) for t in prompt):
            return json.dumps(prompt), len(prompt)
        texts = [p if isinstance(p, str) else json.dumps(p) for p in prompt]
        if prompt and all(isinstance(p, list) for p in prompt):
            return "\n".join(texts), sum(len(p) for p in prompt)
        return "\n".join(texts), None
    return "", None


def responses_texts(body: Mapping[str, Any]) -> tuple[str, str]:
    instructions = body.get("instructions") or ""
    value = body.get("input")
    items: list[str] = []
    if isinstance(value, str):
        items.append(f"user:{value}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                items.append(f"user:{item}")
            elif isinstance(item, dict):
                role = item.get("role", item.get("type", ""))
                items.extend(f"{role}:{text}" for text in _content_text(item.get("content")))
    first = items[0].split(":", 1)[1] if items else ""
    routing = "\n".join(x for x in (instructions, first) if x)
    lines = ([f"system:{instructions}"] if instructions else []) + items
    return routing, "\n".join(lines) or routing


@attrs.frozen
class PromptSize:
    """How large a request's prompt is: its text in UTF-8 bytes, and its exact token count when
    the client sent token ids (``None`` otherwise)."""

    text_bytes: int
    exact_tokens: int | None = None


def _size(text: str, exact_tokens: int | None = None) -> PromptSize:
    return PromptSize(text_bytes=len(text.encode("utf-8")), exact_tokens=exact_tokens)


def request_texts(endpoint: str, body: Mapping[str, Any]) -> tuple[str, PromptSize]:
    """(routing_text, prompt size) of a validated body."""
    if endpoint == "chat":
        routing, size, count = _chat_size(body)
        if not count:  # no line of text at all: the estimate falls back to the routing text
            return routing, _size(routing)
        return routing, PromptSize(text_bytes=size)
    if endpoint == "completions":
        text, token_count = completions_text(body)
        return text, _size(text, token_count)
    if endpoint in FORWARDED_KINDS:
        text = forwarded_text(body)
        return text, _size(text)
    routing, text = responses_texts(body)
    return routing, _size(text)


# the members that hold a forwarded route's input, first found wins (embeddings and pooling:
# ``input`` or ``messages``; score: ``text_1``/``queries``; rerank: ``query``; tokenize:
# ``prompt`` or ``messages``; detokenize: ``tokens``)
_FORWARDED_INPUTS = ("input", "messages", "prompt", "text_1", "queries", "query", "tokens", "data")
_FORWARDED_TEXT_CHARS = 4096


def forwarded_text(body: Mapping[str, Any]) -> str:
    """The routing text of a forwarded route (docs/operations.md §12.1): the first input member as
    compact JSON, at most 4,096 characters (the consistent-hash key and the size estimate)."""
    for name in _FORWARDED_INPUTS:
        value = body.get(name)
        if value is not None:
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            return text[:_FORWARDED_TEXT_CHARS]
    return ""
