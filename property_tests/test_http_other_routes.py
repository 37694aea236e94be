"""Hostile input at every route besides the proxy's: the Batch API (``/v1/files`` multipart
uploads, ``/v1/files/{id}``, ``/v1/files/{id}/content``, ``/v1/batches``, ``/v1/batches/{id}``,
``/v1/batches/{id}/cancel``), ``/v1/models``, ``/health``, ``/metrics``, ``/dashboard`` and its
files, ``/scheduling/dashboard.json`` and ``/scheduling/diagnostics`` (docs/operations.md §14).

Any method, path segment (percent-escapes, ``..``, NUL, non-ASCII), query string (``limit=-1``,
``limit=abc``, ``limit=²``, thousands of digits, repeated or unknown parameters), JSON body and
multipart form: never a 5xx, an OpenAI-shaped JSON error naming the field, a 405 with ``Allow``.
An upload is stored only when the form is exactly one ``purpose=batch`` and one ``file`` part, under
a name without directories or control characters.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing
from http_asgi import asgi_call, assert_at_rest, assert_well_formed, fuzz_config, running_app, virtual_clock
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from daemon.http.app import create_app
from daemon.http.metrics_route import metrics_asgi_app

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}\n'
SEGMENTS = st.one_of(
    st.sampled_from(["x", "..", ".", "%2e%2e", "..%2F..%2Fetc", "a\x00b", "\u00e9", "\ufffd", "file-0", "batch_0", ""]),
    st.text(st.characters(min_codepoint=1, max_codepoint=0x2FF, exclude_characters="/?#"), max_size=6),
    st.integers(130, 3000).map(lambda n: "f" * n),
)
PATHS = st.one_of(
    st.sampled_from(
        [
            "/v1/files", "/v1/batches", "/v1/models", "/health", "/metrics", "/dashboard",
            "/dashboard/dashboard.js", "/scheduling/dashboard.json", "/scheduling/diagnostics", "/",
            "//v1/models", "/v1/files/", "/v1/batches/",
        ]
    ),
    st.tuples(st.sampled_from(["/v1/files/{}", "/v1/files/{}/content", "/v1/batches/{}", "/v1/batches/{}/cancel",
                               "/dashboard/{}", "/v1/{}", "/{}"]), SEGMENTS).map(lambda t: t[0].format(t[1])),
)  # fmt: skip
# hostile values of a numeric query parameter: int() refuses "²" (which str.isdigit accepts) and
# more than 4,300 digits
NUMERIC_VALUES = st.sampled_from(
    ["%C2%B2", "9" * 5000, "-1", "abc", "0", "1", "20", "101", "10001", "%00", "1e3", "+1", "", "007", "9" * 30]
)
QUERY_VALUES = st.one_of(
    NUMERIC_VALUES,
    st.sampled_from(["all", "program", "batch", "nope", "batch_0"]),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="&#"), max_size=6),
)
LIST_ROUTES = {  # (in the order Hypothesis prefers)
    "/v1/batches": ["limit", "after"],
    "/scheduling/dashboard.json": ["page", "state", "sort"],
    "/v1/files": ["limit", "purpose"],
    "/scheduling/diagnostics": ["limit"],
    "/metrics": ["name[]"],
    "/v1/models": ["limit"],
}


@st.composite
def list_requests(draw: st.DrawFn) -> tuple[str, str, bytes, bytes]:
    path = draw(st.sampled_from(list(LIST_ROUTES)))
    names = st.sampled_from([*LIST_ROUTES[path], "order", "x", "%ff"])
    pairs = [(LIST_ROUTES[path][0], draw(NUMERIC_VALUES))]  # the route's first parameter, a number or not
    pairs += draw(st.lists(st.tuples(names, QUERY_VALUES), max_size=2))
    return "GET", path, "&".join(f"{k}={v}" for k, v in pairs).encode(), b""


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
BATCH_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "input_file_id": st.sampled_from(["file-x", ""]) | JSON_VALUES,
        "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/embeddings"]) | JSON_VALUES,
        "completion_window": st.just("24h") | JSON_VALUES,
        "metadata": st.dictionaries(st.text(max_size=70), st.text(max_size=10) | JSON_VALUES, max_size=3) | JSON_VALUES,
        "metdata": JSON_VALUES,
    },
).map(lambda body: json.dumps(body).encode("utf-8", "surrogatepass"))
METHODS = st.sampled_from(["GET", "GET", "POST", "HEAD", "DELETE", "PUT", "PATCH", "OPTIONS"])
REQUESTS = st.lists(
    st.one_of(
        list_requests(),
        st.tuples(st.just("POST"), st.just("/v1/batches"), st.just(b""), BATCH_BODIES | st.binary(max_size=20)),
        st.tuples(METHODS, PATHS, st.just(b""), st.just(b"")),
    ),
    min_size=4,
    max_size=16,
)


# The defects this test found, kept as explicit examples (each was a 500 before)
@example([("GET", "/v1/batches", b"limit=%C2%B2", b""), ("GET", "/v1/files", b"limit=%C2%B2", b"")])
@example([("GET", "/v1/batches", b"limit=" + b"9" * 5000, b""), ("GET", "/v1/files", b"limit=" + b"9" * 5000, b"")])
@example([("GET", "/scheduling/dashboard.json", b"page=%C2%B2", b"")])
@example([("POST", "/v1/batches", b"", b'{"input_file_id": "f", "endpoint": {}, "completion_window": "24h"}')])
@example([("GET", "/v1/files/\udcff", b"", b""), ("DELETE", "/v1/files/\udcff", b"", b"")])
@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=REQUESTS)
def test_any_request_at_the_other_routes_is_answered_below_500(requests: list[tuple[str, str, bytes, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run_routes, requests, Path(tmp), clock=virtual_clock())


async def run_routes(requests: list[tuple[str, str, bytes, bytes]], tmp: Path) -> None:
    async with running_app(fuzz_config(tmp / "b.sqlite3")) as (handles, app):
        for method, path, query, body in requests:
            headers = [(b"content-type", b"application/json")]
            answer = await asgi_call(app, method, path, query=query, headers=headers, chunks=[body])
            error = assert_well_formed(answer, method)
            if error is not None and error["code"] in ("unknown_parameter", "invalid_value", "invalid_parameter"):
                assert error["param"], error
        assert_at_rest(handles)


# ---- multipart uploads ---------------------------------------------------------------------

# None: a part whose Content-Disposition has no name (a 500 before session 40)
PART_NAMES = st.sampled_from(
    ["purpose", "file", "file", "purpose", "files", "extra", "", "expires_after[anchor]", None]
)
FILENAMES = st.one_of(
    st.none(),
    st.sampled_from(
        ["in.jsonl", "../../etc/passwd", "C:\\Users\\me\\in.jsonl", "a\x00b", "..", "dir/", "\u00e9.jsonl"]
    ),
    st.text(st.characters(min_codepoint=1, max_codepoint=0x7FF, exclude_characters='"\\\r\n'), max_size=12),
    st.integers(200, 400).map(lambda n: "n" * n),
)
CONTENTS = st.one_of(
    st.just(LINE),
    st.just(LINE * 3),
    st.just(b""),
    st.just(b"not json\n"),
    st.just(b"\xef\xbb\xbf" + LINE),
    st.binary(max_size=40),
)
PART = st.tuples(PART_NAMES, FILENAMES, st.sampled_from([b"batch", b"batch", b"fine-tune", b"\xff", b""]), CONTENTS)


@st.composite
def forms(draw: st.DrawFn) -> list[tuple[str | None, str | None, bytes, bytes]]:
    """A valid form (purpose=batch and a file) with up to two parts added or taken away."""
    parts = [("purpose", None, b"batch", b""), ("file", draw(FILENAMES), b"", draw(CONTENTS))]
    if draw(st.booleans()):
        del parts[draw(st.integers(0, 1))]
    for extra in draw(st.lists(PART, max_size=2)):
        parts.insert(draw(st.integers(0, len(parts))), extra)
    return parts


def multipart(parts: list[tuple[str | None, str | None, bytes, bytes]], boundary: str = "fuzzbnd") -> bytes:
    out = b""
    for name, filename, field_value, content in parts:
        disposition = "form-data" if name is None else f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        data = content if filename is not None else (field_value if name != "file" else content)
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def well_formed_upload(parts: list[tuple[str | None, str | None, bytes, bytes]]) -> bool:
    names = [p[0] for p in parts]
    if len(names) != 2 or set(names) != {"file", "purpose"}:
        return False
    purpose = next(p for p in parts if p[0] == "purpose")
    return purpose[1] is None and purpose[2] == b"batch"


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(uploads=st.lists(st.tuples(forms(), st.integers(1, 3), st.booleans()), min_size=1, max_size=4))
def test_any_multipart_upload_is_stored_whole_or_refused_naming_the_field(
    uploads: list[tuple[list[tuple[str | None, str | None, bytes, bytes]], int, bool]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run_uploads, uploads, Path(tmp), clock=virtual_clock())


async def run_uploads(uploads: list[Any], tmp: Path) -> None:
    async with running_app(fuzz_config(tmp / "b.sqlite3", max_file_bytes=4096, max_lines=4)) as (handles, app):
        stored = 0
        for parts, pieces, leave in uploads:
            raw = multipart(parts)
            step = -(-len(raw) // pieces)
            chunks = [raw[i : i + step] for i in range(0, len(raw), step)]
            answer = await asgi_call(
                app,
                "POST",
                "/v1/files",
                headers=[(b"content-type", b"multipart/form-data; boundary=fuzzbnd")],
                chunks=chunks,
                disconnect_after=len(chunks) - 1 if leave and len(chunks) > 1 else None,
            )
            if answer.status is None:  # the client left mid-upload: nothing stored
                continue
            error = assert_well_formed(answer, "POST")
            if error is None:
                stored += 1
                assert well_formed_upload(parts), parts
                file = json.loads(answer.body)
                assert "/" not in file["filename"] and "\\" not in file["filename"], file
                assert not any(ord(ch) < 32 or ord(ch) == 127 for ch in file["filename"]), file
                content = await asgi_call(app, "GET", f"/v1/files/{file['id']}/content")
                expected = next(p[3] for p in parts if p[0] == "file")
                assert content.status == 200 and content.body == expected and file["bytes"] == len(expected)
            else:
                names = [p[0] for p in parts]
                if error["code"] == "unknown_parameter":
                    assert error["param"] in names and error["param"] not in ("purpose", "file"), (error, names)
                if error["code"] == "duplicate_field":
                    assert names.count(error["param"]) > 1, (error, names)
        listed = await asgi_call(app, "GET", "/v1/files")
        assert len(json.loads(listed.body)["data"]) == stored  # a refused or abandoned upload left nothing
        assert_at_rest(handles)


async def test_an_upload_with_a_content_length_that_is_no_number_is_a_400(tmp_path: Path) -> None:
    """Before: ``"²".isdigit()`` let ``int("²")`` raise out of the upload handler (a bare 500)."""
    async with running_app(fuzz_config(tmp_path / "b.sqlite3")) as (_handles, app):
        for declared in (b"\xc2\xb2", b"-1", b"1e3", b" 12"):
            answer = await asgi_call(
                app,
                "POST",
                "/v1/files",
                headers=[(b"content-type", b"multipart/form-data; boundary=b"), (b"content-length", declared)],
                chunks=[b"--b--\r\n"],
            )
            error = assert_well_formed(answer, "POST")
            assert answer.status == 400 and error is not None, answer
            assert (error["code"], error["param"]) == ("invalid_header", "content-length")


async def test_every_405_names_the_allowed_methods_and_options_lists_them(tmp_path: Path) -> None:
    """``/v1/files``: POST is served in front of Quart, whose own Allow left it out (before:
    ``DELETE /v1/files`` -> 405 ``Allow: GET, HEAD, OPTIONS``); the ``--prometheus-port`` app's 405
    had no Allow at all."""
    async with running_app(fuzz_config(tmp_path / "b.sqlite3")) as (handles, app):
        deleted = await asgi_call(app, "DELETE", "/v1/files")
        assert deleted.status == 405 and set(deleted.headers["allow"].split(", ")) == {"GET", "HEAD", "POST", "OPTIONS"}
        assert_well_formed(deleted, "DELETE")
        options = await asgi_call(app, "OPTIONS", "/v1/files")
        assert options.status == 200 and "POST" in options.headers["allow"]
        metrics_app = metrics_asgi_app(handles.registry)
        answer = await asgi_call(metrics_app, "POST", "/metrics")  # type: ignore[arg-type]
        assert answer.status == 405 and answer.headers["allow"] == "GET, HEAD"
        assert_well_formed(answer, "POST")


# ---- the admin split: no spelling of an admin path reaches it from the public port --------------

ADMIN_PATHS = ["/scheduling/diagnostics", "/scheduling/dashboard.json", "/metrics", "/dashboard"]
ADMIN_MARKERS = (b'"invariants"', b"# HELP", b"<!doctype", b'"live_programs"', b'"enabled"')


@st.composite
def admin_spellings(draw: st.DrawFn) -> str:
    """An admin path spelt as a careless or hostile client might: extra slashes anywhere, no
    leading slash, an absolute-form prefix, a trailing slash or dot segment."""
    path = draw(st.sampled_from(ADMIN_PATHS))
    parts = path.split("/")
    spelt = "".join(p + "/" * draw(st.integers(1, 3)) for p in parts[:-1]) + parts[-1]
    prefix = draw(st.sampled_from(["", "", "http://agentd", "https://h:1", "http:", "HTTP://x", "x", "."]))
    suffix = draw(st.sampled_from(["", "", "/", "/.", "?x=1"]))
    return prefix + spelt + suffix


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(paths=st.lists(admin_spellings(), min_size=1, max_size=12))
def test_the_public_port_never_serves_an_admin_route(paths: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run_admin_spellings, paths, Path(tmp), clock=virtual_clock())


async def run_admin_spellings(paths: list[str], tmp: Path) -> None:
    async with running_app(fuzz_config(tmp / "b.sqlite3")) as (handles, _app):
        public = create_app(handles, role="public")
        for path in paths:
            spelt, _, query = path.partition("?")
            answer = await asgi_call(public, "GET", spelt, query=query.encode())
            assert answer.status is not None and answer.status != 200, (path, answer.status)
            assert not any(marker in answer.body for marker in ADMIN_MARKERS), (path, answer.body[:120])
            assert_well_formed(answer, "GET")
