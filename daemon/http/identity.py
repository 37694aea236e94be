"""Program identity parsing at the edge: request body and headers -> ``ParsedIdentity``.

A request takes part in Program scheduling only when it carries Program identity. The
sources, in strict precedence (the seed's "Canonical request metadata" and "Compatibility identity
inputs"; docs/program-scheduling.md §0):

1. the canonical ``vllm_xargs.agentic_context`` (an object, or a string holding a JSON
   object of at most 16 KiB). It is parsed first in every mode, so malformed canonical
   metadata is a 400 even with the default enable key;
2. with ``enable_key == "auto"`` only: ``agent_hint`` (a body object);
3. with ``enable_key == "auto"`` only: exactly one framework header schema, the first
   whose session header is non-empty: Claude Code (``x-claude-code-*``), Codex/OpenCode
   (``session-id``/``thread-id``), generic ``x-session-id``. Schemas are never mixed.

Inside the canonical derivation the framework headers are fallbacks for the session id,
agent id and parent agent id. Request/trace ids never create identity.

Derivation rules (canonical): ``task_id`` defaults to ``session_id`` unless an explicit
``program_id`` comes with an explicit ``task_id: null``; ``agent_id`` defaults to
``"lead"`` when a task exists and loses a ``"<task_id>:"`` prefix; ``program_id`` is
explicit or ``"<task_id>:<agent_id>"``; without a program id the request is identity-free
(``None``). Subagents derive their parent from ``parent_agent_id`` or ``"lead"``, block
the parent by default and are then not expected to resume; an explicit
``expected_resume`` always wins.

Every retained string is bounded to 256 UTF-8 bytes (derived ids included) and the
placement hash key to 512 bytes. Bad metadata raises ``IdentityError(param, message)``:
``param`` is the dotted path of the offending field (``vllm_xargs.agentic_context.priority``,
``agent_hint.session_id``, ``headers.x-session-id``), the message states rule and value.

Request-scoped hints (request_id, priority, deadline_seconds, expected_output_length,
kv_retention_ttl_seconds) are returned separately as the core's ``RequestHints``: they bind to
exactly one RequestPool entry, never to the Program. ``step_id`` is returned raw; the
"omitted means previous + 1" rule needs Program state and is applied by the scheduler.

Deviations from the reference router, on purpose:
- every canonical field is type-checked before deciding that a context without any
  Program id is identity-free, so bad hints are never silently dropped;
- ``placement_hash_key`` uses a structured lookup instead of the reference's text scan
  of the serialized body: framework session header, generic session-like headers, then
  the parsed session id, ``session_params.session_id``, ``user``, ``user_id``, and finally
  ``program:<program_id>`` (stable per Program, instead of a hash of the first body).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import attrs

from actors.core.model import ProgramIdentity, RequestHints

__all__ = [
    "ENABLE_KEY_AGENTIC_CONTEXT",
    "ENABLE_KEY_AUTO",
    "FORWARDING_MODES",
    "MAX_AGENTIC_CONTEXT_BYTES",
    "MAX_IDENTITY_COMPONENT_BYTES",
    "MAX_PLACEMENT_HASH_KEY_BYTES",
    "IdentityError",
    "ParsedIdentity",
    "ProgramIdentity",
    "RequestHints",
    "parse_identity",
    "strip_agentic_context",
]

ENABLE_KEY_AGENTIC_CONTEXT = "vllm_xargs.agentic_context"
ENABLE_KEY_AUTO = "auto"
MAX_AGENTIC_CONTEXT_BYTES = 16 * 1024
MAX_IDENTITY_COMPONENT_BYTES = 256
MAX_PLACEMENT_HASH_KEY_BYTES = 512
FORWARDING_MODES = ("strip", "json_string", "unchanged")

_CTX = "vllm_xargs.agentic_context"
MAX_CONTEXT_DEPTH = 32  # nesting of an agentic_context given as a JSON string
_U64_MAX = 2**64 - 1
# A token count the core adds to float ledgers: above 2**53 a float cannot hold it exactly and a
# rank's ledger drifted for good (-103 tokens after one request with 2**62); u32 keeps every sum exact
# (docs/operations.md §14)
MAX_TOKEN_COUNT = 2**32 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_LEAD = "lead"

# (schema name recorded in ProgramIdentity.source, session header, agent header, parent header)
_HEADER_SCHEMAS: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("claude_code", "x-claude-code-session-id", "x-claude-code-agent-id", "x-claude-code-parent-agent-id"),
    ("codex", "session-id", "thread-id", None),
    ("x_session_id", "x-session-id", None, None),
)
# Generic session-like headers for the placement hash key only (never identity).
_HASH_KEY_HEADERS = ("x-session-id", "x-user-id", "x-tenant-id", "x-correlation-id", "x-request-id", "x-trace-id")


class IdentityError(ValueError):
    """Invalid Program metadata. ``param`` is the dotted path of the offending field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"invalid Program identity: {param}: {message}")
        self.param = param
        self.message = message


