"""Raw request bodies (daemon/http/rawbody.py): the member-wise parse is ``json.loads`` (same value,
same errors), and a raw edit gives the same JSON value as decoding, editing and re-encoding."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.http.rawbody import DELETE, TooDeep, edit_last_member, parse_object

KEYS = st.sampled_from(
    ["model", "messages", "stream", "stream_options", "priority", "vllm_xargs", "agentic_context", "é", 'q"', "\\"]
) | st.text(max_size=6)
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)  # NaN != NaN: equality would not hold for the right reason
    | TEXT
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=20
)
OBJECTS = st.dictionaries(KEYS, VALUES, max_size=7)
ENCODINGS = st.sampled_from(
    [
        {},
        {"ensure_ascii": False},
        {"separators": (",", ":"), "ensure_ascii": False},
        {"indent": 2},
        {"indent": "\t", "ensure_ascii": False},
    ]
)
CHANGES = st.dictionaries(KEYS, st.just(DELETE) | VALUES, max_size=3)


def _encode(obj: Any, style: dict[str, Any]) -> bytes:
    return json.dumps(obj, **style).encode("utf-8")


def _outcome(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


def _ours(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", parse_object(raw)[0]
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=OBJECTS, style=ENCODINGS, pad=st.sampled_from(["", " ", "\n\t ", "\r\n"]))
def test_member_wise_parse_is_json_loads(obj: dict[str, Any], style: dict[str, Any], pad: str) -> None:
    raw = pad.encode() + _encode(obj, style) + pad.encode()
    value, layout = parse_object(raw)
    assert value == json.loads(raw)
    assert list(value) == list(json.loads(raw))  # key order too
    assert layout is not None and not layout.duplicates


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=40) | st.text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_parse_or_fail_exactly_like_json_loads(raw: bytes) -> None:
    assert _ours(raw) == _outcome(raw)


@settings(max_examples=300, deadline=None)
@given(obj=OBJECTS, cut=st.integers(0, 200), junk=st.sampled_from(["", ",", "}", "]", '"', "x", "\\", "\x00", "1"]))
def test_damaged_objects_fail_exactly_like_json_loads(obj: dict[str, Any], cut: int, junk: str) -> None:
    text = json.dumps(obj, ensure_ascii=False)
    cut = min(cut, len(text))
    raw = (text[:cut] + junk + text[cut:]).encode("utf-8", "surrogatepass")
    assert _ours(raw) == _outcome(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,}',
        b'{"a" 1}',
        b'{"a":1}{"b":2}',
        b'{"a":1} x',
        b"{'a':1}",
        b'{"a":01}',
        b'{"a":"tab\there"}',
        b'{"a":1',
        b"[1,2]",
        b'"text"',
        b"\xef\xbb\xbf" + b'{"a":1}',  # a UTF-8 BOM: json.loads accepts it (utf-8-sig)
        '{"a":"é"}'.encode("utf-16"),
        b'{"a":NaN,"b":-Infinity}',
        b'{"a":"\\ud800"}',
        b'{"a":"\xed\xa0\x80"}',  # a surrogate encoded as UTF-8 (json.loads passes it)
        b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"",
        b"   ",
        b'{"a":1e400}',
        b'{"\\u00e9":1,"\\u00e9":2}',
    ],
)
def test_edge_cases_match_json_loads(raw: bytes) -> None:
    ours, theirs = _ours(raw), _outcome(raw)
    nan = isinstance(ours[1], dict) and any(isinstance(v, float) and math.isnan(v) for v in ours[1].values())
    if nan:  # NaN != NaN: compare the keys
        assert theirs[0] == "ok" and list(ours[1]) == list(theirs[1])
        return
    assert ours == theirs


def _decode_edit(obj: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """What agentd did before raw edits: decode, change the dict, re-encode (value semantics)."""
    out = dict(obj)
    for key, value in changes.items():
        if value is DELETE:
            out.pop(key, None)
        else:
            out[key] = value
    return json.loads(json.dumps(out))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=OBJECTS, style=ENCODINGS, changes=CHANGES)
def test_raw_edit_equals_decode_edit_encode(
    obj: dict[str, Any], style: dict[str, Any], changes: dict[str, Any]
) -> None:
    raw = _encode(obj, style)
    value, layout = parse_object(raw)
    assert layout is not None
    edited = layout.rebuild(changes)
    assert edited is not None
    assert json.loads(edited) == _decode_edit(value, changes)
    # members nobody changed keep their bytes: each unchanged member's value text is still there
    for key, _, start, end in layout.members:
        if key not in changes:
            assert layout.value_bytes(start, end) in edited


@settings(max_examples=100, deadline=None)
@given(obj=OBJECTS.filter(bool), changes=CHANGES)
def test_duplicate_top_level_keys_fall_back(obj: dict[str, Any], changes: dict[str, Any]) -> None:
    key = next(iter(obj))
    raw = json.dumps(obj)[:-1].encode() + b"," + json.dumps(key).encode() + b":7}"
    value, layout = parse_object(raw)
    assert value == json.loads(raw)  # the last one wins, as in json.loads
    assert layout is not None and layout.duplicates
    assert layout.rebuild(changes) is None


def test_rebuild_splices_only_the_changed_members() -> None:
    raw = (
        b'{ "model" : "m",\n  "messages": [{"role":"user","content":"caf\xc3\xa9 \\"q\\" \\u00e9"}],'
        b' "priority": 3, "vllm_xargs": {"agentic_context": {"program_id": "p"}, "k": 1} }'
    )
    value, layout = parse_object(raw)
    assert layout is not None
    out = layout.rebuild({"priority": DELETE, "vllm_xargs": {"k": 1}, "stream_options": {"include_usage": True}})
    assert out == (
        b'{"model" : "m",\n  "messages": [{"role":"user","content":"caf\xc3\xa9 \\"q\\" \\u00e9"}],'
        b'"vllm_xargs":{"k": 1},"stream_options":{"include_usage": true}}'
    )
    assert json.loads(out) == {
        "model": "m",
        "messages": value["messages"],
        "vllm_xargs": {"k": 1},
        "stream_options": {"include_usage": True},
    }
    assert layout.rebuild({"model": DELETE, "messages": DELETE, "priority": DELETE, "vllm_xargs": DELETE}) == b"{}"
    assert parse_object(b"{}")[1].rebuild({"a": [1]}) == b'{"a":[1]}'  # type: ignore[union-attr]


def test_non_utf8_bodies_have_no_layout() -> None:
    for raw in (b"\xef\xbb\xbf" + b'{"a":1}', '{"a":"é"}'.encode("utf-16")):
        value, layout = parse_object(raw)
        assert value == json.loads(raw) and layout is None


def test_more_than_1024_top_level_members_are_json_loads_without_a_layout() -> None:
    """The member-wise walk stops after 1,024 members (docs/operations.md §13.6): values, depth
    verdicts and non-ASCII strings are still those of json.loads, edits then re-encode."""
    for n, has_layout in ((1024, True), (1025, False)):
        for extra in ("", ',"é":"ü' + "x" * 3000 + '"'):
            raw = ("{" + ",".join(f'"k{i}":{i}' for i in range(n - (1 if extra else 0))) + extra + "}").encode()
            value, layout = parse_object(raw, 2048, 64)
            assert value == json.loads(raw) and (layout is not None) == has_layout
    deep = ("{" + ",".join(f'"k{i}":1' for i in range(1100)) + ',"d":' + "[" * 70 + "]" * 70 + "}").encode()
    with pytest.raises(TooDeep):
        parse_object(deep, 2048, 64)


# --- the Latin-1 scan (docs/operations.md §13.6): same values, errors and depth verdicts as json.loads

UNICODE_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)  # lone surrogates included
UNICODE_VALUES = st.recursive(
    st.none() | st.integers() | UNICODE_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(UNICODE_TEXT, inner, max_size=4),
    max_leaves=25,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=st.dictionaries(UNICODE_TEXT, UNICODE_VALUES, max_size=6), ascii_escapes=st.booleans())
def test_latin1_scan_is_json_loads(obj: dict[str, Any], ascii_escapes: bool) -> None:
    """Non-ASCII keys and values at every level, raw UTF-8 (surrogates encoded as json.loads passes
    them) or \\u escapes: the value, key order and layout equal json.loads' and the byte spans."""
    raw = json.dumps(obj, ensure_ascii=ascii_escapes).encode("utf-8", "surrogatepass")
    value, layout = parse_object(raw)
    expected = json.loads(raw)
    assert value == expected
    assert json.dumps(value) == json.dumps(expected)  # key order at every level, lone surrogates too
    assert layout is not None
    if raw.isascii() or b"\\u" not in raw:
        assert layout.text is None  # the Latin-1 scan ran
    for key, _, start, end in layout.members:
        assert json.loads(layout.value_bytes(start, end)) == expected[key]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=st.dictionaries(UNICODE_TEXT, UNICODE_VALUES, min_size=1, max_size=5), data=st.data())
