"""``GET /dashboard`` (a static page) and ``GET /scheduling/dashboard.json`` (what it polls).

The page is plain HTML, CSS and a small script shipped as package data in
``daemon/http/static/`` (no build step, no CDN); it polls the JSON endpoint about once a second.
The endpoint is compact (a few KB): per-rank KV accounting, Program counts per state, one page
of at most :data:`~actors.dashboard_view.PAGE_SIZE` Programs, recent scheduling events, a
bounded per-tick history and the panels of :mod:`actors.dashboard_panels` (batch jobs, classes and
tenants, tools, time split, queue ETA; docs/operations.md §9).  Query parameters ``page`` (an
integer >= 1), ``state`` and ``sort`` are validated; a bad one is a 400 naming it.  With Program
scheduling off the body is ``{"enabled": false, "classes_tenants": ..., "proxy": ...}`` and the
page shows the proxy's class and tenant figures and the proxy targets only.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from quart import Blueprint, Response, request

from actors.dashboard_panels import classes_tenants_panel
from actors.dashboard_view import SORT_KEYS, STATE_FILTERS
from daemon.http.diagnostics import proxy_section
from daemon.http.errors import ApiError
from daemon.redact import redact_url

if TYPE_CHECKING:
    from daemon.handles import DaemonHandles

MAX_PAGE = 1_000_000
STATIC_FILES = {
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}


def static_file(name: str) -> bytes:
    return resources.files("daemon.http").joinpath("static", name).read_bytes()


def _choice(args: Any, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = args.get(name, default)
    if value not in allowed:
        raise ApiError(
            400, f"invalid {name} {value!r}: expected one of {', '.join(allowed)}", code="invalid_parameter", param=name
        )
    return str(value)


def _page(args: Any) -> int:
    raw = args.get("page", "1")
    # ASCII digits only: "²".isdigit() is true but int("²") raises
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 20) or not 1 <= int(raw) <= MAX_PAGE:
        raise ApiError(
            400,
            f"invalid page {raw!r}: expected an integer from 1 to {MAX_PAGE}",
            code="invalid_parameter",
            param="page",
        )
    return int(raw)


def _proxy_compact(section: dict[str, Any]) -> dict[str, Any]:
    keep = ("target_id", "base_url", "dp_rank", "healthy", "health_reason", "native_in_flight_requests")
    return {
        "policy": section["policy"],
        "embedded": section["embedded"],
        "health_rounds": section["health_rounds"],
        "targets": [{k: t[k] for k in keep} for t in section["targets"]],
    }


def dashboard_payload(
    handles: DaemonHandles, *, page: int = 1, state: str = "all", sort: str = "program"
) -> dict[str, Any]:
    program = handles.program_dispatcher
    book = handles.engine.fairness  # the proxy's per-class and per-tenant figures (docs/priority.md §5.6)
    proxy_classes = None if book is None else book.by_class()
    proxy_tenants = None if book is None else book.by_tenant()
    doc: dict[str, Any]
    if program is not None and hasattr(program, "dashboard"):
        doc = program.dashboard(
            page=page, state=state, sort=sort, proxy_classes=proxy_classes, proxy_tenants=proxy_tenants
        )
    else:
        doc = {"enabled": False}
        if book is not None:
            doc["classes_tenants"] = classes_tenants_panel(
                None, weight_total=0.0, served_total=0.0, proxy_classes=proxy_classes, proxy_tenants=proxy_tenants
            )
    doc["proxy"] = _proxy_compact(proxy_section(handles))
    return doc


def dashboard_blueprint(handles: DaemonHandles) -> Blueprint:
    bp = Blueprint("dashboard", __name__)

    @bp.get("/dashboard")
    async def page() -> Response:
        return Response(static_file("dashboard.html"), status=200, content_type=STATIC_FILES["dashboard.html"])

    @bp.get("/dashboard/<name>")
    async def asset(name: str) -> Response:
        if name not in STATIC_FILES or name == "dashboard.html":
            raise ApiError(404, f"unknown dashboard file {name!r}", code="not_found")
        return Response(
            static_file(name), status=200, content_type=STATIC_FILES[name], headers={"cache-control": "no-cache"}
        )

    @bp.get("/scheduling/dashboard.json")
    async def data() -> Response:
        args = request.args
        unknown = sorted(set(args) - {"page", "state", "sort"})
        if unknown:
            raise ApiError(400, f"unknown parameter {unknown[0]!r}", code="invalid_parameter", param=unknown[0])
        for name in ("page", "state", "sort"):  # page=1&page=abc: which one? (the first was read)
            if len(args.getlist(name)) > 1:
                raise ApiError(400, f"parameter {name} is given more than once", code="invalid_parameter", param=name)
        payload = dashboard_payload(
            handles,
            page=_page(args),
            state=_choice(args, "state", STATE_FILTERS, "all"),
            sort=_choice(args, "sort", SORT_KEYS, "program"),
        )
        body = redact_url(json.dumps(payload, separators=(",", ":"), default=str))  # no worker credentials
        return Response(body, status=200, content_type="application/json", headers={"cache-control": "no-store"})

    return bp