@attrs.frozen
class ParsedIdentity:
    """What the edge read from one request: the Program's identity and this request's hints."""

    identity: ProgramIdentity
    hints: RequestHints


# --------------------------------------------------------------------------- field readers


def _fmt(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Fields:
    """Typed readers over one JSON object; a present-but-null key counts as absent."""

    def __init__(self, obj: Mapping[str, Any], prefix: str) -> None:
        self.obj = obj
        self.prefix = prefix

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}"

    def _first(self, keys: tuple[str, ...]) -> tuple[str, Any] | None:
        for key in keys:
            value = self.obj.get(key)
            if value is not None:
                return key, value
        return None

    def string(self, *keys: str) -> tuple[str | None, str]:
        """Return (value, path); JSON integers are rendered as decimal identifiers."""
        found = self._first(keys)
        if found is None:
            return None, self.path(keys[0])
        key, value = found
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise IdentityError(self.path(key), f"{key} must be a string-compatible identifier, got {_fmt(value)}")
        text = value.strip() if isinstance(value, str) else str(value)
        if not text:
            raise IdentityError(self.path(key), f"{key} must not be empty, got {_fmt(value)}")
        return text, self.path(key)

    def boolean(self, *keys: str) -> bool | None:
        found = self._first(keys)
        if found is None:
            return None
        key, value = found
        if not isinstance(value, bool):
            raise IdentityError(self.path(key), f"{key} must be a boolean, got {_fmt(value)}")
        return value

    def integer(self, key: str, *, lo: int, hi: int, rule: str) -> int | None:
        found = self._first((key,))
        if found is None:
            return None
        _, value = found
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise IdentityError(self.path(key), f"{key} must be {rule}, got {_fmt(value)}")
        if value > hi:
            raise IdentityError(self.path(key), f"{key} is too large (maximum {hi}), got {value}")
        return value

    def unsigned(self, *keys: str, hi: int = _U64_MAX) -> int | None:
        found = self._first(keys)
        if found is None:
            return None
        return self.integer(found[0], lo=0, hi=hi, rule="a non-negative integer")

    def duration(self, *keys: str) -> float | None:
        found = self._first(keys)
        if found is None:
            return None
        key, value = found
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise IdentityError(self.path(key), f"{key} must be seconds as a number, got {_fmt(value)}")
        try:
            seconds = float(value)
        except OverflowError:  # an integer too large for a float, as 1e400 (a 500 before session 43)
            seconds = math.inf
        if not math.isfinite(seconds) or seconds < 0:
            raise IdentityError(self.path(key), f"{key} must be finite and non-negative, got {_fmt(value)}")
        return seconds


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A trimmed header value, None when absent or blank; only visible ASCII (and tab) allowed."""
    raw = headers.get(name)
    if raw is None:
        return None
    if any(not (ch == "\t" or " " <= ch <= "~") for ch in raw):
        raise IdentityError(f"headers.{name}", f"Invalid {name} header: must be visible ASCII, got {_fmt(raw)}")
    value = raw.strip()
    return value or None


def _scoped(scope: str | None, actor: str) -> str:
    """``scope:actor`` unless the actor is already scoped (or there is no scope)."""
    if scope is None or actor.startswith(f"{scope}:"):
        return actor
    return f"{scope}:{actor}"


def _normalise_actor(actor: str, scope: str | None, param: str, key: str) -> str:
    """Strip a ``"<scope>:"`` prefix from an actor id; an empty remainder is an error."""
    if scope is not None and actor.startswith(f"{scope}:"):
        actor = actor[len(scope) + 1 :]
        if not actor.strip():
            raise IdentityError(param, f"{key} must include an agent component, got {_fmt(scope + ':' + actor)}")
    return actor


def _related_id(program_id: str, agent_id: str | None, task_id: str | None, parent: str) -> str:
    """The id of a relative: swap a trailing ``:<agent_id>`` for ``:<parent>``, else scope it."""
    if agent_id is not None and program_id.endswith(f":{agent_id}"):
        return program_id[: len(program_id) - len(agent_id)] + parent
    return _scoped(task_id, parent)


# --------------------------------------------------------------------------- sources


@attrs.frozen
class _Draft:
    """An identity before the placement hash key and the length bounds; ``params`` maps
    each string field to the dotted path reported when that field is out of bounds."""

    fields: dict[str, Any]
    params: dict[str, str]
    hints: RequestHints


def _locate_context(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    xargs = body.get("vllm_xargs")
    if xargs is None:
        return None
    if not isinstance(xargs, Mapping):
        raise IdentityError("vllm_xargs", f"vllm_xargs must be an object, got {_fmt(xargs)}")
    ctx = xargs.get("agentic_context")
    if ctx is None:
        return None
    if isinstance(ctx, str):
        size = len(ctx.encode("utf-8"))
        if size > MAX_AGENTIC_CONTEXT_BYTES:
            raise IdentityError(
                _CTX,
                f"{_CTX} must contain a bounded JSON object (at most {MAX_AGENTIC_CONTEXT_BYTES} bytes), "
                f"got a string of {size} bytes",
            )
        try:
            ctx = json.loads(ctx)
        except (ValueError, RecursionError):
            raise IdentityError(
                _CTX, f"{_CTX} must contain a bounded JSON object, got unparsable JSON {_fmt(xargs['agentic_context'])}"
            ) from None
        if _too_deep(ctx):
            raise IdentityError(
                _CTX, f"{_CTX} must contain a bounded JSON object (at most {MAX_CONTEXT_DEPTH} levels deep)"
            )
        if "\\u" in xargs["agentic_context"]:  # an escape inside the string may decode to a lone surrogate
            try:
                json.dumps(ctx, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise IdentityError(_CTX, f"{_CTX} contains a lone UTF-16 surrogate escape (invalid Unicode)") from None
    if not isinstance(ctx, Mapping):
        raise IdentityError(_CTX, f"{_CTX} must be an object, got {_fmt(ctx)}")
    return ctx


def _too_deep(value: Any) -> bool:
    """Whether a parsed context string nests more than ``MAX_CONTEXT_DEPTH`` levels (iteratively)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_CONTEXT_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _header_fallbacks(headers: Mapping[str, str]) -> tuple[str, str, str | None, str | None, str | None] | None:
    """(schema, session header name, session, agent, parent) of the first matching schema."""
    for schema, session_name, agent_name, parent_name in _HEADER_SCHEMAS:
        session = _header(headers, session_name)
        if session is None:
            continue
        agent = _header(headers, agent_name) if agent_name else None
        parent = _header(headers, parent_name) if parent_name else None
        return schema, session_name, session, agent, parent
    return None