def test_invalid_utf8_anywhere_fails_like_json_loads(obj: dict[str, Any], data: st.DataObject) -> None:
    """A byte that breaks UTF-8 inside any key or string (or outside them) fails as json.loads does."""
    raw = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    at = data.draw(st.integers(0, len(raw)))
    bad = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xe6\x97", b"\xed\xa0", b"\xf8\x88\x80\x80\x80"]))
    raw = raw[:at] + bad + raw[at:]
    assert _ours(raw) == _outcome(raw)


@settings(max_examples=200, deadline=None)
@given(value=UNICODE_VALUES, limit=st.integers(0, 6), ascii_escapes=st.booleans())
def test_depth_limit_is_the_nesting_depth(value: Any, limit: int, ascii_escapes: bool) -> None:
    raw = json.dumps({"k": value}, ensure_ascii=ascii_escapes).encode("utf-8", "surrogatepass")
    too_deep = _depth({"k": value}) > limit
    try:
        parsed = parse_object(raw, 0, limit)[0]
    except TooDeep:
        assert too_deep
    else:
        assert not too_deep and parsed == json.loads(raw)


def test_latin1_scan_edge_cases() -> None:
    # non-ASCII top-level and nested keys, a duplicate non-ASCII key (the last value wins, the first
    # position stays), non-ASCII next to escapes, an encoded surrogate
    data = '{"é":1,"a":{"日本":"語\\n\\"q\\"","é":[" ✓ ",{"ß":"x"}]},"é":2,"s":"'.encode() + b'\xed\xa0\x80"}'
    value, layout = parse_object(data)
    assert value == json.loads(data) and list(value) == list(json.loads(data))
    assert layout is not None and layout.text is None and layout.duplicates
    assert [m[0] for m in layout.members] == ["é", "a", "é", "s"]
    # non-ASCII bytes outside a string, a \\u escape beside non-ASCII bytes (decoded as UTF-8 first)
    for raw_bytes in ('{"a":1,\xa0"b":2}'.encode(), '{"a":"é","b":"\\u00e9"}'.encode()):
        assert _ours(raw_bytes) == _outcome(raw_bytes)
    assert parse_object('{"a":"é","b":"\\u00c3\\u00a9"}'.encode())[0] == {"a": "é", "b": "Ã©"}


