"""Request class, priority and tenant at the edge (docs/priority.md §5).

:func:`resolve` reads one request and the operator's ``[priority]``/``[tenants]`` configuration
and returns a :class:`PriorityInfo`: the class (``interactive``, ``agent``, ``batch``), the
priority in agentd's one convention (**larger runs first**, as ``agentic_context.priority`` and
the core's ``RequestHints.priority``) and the tenant.

Priority, from the client (docs/priority.md §5.1):

* the OpenAI / vLLM body field ``priority`` ``p`` (lower runs first) means internal ``-p``;
* ``vllm_xargs.agentic_context.priority`` ``q`` (larger runs first) means internal ``q``;
* both given must agree (``-p == q``), else a 400 naming ``priority``; either outside
  ``[-max_abs_priority, max_abs_priority]`` is a 400 naming that field; a non-integer is a 400.

Class: a request with Program identity is ``agent``; an identity-free one is ``batch`` with
``X-Agentd-Class: batch`` or a ``#job_name[...]#`` tag (docs/batch.md §2.1), else ``interactive``.

Operator rules (``[[priority.rules]]``, the first whose matchers all hold applies) may force the
class of identity-free requests (``set_class``), cap it (``max_class``: a class above the cap in the
band order is lowered; an identity-free request lowered below ``interactive`` becomes ``batch``),
give a default priority and clamp the client's (``min_priority``/``max_priority``).  A client never
gets above what a matching rule allows; a Program request stays ``agent`` (its Program state lives
in the agent class) and only its priority is capped.

Tenant (docs/priority.md §5.3): the authenticated API key's tenant (``ProxyRequest.principal``) >
the ``[tenants] header`` > the OpenAI ``user`` field > ``"default"``.

:func:`engine_priority` turns class and priority into vLLM's ``priority`` (lower first) for a
worker running ``--scheduling-policy priority``, so that the engine keeps the router's order:
``band * (2M + 1) - priority`` with ``M = max_abs_priority`` and ``band`` the class's position in
the band order (0 = first): the first band is exactly ``-priority``, and every value of a band is
below every value of the next.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from actors.core.batchjobs import DEFAULT_JOB
from actors.core.config import DEFAULT_CLASS_ORDER
from actors.core.ids import DEFAULT_TENANT
from actors.core.model import AGENT, BATCH, INTERACTIVE
from daemon.config import MAX_TENANT_BYTES, PriorityRule, PrioritySection, TenantsConfig
from daemon.http.errors import ApiError

DEFAULT_BANDS: tuple[str, ...] = DEFAULT_CLASS_ORDER
CONTEXT_PRIORITY = "vllm_xargs.agentic_context.priority"
BODY_PRIORITY = "priority"


@attrs.frozen
class PriorityInfo:
    """What the edge decided for one request: class, priority (larger first), tenant, and which
    rule applied (its index in ``priority.rules``, None without one)."""

    request_class: str = INTERACTIVE
    priority: int = 0
    tenant: str = DEFAULT_TENANT
    tenant_source: str = "default"  # principal | header | user | default
    rule: int | None = None


DEFAULT_INFO = PriorityInfo()


def _int_field(value: Any, param: str, limit: int, *, negate: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(
            400, f"{param}: must be an integer (got {json.dumps(value)[:64]})", code="invalid_priority", param=param
        )
    if abs(value) > limit:
        raise ApiError(
            400,
            f"{param}: must be within [{-limit}, {limit}] (priority.max_abs_priority) (got {value})",
            code="invalid_priority",
            param=param,
        )
    return -value if negate else value


def _context_priority(body: Mapping[str, Any]) -> Any:
    """``vllm_xargs.agentic_context.priority`` when the context is readable (an object or a JSON
    object string), else None; malformed contexts are the identity parser's to report."""
    xargs = body.get("vllm_xargs")
    if not isinstance(xargs, Mapping):
        return None
    ctx = xargs.get("agentic_context")
    if isinstance(ctx, str):
        try:
            ctx = json.loads(ctx)
        except ValueError:
            return None
    return ctx.get("priority") if isinstance(ctx, Mapping) else None


def client_priority(body: Mapping[str, Any], max_abs: int) -> int | None:
    """The client's priority in agentd's convention (larger first), None when it gave none."""
    raw_body = body.get(BODY_PRIORITY)
    raw_ctx = _context_priority(body)
    from_body = None if raw_body is None else _int_field(raw_body, BODY_PRIORITY, max_abs, negate=True)
    from_ctx = None if raw_ctx is None else _int_field(raw_ctx, CONTEXT_PRIORITY, max_abs, negate=False)
    if from_body is not None and from_ctx is not None and from_body != from_ctx:
        raise ApiError(
            400,
            f"priority: conflicts with {CONTEXT_PRIORITY} (priority {raw_body} is lower-runs-first and means "
            f"{from_body} in agentd's larger-runs-first order; {CONTEXT_PRIORITY} says {raw_ctx}); give one, "
            "or the same order in both",
            code="conflicting_priority",
            param=BODY_PRIORITY,
        )
    return from_body if from_body is not None else from_ctx


def _visible(value: str) -> bool:
    return all(ch == "\t" or " " <= ch <= "~" for ch in value)