def _from_context(ctx: Mapping[str, Any], headers: Mapping[str, str]) -> _Draft | None:
    f = _Fields(ctx, _CTX)
    fallback = _header_fallbacks(headers)
    h_session = h_agent = h_parent = None
    h_params: dict[str, str] = {}
    if fallback is not None:
        schema, session_name, h_session, h_agent, h_parent = fallback
        agent_name, parent_name = next((s[2], s[3]) for s in _HEADER_SCHEMAS if s[0] == schema)
        h_params = {
            "session": f"headers.{session_name}",
            "agent": f"headers.{agent_name}",
            "parent": f"headers.{parent_name}",
        }

    params: dict[str, str] = {}
    explicit_program, params["program_id"] = f.string("program_id")
    session_id, params["session_id"] = f.string("session_id")
    if session_id is None and h_session is not None:
        session_id, params["session_id"] = h_session, h_params["session"]
    task_id, params["task_id"] = f.string("task_id")
    if task_id is None and not (explicit_program is not None and "task_id" in ctx):
        task_id, params["task_id"] = session_id, params["session_id"]

    agent_id, params["agent_id"] = f.string("agent_id")
    if agent_id is None and h_agent is not None:
        agent_id, params["agent_id"] = h_agent, h_params["agent"]
    if agent_id is None and task_id is not None:
        agent_id = _LEAD
    if agent_id is not None:
        agent_id = _normalise_actor(agent_id, task_id, params["agent_id"], "agent_id")

    agent_role, params["agent_role"] = f.string("agent_role")
    if agent_role is None and agent_id is not None:
        agent_role = _LEAD if agent_id == _LEAD else "subagent"

    program_id = explicit_program
    if program_id is None and task_id is not None and agent_id is not None:
        program_id = _scoped(task_id, agent_id)
        params["program_id"] = params["agent_id"] if agent_id != _LEAD else params["task_id"]

    parent, params["parent_program_id"] = f.string("parent_program_id", "parent_id")
    parent_agent, parent_agent_param = f.string("parent_agent_id")
    if parent_agent is None and h_parent is not None:
        parent_agent, parent_agent_param = h_parent, h_params["parent"]
    root, params["root_program_id"] = f.string("root_program_id", "root_id")
    blocks = f.boolean("blocks_parent", "blocking_parent")
    expected_resume = f.boolean("expected_resume")
    spawn_reason, params["spawn_reason"] = f.string("spawn_reason", "subagent_type", "agent_type")
    step_id = f.unsigned("step_id")
    hints = _hints_from(f)
    if program_id is None:
        return None  # canonical context without any Program id: identity-free (values checked above)

    if parent is None and parent_agent is not None:
        parent_agent = _normalise_actor(parent_agent, task_id, parent_agent_param, "parent_agent_id")
        parent, params["parent_program_id"] = (
            _related_id(program_id, agent_id, task_id, parent_agent),
            parent_agent_param,
        )
    elif parent is None and agent_role == "subagent":
        parent = _related_id(program_id, agent_id, task_id, _LEAD)
        params["parent_program_id"] = f.path("parent_program_id")
    blocks_parent = blocks if blocks is not None else agent_role == "subagent"
    if parent is not None and parent == program_id:
        raise IdentityError(
            params["parent_program_id"], f"parent_program_id must differ from program_id, both are {_fmt(parent)}"
        )
    if blocks_parent and parent is None:
        raise IdentityError(
            f.path("blocks_parent"), "blocks_parent requires parent_program_id, got blocks_parent=true and no parent"
        )
    if expected_resume is None:
        expected_resume = not (blocks_parent and agent_role == "subagent")
    fields = {
        "program_id": program_id, "task_id": task_id, "session_id": session_id, "agent_id": agent_id,
        "parent_program_id": parent, "root_program_id": root, "blocks_parent": blocks_parent,
        "expected_resume": expected_resume, "agent_role": agent_role, "spawn_reason": spawn_reason,
        "step_id": step_id, "source": "agentic_context",
        "placement_key": task_id if task_id is not None else session_id if session_id is not None else program_id,
    }  # fmt: skip
    return _Draft(fields, params, hints)