def test_invalid_utf8_below_the_depth_limit_is_reported_as_json_loads_does() -> None:
    raw = b'{"a":' + b'{"b":' * 4 + b'"\xff"' + b"}" * 4 + b',"c":"\xc3\xa9"}'
    with pytest.raises(UnicodeDecodeError):
        parse_object(raw, 0, 2)
    with pytest.raises(TooDeep):
        parse_object(raw.replace(b"\xff", b"x"), 0, 2)


# ---- edit_last_member: a small body's last member spliced without a layout (docs/benchmarks.md §10.2.7) -------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=OBJECTS.filter(bool), style=ENCODINGS, new=st.just(DELETE) | VALUES, data=st.data())
def test_last_member_edit_equals_decode_edit_encode(
    obj: dict[str, Any], style: dict[str, Any], new: Any, data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(obj)))
    raw = _encode(obj, style)
    value = json.loads(raw)
    edited = edit_last_member(raw, value, key, new)
    if key != list(value)[-1]:
        assert edited is None  # only the last member is spliced
        return
    if edited is None:
        # refused only where it cannot tell (the caller re-encodes): the key's text appears again
        # (inside the member's own value, in a string) or is written otherwise than json.dumps does
        assert not key.isascii() or raw.count(json.dumps(key).encode()) != 1
        return
    assert json.loads(edited) == _decode_edit(value, {key: new})
    # everything before the member keeps its bytes
    before = raw[: raw.rfind(json.dumps(key).encode())].rstrip(b" \t\n\r")
    assert edited.startswith(before[:-1] if before.endswith(b",") else before)


