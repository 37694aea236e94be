"""Program identity parsing at the edge (docs/program-scheduling.md §0; the seed's "Canonical request metadata")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from daemon.http.identity import (
    IdentityError,
    ParsedIdentity,
    ProgramIdentity,
    RequestHints,
    parse_identity,
    strip_agentic_context,
)

AUTO = "auto"
CTX = "vllm_xargs.agentic_context"


def ctx_body(**fields: Any) -> dict[str, Any]:
    return {"vllm_xargs": {"agentic_context": fields}}


def parse(body: dict[str, Any], headers: dict[str, str] | None = None, enable_key: str = CTX) -> ParsedIdentity:
    parsed = parse_identity(body, headers or {}, enable_key)
    assert parsed is not None
    return parsed


def identity(body: dict[str, Any], headers: dict[str, str] | None = None, enable_key: str = CTX) -> ProgramIdentity:
    return parse(body, headers, enable_key).identity


def error(body: dict[str, Any], headers: dict[str, str] | None = None, enable_key: str = AUTO) -> IdentityError:
    with pytest.raises(IdentityError) as info:
        parse_identity(body, headers or {}, enable_key)
    return info.value


# --------------------------------------------------------------------------- canonical context


def test_identity_seed_canonical_example_keeps_every_field() -> None:
    body = ctx_body(
        program_id="task-a:researcher", task_id="task-a", session_id="session-a", agent_id="researcher",
        parent_program_id="task-a:lead", root_program_id="task-a:lead", blocks_parent=False,
        expected_resume=True, agent_role="subagent", spawn_reason="research", request_id="request-a",
        step_id=7, priority=10, deadline_seconds=30, expected_output_length=2048, kv_retention_ttl_seconds=5,
    )  # fmt: skip
    parsed = parse(body)
    assert parsed.identity == ProgramIdentity(
        program_id="task-a:researcher", task_id="task-a", session_id="session-a", agent_id="researcher",
        parent_program_id="task-a:lead", root_program_id="task-a:lead", blocks_parent=False,
        expected_resume=True, agent_role="subagent", spawn_reason="research", step_id=7,
        source="agentic_context", placement_key="task-a", placement_hash_key="session:session-a",
    )  # fmt: skip
    assert parsed.hints == RequestHints(
        request_id="request-a", priority=10, deadline_seconds=30.0, expected_output_length=2048,
        kv_retention_ttl_seconds=5.0,
    )  # fmt: skip
    assert isinstance(parsed.hints.deadline_seconds, float)


def test_identity_explicit_program_id_not_resumable() -> None:
    ident = identity(ctx_body(program_id="prog-1", expected_resume=False))
    assert ident.program_id == "prog-1"
    assert ident.expected_resume is False
    assert ident.task_id is None and ident.agent_id is None and ident.agent_role is None
    assert ident.placement_key == "prog-1"
    assert ident.placement_hash_key == "program:prog-1"


def test_identity_context_as_json_string_is_accepted() -> None:
    text = json.dumps({"task_id": "t", "agent_id": "lead", "priority": 3})
    parsed = parse({"vllm_xargs": {"agentic_context": text}})
    assert parsed.identity.program_id == "t:lead"
    assert parsed.hints.priority == 3


def test_identity_task_and_agent_infer_blocking_subagent() -> None:
    ident = identity(ctx_body(task_id="task-b", agent_id="researcher"))
    assert (ident.program_id, ident.placement_key, ident.agent_role) == ("task-b:researcher", "task-b", "subagent")
    assert ident.parent_program_id == "task-b:lead"
    assert ident.blocks_parent is True
    assert ident.expected_resume is False


def test_identity_explicit_expected_resume_overrides_subagent_default() -> None:
    ident = identity(ctx_body(task_id="task-b", agent_id="researcher", expected_resume=True))
    assert ident.blocks_parent is True and ident.expected_resume is True


def test_identity_full_contract_with_aliases_and_derived_parent() -> None:
    body = ctx_body(
        program_id="workflow:child", task_id="workflow", agent_id="child", parent_agent_id="lead",
        root_id="workflow:root", step_id=7, priority=9, deadline=12.5, expected_output_tokens=2048,
        kv_retention_ttl=4.5, subagent_type="explore",
    )  # fmt: skip
    parsed = parse(body)
    assert parsed.identity.parent_program_id == "workflow:lead"
    assert parsed.identity.root_program_id == "workflow:root"
    assert parsed.identity.step_id == 7
    assert parsed.identity.spawn_reason == "explore"
    assert parsed.hints == RequestHints(None, 9, 12.5, 2048, 4.5)


def test_identity_session_only_becomes_task_and_lead() -> None:
    ident = identity(ctx_body(session_id="s1"))
    assert (ident.program_id, ident.task_id, ident.agent_id, ident.agent_role) == ("s1:lead", "s1", "lead", "lead")
    assert ident.parent_program_id is None and ident.blocks_parent is False and ident.expected_resume is True


def test_identity_agent_id_with_task_prefix_is_normalised() -> None:
    ident = identity(ctx_body(task_id="t", agent_id="t:worker"))
    assert ident.agent_id == "worker" and ident.program_id == "t:worker"


def test_identity_explicit_null_task_id_means_no_task() -> None:
    ident = identity(ctx_body(program_id="p", task_id=None, session_id="s"))
    assert ident.task_id is None
    assert ident.agent_id is None
    assert ident.placement_key == "s"
    # Without the explicit null the task defaults to the session.
    assert identity(ctx_body(program_id="p", session_id="s")).task_id == "s"


def test_identity_integer_ids_are_rendered_as_decimal() -> None:
    ident = identity(ctx_body(task_id=42, agent_id=7))
    assert ident.program_id == "42:7"


def test_identity_null_fields_count_as_absent_and_strings_are_trimmed() -> None:
    ident = identity(ctx_body(program_id=None, task_id="  t  ", agent_id=None, priority=None))
    assert ident.program_id == "t:lead"


def test_identity_context_without_program_id_is_identity_free() -> None:
    assert parse_identity(ctx_body(priority=5, spawn_reason="x"), {}, CTX) is None
    assert parse_identity(ctx_body(), {}, AUTO) is None


def test_identity_absent_or_null_context_is_identity_free() -> None:
    assert parse_identity({}, {}, CTX) is None
    assert parse_identity({"vllm_xargs": None}, {}, CTX) is None
    assert parse_identity({"vllm_xargs": {"agentic_context": None, "other": 1}}, {}, CTX) is None


def test_identity_parent_agent_from_claude_header_in_canonical_mode() -> None:
    headers = {
        "x-claude-code-session-id": "sess",
        "x-claude-code-agent-id": "worker",
        "x-claude-code-parent-agent-id": "planner",
    }
    ident = identity(ctx_body(priority=1), headers)
    assert ident.program_id == "sess:worker"
    assert ident.parent_program_id == "sess:planner"
    assert ident.source == "agentic_context"


def test_identity_body_fields_win_over_header_fallbacks() -> None:
    headers = {"x-claude-code-session-id": "hs", "x-claude-code-agent-id": "ha"}
    ident = identity(ctx_body(session_id="bs", agent_id="ba"), headers)
    assert ident.program_id == "bs:ba"
    assert ident.placement_hash_key == "header:x-claude-code-session-id:hs"


def test_identity_explicit_parent_without_blocking_is_allowed() -> None:
    ident = identity(ctx_body(program_id="p", parent_program_id="q", blocks_parent=False))
    assert ident.parent_program_id == "q" and ident.blocks_parent is False and ident.expected_resume is True


def test_identity_lead_with_explicit_blocks_parent_and_parent() -> None:
    ident = identity(ctx_body(program_id="p", parent_id="q", blocking_parent=True))
    assert ident.blocks_parent is True
    # Role is not subagent, so expected_resume keeps its default true.
    assert ident.expected_resume is True


# --------------------------------------------------------------------------- agent_hint


def test_identity_agent_hint_blocking_child() -> None:
    ident = identity({"agent_hint": {"session_id": "child-1", "parent_session_id": "parent-1"}}, enable_key=AUTO)
    assert ident.program_id == "child-1" and ident.placement_key == "child-1" and ident.session_id == "child-1"
    assert ident.parent_program_id == "parent-1"
    assert ident.task_id is None and ident.agent_id is None and ident.agent_role is None
    assert ident.blocks_parent is True and ident.expected_resume is False
    assert ident.source == "agent_hint"


def test_identity_agent_hint_non_blocking_defaults_to_resumable() -> None:
    ident = identity({"agent_hint": {"session_id": "s", "blocks_parent": False}}, enable_key=AUTO)
    assert ident.blocks_parent is False and ident.expected_resume is True and ident.parent_program_id is None


def test_identity_agent_hint_explicit_expected_resume_overrides() -> None:
    body = {"agent_hint": {"session_id": "c", "parent_session_id": "p", "expected_resume": True}}
    assert identity(body, enable_key=AUTO).expected_resume is True


def test_identity_agent_hint_ignored_with_default_enable_key() -> None:
    assert parse_identity({"agent_hint": {"session_id": "c", "parent_session_id": "p"}}, {}, CTX) is None


def test_identity_canonical_context_wins_over_agent_hint_and_headers() -> None:
    body = {**ctx_body(program_id="canon"), "agent_hint": {"session_id": "hint", "blocks_parent": False}}
    ident = identity(body, {"x-session-id": "hdr"}, AUTO)
    assert ident.program_id == "canon" and ident.source == "agentic_context"


def test_identity_agent_hint_wins_over_headers() -> None:
    body = {"agent_hint": {"session_id": "hint", "blocks_parent": False}}
    ident = identity(body, {"x-claude-code-session-id": "hdr"}, AUTO)
    assert ident.program_id == "hint"
    assert ident.placement_hash_key == "header:x-claude-code-session-id:hdr"


# --------------------------------------------------------------------------- headers


def test_identity_codex_headers() -> None:
    ident = identity({}, {"session-id": "session-a", "thread-id": "worker"}, AUTO)
    assert ident.program_id == "session-a:worker"
    assert ident.parent_program_id == "session-a:lead"
    assert ident.expected_resume is False and ident.blocks_parent is True
    assert ident.placement_hash_key == "header:session-id:session-a"
    assert ident.source == "codex"


def test_identity_claude_headers() -> None:
    ident = identity({}, {"x-claude-code-session-id": "session-c", "x-claude-code-agent-id": "researcher"}, AUTO)
    assert (ident.program_id, ident.placement_key, ident.parent_program_id) == (
        "session-c:researcher", "session-c", "session-c:lead",
    )  # fmt: skip
    assert ident.source == "claude_code"


def test_identity_claude_parent_header() -> None:
    headers = {"x-claude-code-session-id": "s", "x-claude-code-agent-id": "w", "x-claude-code-parent-agent-id": "p"}
    assert identity({}, headers, AUTO).parent_program_id == "s:p"


def test_identity_generic_session_header_is_resumable_lead() -> None:
    ident = identity({}, {"x-session-id": "session-d"}, AUTO)
    assert ident.program_id == "session-d:lead"
    assert ident.expected_resume is True and ident.blocks_parent is False and ident.parent_program_id is None
    assert ident.placement_hash_key == "header:x-session-id:session-d"
    assert ident.source == "x_session_id"


def test_identity_header_schemas_are_not_mixed() -> None:
    # Codex session wins over x-session-id; a Claude agent header without its session is ignored.
    headers = {"session-id": "codex-s", "x-claude-code-agent-id": "claude-agent", "x-session-id": "gen"}
    ident = identity({}, headers, AUTO)
    assert ident.program_id == "codex-s:lead" and ident.source == "codex"


def test_identity_blank_session_header_falls_to_next_schema() -> None:
    ident = identity({}, {"x-claude-code-session-id": "   ", "x-session-id": "g"}, AUTO)
    assert ident.program_id == "g:lead"


def test_identity_default_enable_key_ignores_headers() -> None:
    headers = {"x-claude-code-session-id": "session-c", "x-claude-code-agent-id": "researcher"}
    assert parse_identity({}, headers, CTX) is None
    assert parse_identity({}, headers, AUTO) is not None


def test_identity_trace_ids_and_session_params_never_create_identity() -> None:
    headers = {"x-request-id": "r", "x-trace-id": "t", "x-user-id": "u"}
    body = {"session_params": {"session_id": "s"}, "user": "u", "session_id": "s2"}
    assert parse_identity(body, headers, AUTO) is None


# --------------------------------------------------------------------------- placement hash key


def test_placement_hash_key_generic_headers_then_body_fields() -> None:
    body = ctx_body(program_id="p")
    assert identity(body, {"x-tenant-id": "ten", "x-trace-id": "tr"}).placement_hash_key == "header:x-tenant-id:ten"
    assert identity({**body, "session_params": {"session_id": "sp"}}).placement_hash_key == "session:sp"
    assert identity({**body, "user": "alice", "user_id": "bob"}).placement_hash_key == "user:alice"
    assert identity({**body, "user_id": "bob"}).placement_hash_key == "user:bob"


def test_placement_hash_key_over_512_bytes_is_rejected() -> None:
    err = error(ctx_body(program_id="p"), {"x-user-id": "u" * 520}, CTX)
    assert err.param == "headers.x-user-id"
    assert "exceeds 512 bytes" in err.message


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("body", "headers", "param", "fragment"),
    [
        ({"vllm_xargs": "x"}, {}, "vllm_xargs", "must be an object"),
        ({"vllm_xargs": {"agentic_context": "{not json"}}, {}, CTX, "bounded JSON object"),
        ({"vllm_xargs": {"agentic_context": "[1, 2]"}}, {}, CTX, "must be an object"),
        ({"vllm_xargs": {"agentic_context": 5}}, {}, CTX, "must be an object"),
        (ctx_body(task_id=[]), {}, f"{CTX}.task_id", "string-compatible identifier"),
        (ctx_body(task_id=True), {}, f"{CTX}.task_id", "string-compatible identifier"),
        (ctx_body(program_id=1.5), {}, f"{CTX}.program_id", "string-compatible identifier"),
        (ctx_body(program_id="  "), {}, f"{CTX}.program_id", "must not be empty"),
        (ctx_body(task_id="t", agent_id="t:"), {}, f"{CTX}.agent_id", "must include an agent component"),
        (ctx_body(program_id="p", blocks_parent="yes"), {}, f"{CTX}.blocks_parent", "must be a boolean"),
        (ctx_body(program_id="p", blocking_parent=1), {}, f"{CTX}.blocking_parent", "must be a boolean"),
        (ctx_body(program_id="p", expected_resume=0), {}, f"{CTX}.expected_resume", "must be a boolean"),
        (ctx_body(program_id="p", step_id=-1), {}, f"{CTX}.step_id", "non-negative integer"),
        (ctx_body(program_id="p", step_id=1.0), {}, f"{CTX}.step_id", "non-negative integer"),
        (ctx_body(program_id="p", step_id=2**64), {}, f"{CTX}.step_id", "too large"),
        (ctx_body(program_id="p", priority="high"), {}, f"{CTX}.priority", "must be an integer"),
        (ctx_body(program_id="p", priority=2**63), {}, f"{CTX}.priority", "too large"),
        (ctx_body(program_id="p", priority=False), {}, f"{CTX}.priority", "must be an integer"),
        (ctx_body(program_id="p", deadline_seconds="10"), {}, f"{CTX}.deadline_seconds", "seconds as a number"),
        (ctx_body(program_id="p", deadline=-1), {}, f"{CTX}.deadline", "finite and non-negative"),
        (
            ctx_body(program_id="p", kv_retention_ttl_seconds=float("inf")),
            {},
            f"{CTX}.kv_retention_ttl_seconds",
            "finite",
        ),
        (ctx_body(program_id="p", kv_retention_ttl=float("nan")), {}, f"{CTX}.kv_retention_ttl", "finite"),
        (ctx_body(program_id="p", expected_output_length=-5), {}, f"{CTX}.expected_output_length", "non-negative"),
        (ctx_body(program_id="p", request_id={}), {}, f"{CTX}.request_id", "string-compatible"),
        (ctx_body(program_id="p", parent_program_id="p"), {}, f"{CTX}.parent_program_id", "must differ"),
        (ctx_body(program_id="p", blocks_parent=True), {}, f"{CTX}.blocks_parent", "requires parent_program_id"),
        # Hints are validated even when the context carries no Program id (never silently dropped).
        (ctx_body(priority="x"), {}, f"{CTX}.priority", "must be an integer"),
        ({"agent_hint": "s"}, {}, "agent_hint", "must be an object"),
        ({"agent_hint": {"parent_session_id": "p"}}, {}, "agent_hint.session_id", "is required"),
        ({"agent_hint": {"session_id": "c"}}, {}, "agent_hint.parent_session_id", "requires parent_session_id"),
        ({"agent_hint": {"session_id": "c", "blocks_parent": True}}, {}, "agent_hint.parent_session_id", "requires"),
        ({"agent_hint": {"session_id": "c", "parent_session_id": "c"}}, {}, "agent_hint.parent_session_id", "differ"),
        ({"agent_hint": {"session_id": "c", "blocks_parent": "no"}}, {}, "agent_hint.blocks_parent", "boolean"),
        ({}, {"x-session-id": "caf\u00e9"}, "headers.x-session-id", "Invalid x-session-id header"),
        ({}, {"session-id": "s", "thread-id": "a\nb"}, "headers.thread-id", "Invalid thread-id header"),
        ({}, {"session-id": "s", "thread-id": "s:"}, "headers.thread-id", "must include an agent component"),
    ],
)
def test_identity_invalid_metadata_names_the_field(
    body: dict[str, Any], headers: dict[str, str], param: str, fragment: str
) -> None:
    err = error(body, headers)
    assert err.param == param
    assert fragment in err.message
    assert param in str(err)


def test_identity_error_message_includes_the_value() -> None:
    err = error(ctx_body(program_id="p", priority="high"))
    assert '"high"' in err.message


def test_identity_malformed_vllm_xargs_rejected_even_in_default_mode() -> None:
    assert error({"vllm_xargs": [1]}, enable_key=CTX).param == "vllm_xargs"


def test_identity_context_string_size_limit_counts_bytes() -> None:
    text = json.dumps({"program_id": "p"})
    text = text + " " * (16384 - len(text.encode()))  # whitespace padding keeps it valid JSON
    assert len(text.encode()) == 16384
    assert identity({"vllm_xargs": {"agentic_context": text}}).program_id == "p"
    err = error({"vllm_xargs": {"agentic_context": text + " "}}, enable_key=CTX)
    assert err.param == CTX and "16385 bytes" in err.message
    # 8190 two-byte characters: fewer than 16384 characters but more than 16384 bytes.
    wide = json.dumps({"program_id": "p", "spawn_reason": "\u00e9" * 8190}, ensure_ascii=False)
    assert len(wide) < 16384 < len(wide.encode())
    assert "bytes" in error({"vllm_xargs": {"agentic_context": wide}}, enable_key=CTX).message


def test_identity_invalid_header_ignored_in_default_mode_without_context() -> None:
    assert parse_identity({}, {"x-session-id": "caf\u00e9"}, CTX) is None


def test_identity_unknown_enable_key_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="enable_key"):
        parse_identity({}, {}, "headers")


# --------------------------------------------------------------------------- length bounds


@pytest.mark.parametrize(
    "field",
    [
        "program_id",
        "task_id",
        "session_id",
        "agent_id",
        "parent_program_id",
        "root_program_id",
        "agent_role",
        "spawn_reason",
        "request_id",
    ],
)
def test_identity_component_over_256_bytes_is_rejected(field: str) -> None:
    fields = {
        "program_id": "p",
        "task_id": "t",
        "agent_id": "a",
        "session_id": "s",
        "parent_program_id": "q",
        "blocks_parent": False,
    }
    parsed = parse(ctx_body(**dict(fields, **{field: "x" * 256})))
    value = parsed.hints.request_id if field == "request_id" else getattr(parsed.identity, field)
    assert value == "x" * 256
    err = error(ctx_body(**dict(fields, **{field: "x" * 257})), enable_key=CTX)
    assert err.param == f"{CTX}.{field}"
    assert err.message == f"{field} exceeds 256 bytes, got 257 bytes"


def test_identity_bounds_count_utf8_bytes() -> None:
    assert identity(ctx_body(program_id="\u00e9" * 128)).program_id == "\u00e9" * 128  # 256 bytes
    err = error(ctx_body(program_id="\u00e9" * 128 + "x"))  # 257 bytes, 129 chars
    assert err.param == f"{CTX}.program_id"
    assert "257 bytes" in err.message


def test_identity_derived_program_id_is_bounded() -> None:
    err = error(ctx_body(task_id="t" * 250, agent_id="worker"))  # 250 + 1 + 6 = 257 bytes
    assert err.param == f"{CTX}.agent_id"
    assert err.message.startswith("program_id exceeds 256 bytes")
    assert identity(ctx_body(task_id="t" * 249, agent_id="worker")).program_id == "t" * 249 + ":worker"


def test_identity_header_session_and_hint_parent_are_bounded() -> None:
    err = error({}, {"x-session-id": "s" * 257})
    assert err.param == "headers.x-session-id"
    err = error({}, {"x-session-id": "s" * 252})  # derived "sss…:lead" is 257 bytes
    assert err.param == "headers.x-session-id" and err.message.startswith("program_id exceeds")
    err = error({"agent_hint": {"session_id": "c", "parent_session_id": "p" * 257}})
    assert err.param == "agent_hint.parent_session_id"


# --------------------------------------------------------------------------- forwarding


def test_strip_agentic_context_removes_context_and_empty_xargs() -> None:
    body = {"model": "m", "vllm_xargs": {"agentic_context": {"program_id": "p"}}}
    out = strip_agentic_context(body, "strip")
    assert out == {"model": "m"}
    assert body == {"model": "m", "vllm_xargs": {"agentic_context": {"program_id": "p"}}}


def test_strip_agentic_context_keeps_other_xargs() -> None:
    body = {"vllm_xargs": {"agentic_context": {"program_id": "p"}, "other": 1}}
    assert strip_agentic_context(body, "strip") == {"vllm_xargs": {"other": 1}}
    assert "agentic_context" in body["vllm_xargs"]


def test_strip_agentic_context_json_string_is_compact() -> None:
    body = {"vllm_xargs": {"agentic_context": {"program_id": "p", "priority": 2}}}
    out = strip_agentic_context(body, "json_string")
    assert out["vllm_xargs"]["agentic_context"] == '{"program_id":"p","priority":2}'
    assert isinstance(body["vllm_xargs"]["agentic_context"], dict)
    # An already-encoded string is forwarded as is.
    encoded = {"vllm_xargs": {"agentic_context": '{"program_id": "p"}'}}
    assert strip_agentic_context(encoded, "json_string") == encoded


def test_strip_agentic_context_unchanged_returns_equal_copy() -> None:
    body = {"vllm_xargs": {"agentic_context": {"program_id": "p"}}}
    out = strip_agentic_context(body, "unchanged")
    assert out == body and out is not body


def test_strip_agentic_context_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        strip_agentic_context({}, "drop")


def test_identity_of_a_repeated_context_is_remembered_by_content_and_type() -> None:
    """An agent sends the same context with every turn: the second parse returns the first one's
    (frozen) value; a value of another type, a header or a body member the identity reads gives
    its own parse (docs/benchmarks.md §10.2.5)."""
    from daemon.http import identity

    identity._MEMO.clear()
    body = ctx_body(session_id="memo-s", agent_id="lead", step_id=1, expected_resume=True)
    first = parse(body)
    assert parse(dict(body)) is first  # equal content: the remembered value
    assert len(identity._MEMO) == 1
    # True == 1 and hash(True) == hash(1): the type keeps them apart (step_id=true is invalid)
    with pytest.raises(IdentityError, match="step_id"):
        parse(ctx_body(session_id="memo-s", agent_id="lead", step_id=True, expected_resume=True))
    assert len(identity._MEMO) == 1  # errors are never remembered
    with pytest.raises(IdentityError, match="step_id"):
        parse(ctx_body(session_id="memo-s", agent_id="lead", step_id=True, expected_resume=True))
    # what else the identity reads: a hash-key header and the body's user
    by_header = parse(body, {"x-user-id": "u7"})
    assert by_header.identity.placement_hash_key != first.identity.placement_hash_key
    assert (
        by_header.identity.placement_hash_key
        == parse_identity(body, {"x-user-id": "u7"}, CTX).identity.placement_hash_key
    )  # type: ignore[union-attr]
    with_user = {**body, "user": "alice"}
    assert parse(with_user) == parse_identity({**with_user}, {}, CTX)
    # a nested value is not a memo key: parsed every time, same result
    nested = ctx_body(session_id="memo-n", agent_id="lead", extra={"k": 1})
    assert parse(nested) == parse(nested)
    assert parse(nested) is not parse(nested)
    # the memo is bounded
    identity._MEMO.clear()
    for i in range(identity.MEMO_SIZE + 5):
        parse(ctx_body(session_id=f"bound-{i}"))
    assert len(identity._MEMO) <= identity.MEMO_SIZE