def _hints_from(f: _Fields) -> RequestHints:
    request_id, _ = f.string("request_id")
    priority = f.integer("priority", lo=_I64_MIN, hi=_I64_MAX, rule="an integer")
    return RequestHints(
        request_id=request_id,
        priority=0 if priority is None else priority,
        deadline_seconds=f.duration("deadline", "deadline_seconds"),
        expected_output_length=f.unsigned("expected_output_length", "expected_output_tokens", hi=MAX_TOKEN_COUNT),
        kv_retention_ttl_seconds=f.duration("kv_retention_ttl", "kv_retention_ttl_seconds"),
    )


def _from_agent_hint(hint: Any) -> _Draft:
    if not isinstance(hint, Mapping):
        raise IdentityError("agent_hint", f"agent_hint must be an object, got {_fmt(hint)}")
    f = _Fields(hint, "agent_hint")
    session_id, session_param = f.string("session_id")
    if session_id is None:
        raise IdentityError(f.path("session_id"), "agent_hint.session_id is required, got none")
    parent, parent_param = f.string("parent_session_id")
    blocks = f.boolean("blocks_parent")
    blocks_parent = True if blocks is None else blocks
    if blocks_parent and parent is None:
        raise IdentityError(parent_param, "blocking agent_hint requires parent_session_id, got none")
    if parent is not None and parent == session_id:
        raise IdentityError(parent_param, f"parent_session_id must differ from session_id, both are {_fmt(parent)}")
    expected_resume = f.boolean("expected_resume")
    fields = {
        "program_id": session_id, "task_id": None, "session_id": session_id, "agent_id": None,
        "parent_program_id": parent, "root_program_id": None, "blocks_parent": blocks_parent,
        "expected_resume": (not blocks_parent) if expected_resume is None else expected_resume,
        "agent_role": None, "spawn_reason": None, "step_id": None, "source": "agent_hint",
        "placement_key": session_id,
    }  # fmt: skip
    params = {"program_id": session_param, "session_id": session_param, "parent_program_id": parent_param}
    return _Draft(fields, params, RequestHints())