# control characters (C0, DEL, C1) and the bidirectional overrides and isolates: a tenant name is
# shown in /metrics labels, diagnostics and the dashboard, where these corrupt or disguise it
UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def resolve_tenant(
    body: Mapping[str, Any], headers: Mapping[str, str], principal: str | None, cfg: TenantsConfig
) -> tuple[str, str]:
    """(tenant, source): principal > configured header > OpenAI ``user`` > ``"default"``."""
    if principal:
        return principal, "principal"
    if cfg.header:
        raw = headers.get(cfg.header)
        if raw is not None and raw.strip():
            value = raw.strip()
            if "," in value:  # the header given twice arrives joined with ", " (one request, one tenant)
                raise ApiError(
                    400,
                    f"{cfg.header}: must name one tenant (got {value[:64]!r}: the header given more than once, "
                    "or a comma in the name)",
                    code="invalid_tenant",
                    param=cfg.header,
                )
            if not _visible(value) or len(value.encode()) > MAX_TENANT_BYTES:
                raise ApiError(
                    400,
                    f"{cfg.header}: must be visible ASCII of at most {MAX_TENANT_BYTES} bytes (got {value[:64]!r})",
                    code="invalid_tenant",
                    param=cfg.header,
                )
            return value, "header"
    if cfg.use_openai_user:
        user = body.get("user")
        if user is not None:
            if not isinstance(user, str):
                raise ApiError(
                    400,
                    f"user: must be a string (got {type(user).__name__})",
                    code="invalid_user",
                    param="user",
                )
            user = user.strip()
            if (bad := UNSHOWABLE.search(user)) is not None:
                raise ApiError(
                    400,
                    "user: must not contain control or bidirectional-override characters "
                    f"(got U+{ord(bad.group()):04X} at index {bad.start()})",
                    code="invalid_user",
                    param="user",
                )
            if user:
                if len(user.encode()) > MAX_TENANT_BYTES:
                    raise ApiError(
                        400,
                        f"user: must be at most {MAX_TENANT_BYTES} bytes (got {len(user.encode())} bytes)",
                        code="invalid_user",
                        param="user",
                    )
                return user, "user"
    return DEFAULT_TENANT, "default"


def _header_matches(spec: str, headers: Mapping[str, str]) -> bool:
    name, sep, want = spec.partition("=")
    got = headers.get(name.strip().lower())
    if got is None:
        return False
    return got.strip() == want.strip() if sep else got.strip() != ""


def rule_matches(rule: PriorityRule, *, tenant: str, headers: Mapping[str, str], model: Any, origin: str) -> bool:
    return (
        (rule.tenant is None or rule.tenant == tenant)
        and (rule.header is None or _header_matches(rule.header, headers))
        and (rule.model is None or rule.model == model)
        and (rule.origin is None or rule.origin == origin)
    )


def _capped_class(cls: str, cap: str, bands: Sequence[str], has_identity: bool) -> str:
    """``cls`` lowered to ``cap`` when it ranks above it in ``bands``."""
    if cls not in bands or cap not in bands or bands.index(cls) >= bands.index(cap):
        return cls
    if has_identity:
        return cls  # Program requests stay agent class (docs/priority.md §5.2)
    return cap if cap != AGENT else BATCH


def resolve(
    *,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    has_identity: bool,
    batch: bool,
    principal: str | None,
    origin: str,
    priority: PrioritySection,
    tenants: TenantsConfig,
    bands: Sequence[str] | None = None,
) -> PriorityInfo:
    """The request's class, priority and tenant under the operator's rules (module docstring)."""
    bands = priority.class_order if bands is None else bands
    given = client_priority(body, priority.max_abs_priority)
    tenant, source = resolve_tenant(body, headers, principal, tenants)
    cls = AGENT if has_identity else BATCH if batch else INTERACTIVE
    value = 0 if given is None else given
    chosen: int | None = None
    for index, rule in enumerate(priority.rules):
        if not rule_matches(rule, tenant=tenant, headers=headers, model=body.get("model"), origin=origin):
            continue
        chosen = index
        if rule.set_class is not None and not has_identity:
            cls = rule.set_class
        if rule.max_class is not None:
            cls = _capped_class(cls, rule.max_class, bands, has_identity)
        if given is None and rule.default_priority is not None:
            value = rule.default_priority
        if rule.min_priority is not None:
            value = max(value, rule.min_priority)
        if rule.max_priority is not None:
            value = min(value, rule.max_priority)
        break
    return PriorityInfo(cls, value, tenant, source, chosen)


def batch_job_for(info: PriorityInfo, job: str | None) -> str | None:
    """The batch job after the rules: a request a rule made batch class joins the default job, one
    a rule made interactive leaves the batch queue."""
    if info.request_class == BATCH:
        return job if job is not None else DEFAULT_JOB
    return None


def engine_priority(info: PriorityInfo, max_abs: int, bands: Sequence[str] = DEFAULT_BANDS) -> int:
    """vLLM's ``priority`` (lower runs first) keeping the router's class bands and priorities."""
    band = bands.index(info.request_class) if info.request_class in bands else len(bands)
    return band * (2 * max_abs + 1) - info.priority