@pytest.mark.parametrize(
    "raw",
    [
        # the key inside the last member's own value, after the member's key
        b'{"vllm_xargs": {"agentic_context": {"vllm_xargs": {}}}}',
        # the key in a string (its quote escaped)
        b'{"vllm_xargs": {"note": "say \\"vllm_xargs\\": 1}"}}',
        b'{"vllm_xargs": {"a": 1}, "m": "\\"vllm_xargs\\": {\\"a\\": 1}}"}',
        # a nested object ends the body
        b'{"m": [{"vllm_xargs": {"a": 1}}], "vllm_xargs": {"a": 1}}',
        b'{"vllm_xargs": {"a": 1}, "m": {"vllm_xargs": {"a": 1}}}',
        # repeated top-level key: the last occurrence is the one json.loads keeps
        b'{"vllm_xargs": {"a": 1}, "x": 2, "vllm_xargs": {"a": 3}}',
        b'{"vllm_xargs": {"a": 1}}',
        b'  {  "vllm_xargs"  :  {"a": 1}  }  \n',
    ],
)
def test_last_member_edit_of_tricky_bodies(raw: bytes) -> None:
    value = json.loads(raw)
    for new in (DELETE, {"b": 2}):
        edited = edit_last_member(raw, value, "vllm_xargs", new)
        if edited is not None:
            assert json.loads(edited) == _decode_edit(value, {"vllm_xargs": new})
    # the member the decoded body ends with, when it is vllm_xargs, is spliced in these bodies
    spliced = edit_last_member(raw, value, "vllm_xargs", DELETE)
    if list(value)[-1] == "vllm_xargs" and b'"vllm_xargs": {"a"' in raw[raw.rfind(b'"vllm_xargs"') :]:
        assert spliced is not None


def test_last_member_edit_refuses_what_it_cannot_check() -> None:
    body = {"a": 1, "vllm_xargs": {"x": 1}}
    assert edit_last_member(b'{"a": 1, "vllm_xargs": {"x": 1}}', body, "a", DELETE) is None  # not last
    assert edit_last_member(b'{"a": 1, "vllm\\u005fxargs": {"x": 1}}', body, "vllm_xargs", DELETE) is None
    assert edit_last_member(b"{}", {}, "vllm_xargs", DELETE) is None
    bom = b'\xef\xbb\xbf{"a": 1, "vllm_xargs": {"x": 1}}'
    assert json.loads(bom) == body and edit_last_member(bom, body, "vllm_xargs", DELETE) is None
    utf16 = '{"a": 1, "vllm_xargs": {"x": 1}}'.encode("utf-16")
    assert json.loads(utf16) == body and edit_last_member(utf16, body, "vllm_xargs", DELETE) is None
    assert edit_last_member(b'{"a": 1, "vllm_xargs": {"x": 1}}', body, "vllm_xargs", DELETE) == b'{"a": 1}'
    assert edit_last_member(b'{"vllm_xargs": {"x": 1}}', {"vllm_xargs": {"x": 1}}, "vllm_xargs", DELETE) == b"{}"
    assert (
        edit_last_member(b'{"a": 1,\n "vllm_xargs": {"x": 1}\n}', body, "vllm_xargs", {"y": 2})
        == b'{"a": 1,"vllm_xargs":{"y": 2}}'
    )


@pytest.mark.parametrize(
    "raw",
    [
        b'{"vllm_xargs": {"agentic_context": {"program_id": "p"}}, "vllm_xargs": {"a": 1}}',
        b'{"m": 1, "vllm_\\u0078args": {"agentic_context": {}}, "vllm_xargs": {"a": 1}}',
        b'{"m": 1, "vllm_xarg\\u0073" : {"agentic_context": {}},\n"vllm_xargs": {"a": 1}}',
    ],
)
def test_last_member_edit_leaves_a_repeated_key_to_re_encoding(raw: bytes) -> None:
    """The edited member's key given twice at the top level (also spelt with an escape): spliced,
    the worker saw the first copy, agentic context included, beside the edited one (before
    session 32); re-encoded now, each key once."""
    value = json.loads(raw)
    assert edit_last_member(raw, value, "vllm_xargs", DELETE) is None
    assert edit_last_member(raw, value, "vllm_xargs", {"b": 2}) is None


def test_last_member_edit_splices_when_an_escaped_key_is_another_one() -> None:
    raw = b'{"\\u00e9": 1, "m": [{"vllm_xargs": 2}], "vllm_xargs": {"agentic_context": {}}}'
    assert edit_last_member(raw, json.loads(raw), "vllm_xargs", DELETE) == raw[: raw.rfind(b",")] + b"}"