def _from_headers(headers: Mapping[str, str]) -> _Draft | None:
    fallback = _header_fallbacks(headers)
    if fallback is None:
        return None
    schema, session_name, session, actor, parent_actor = fallback
    _, _, agent_name, parent_name = next(s for s in _HEADER_SCHEMAS if s[0] == schema)
    session_param = f"headers.{session_name}"
    agent_param = f"headers.{agent_name}" if actor is not None else session_param
    if actor is not None:
        actor = _normalise_actor(actor, session, agent_param, "agent_id")
    agent_id = actor if actor is not None else _LEAD
    role = _LEAD if agent_id == _LEAD else "subagent"
    program_id = _scoped(session, agent_id)
    parent_param = f"headers.{parent_name}"
    if parent_actor is not None:
        parent: str | None = _scoped(session, _normalise_actor(parent_actor, session, parent_param, "parent_agent_id"))
    elif role == "subagent":
        parent, parent_param = _scoped(session, _LEAD), agent_param
    else:
        parent = None
    if parent is not None and parent == program_id:
        raise IdentityError(parent_param, f"parent_program_id must differ from program_id, both are {_fmt(parent)}")
    fields = {
        "program_id": program_id, "task_id": session, "session_id": session, "agent_id": agent_id,
        "parent_program_id": parent, "root_program_id": None, "blocks_parent": role == "subagent",
        "expected_resume": actor is None or actor == _LEAD, "agent_role": role, "spawn_reason": None,
        "step_id": None, "source": schema, "placement_key": session,
    }  # fmt: skip
    params = {
        "program_id": agent_param, "task_id": session_param, "session_id": session_param,
        "agent_id": agent_param, "parent_program_id": parent_param, "agent_role": agent_param,
    }  # fmt: skip
    return _Draft(fields, params, RequestHints())


# --------------------------------------------------------------------------- assembly


def _placement_hash_key(
    body: Mapping[str, Any], headers: Mapping[str, str], fields: Mapping[str, Any]
) -> tuple[str, str]:
    """(key, param): framework session header, generic headers, then structured body fields."""
    for name in ("x-claude-code-session-id", "session-id", "x-session-id") + _HASH_KEY_HEADERS[1:]:
        value = _header(headers, name)
        if value is not None:
            return f"header:{name}:{value}", f"headers.{name}"
    session_params = body.get("session_params")
    nested = session_params.get("session_id") if isinstance(session_params, Mapping) else None
    candidates: tuple[tuple[str, Any, str], ...] = (
        ("session", fields["session_id"], "session_id"),
        ("session", nested, "session_params.session_id"),
        ("user", body.get("user"), "user"),
        ("user", body.get("user_id"), "user_id"),
    )
    for kind, value, param in candidates:
        if isinstance(value, str) and value.strip():
            return f"{kind}:{value.strip()}", param
    return f"program:{fields['program_id']}", "program_id"


# placement_key is always one of task_id / session_id / program_id, so it is bounded by them.
_BOUNDED_FIELDS = (
    "program_id", "task_id", "session_id", "agent_id", "parent_program_id",
    "root_program_id", "agent_role", "spawn_reason",
)  # fmt: skip


def _check_bound(value: str, param: str, field: str, limit: int) -> None:
    size = len(value.encode("utf-8"))
    if size > limit:
        raise IdentityError(param, f"{field} exceeds {limit} bytes, got {size} bytes")


def _finish(draft: _Draft, body: Mapping[str, Any], headers: Mapping[str, str]) -> ParsedIdentity:
    fields, params = draft.fields, draft.params
    for field in _BOUNDED_FIELDS:
        value = fields[field]
        if value is not None:
            _check_bound(value, params.get(field, field), field, MAX_IDENTITY_COMPONENT_BYTES)
    if draft.hints.request_id is not None:
        _check_bound(draft.hints.request_id, f"{_CTX}.request_id", "request_id", MAX_IDENTITY_COMPONENT_BYTES)
    key, key_param = _placement_hash_key(body, headers, fields)
    _check_bound(key, key_param, "placement hash key", MAX_PLACEMENT_HASH_KEY_BYTES)
    return ParsedIdentity(ProgramIdentity(placement_hash_key=key, **fields), draft.hints)


# Parsed agentic contexts by content (an agent sends the same context with every turn of a
# Program): what ``_from_context`` and ``_finish`` read is the context's members, the headers named
# below and three body members, so equal values of those give an equal (frozen) result.  Only
# successes are kept (an invalid context raises before it is stored); bounded by clearing.
MEMO_SIZE = 4096
_MEMO: dict[tuple[Any, ...], ParsedIdentity | None] = {}
_MISS = object()
_MEMO_HEADERS = tuple(
    dict.fromkeys(
        [name for schema in _HEADER_SCHEMAS for name in schema[1:] if name is not None]
        + ["x-claude-code-session-id", "session-id", "x-session-id", *_HASH_KEY_HEADERS]
    )
)
_MEMO_SCALARS = (str, int, float, bool, type(None))


def _memo_key(ctx: Mapping[str, Any], body: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[Any, ...] | None:
    """The memo key of a context-carrying request, None when a value is not a plain scalar (the
    type is part of the key: ``1``, ``1.0`` and ``true`` parse differently)."""
    items = []
    for k, v in ctx.items():
        if type(v) not in _MEMO_SCALARS:
            return None
        items.append((k, type(v), v))
    session_params = body.get("session_params")
    nested = session_params.get("session_id") if isinstance(session_params, Mapping) else None
    extra = (nested, body.get("user"), body.get("user_id"))
    if any(type(v) not in _MEMO_SCALARS for v in extra):
        return None
    return (
        tuple(items),
        tuple((type(v), v) for v in extra),
        tuple(headers.get(name) for name in _MEMO_HEADERS),
    )


def parse_identity(
    body: Mapping[str, Any], headers: Mapping[str, str], enable_key: str = ENABLE_KEY_AGENTIC_CONTEXT
) -> ParsedIdentity | None:
    """Parse Program identity from a request body and its (lower-cased) headers.

    Returns None for identity-free requests; raises ``IdentityError`` for invalid metadata
    and ``ValueError`` for an unknown ``enable_key`` (a programming error: config validated it).
    """
    if enable_key not in (ENABLE_KEY_AGENTIC_CONTEXT, ENABLE_KEY_AUTO):
        raise ValueError(
            f"enable_key must be {ENABLE_KEY_AGENTIC_CONTEXT!r} or {ENABLE_KEY_AUTO!r}, got {enable_key!r}"
        )
    ctx = _locate_context(body)
    draft: _Draft | None
    if ctx is not None:
        key = _memo_key(ctx, body, headers)
        if key is not None:
            hit = _MEMO.get(key, _MISS)
            if hit is not _MISS:
                return hit  # type: ignore[return-value]
        draft = _from_context(ctx, headers)
        parsed = None if draft is None else _finish(draft, body, headers)
        if key is not None:
            if len(_MEMO) >= MEMO_SIZE:
                _MEMO.clear()
            _MEMO[key] = parsed
        return parsed
    elif enable_key != ENABLE_KEY_AUTO:
        return None
    elif body.get("agent_hint") is not None:
        draft = _from_agent_hint(body["agent_hint"])
    else:
        draft = _from_headers(headers)
    return None if draft is None else _finish(draft, body, headers)


def strip_agentic_context(body: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """A copy of ``body`` prepared for forwarding upstream (the input is never mutated).

    ``"strip"`` removes ``vllm_xargs.agentic_context`` (and ``vllm_xargs`` if that leaves it
    empty); ``"json_string"`` re-encodes an object context as compact JSON text (vLLM's
    ``vllm_xargs`` only carries scalars); ``"unchanged"`` copies the body as is.
    """
    if mode not in FORWARDING_MODES:
        raise ValueError(f"mode must be one of {', '.join(FORWARDING_MODES)}, got {mode!r}")
    out = dict(body)
    xargs = out.get("vllm_xargs")
    if mode == "unchanged" or not isinstance(xargs, Mapping) or "agentic_context" not in xargs:
        return out
    new_xargs = dict(xargs)
    if mode == "strip":
        del new_xargs["agentic_context"]
        if new_xargs:
            out["vllm_xargs"] = new_xargs
        else:
            del out["vllm_xargs"]
    elif isinstance(new_xargs["agentic_context"], Mapping):
        new_xargs["agentic_context"] = json.dumps(
            new_xargs["agentic_context"], separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        out["vllm_xargs"] = new_xargs
    return out
