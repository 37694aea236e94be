"""The body agentd forwards is the body the client meant, whatever JSON text it was written as
(docs/operations.md §13.6, issue 15's raw-byte edits).

A differential test: Hypothesis writes valid (and a few invalid) chat request bodies as JSON *text*
with everything a JSON parser accepts and a fast path might trip on - odd whitespace between every
token, keys spelt with escapes (``"stre\\u0061m"``), duplicate keys at the top level and inside
``vllm_xargs`` (``json.loads`` keeps the last one, and so does the worker's parser, FastAPI's
``json.loads``), ``stream`` as ``1``, ``"true"`` or ``null``, ``stream_options`` with
``include_usage`` false/true and ``continuous_usage_stats``, ``NaN``/``Infinity`` and numbers too
large for a float, integers of thousands of digits, very deep nesting, lone surrogate escapes, a
byte-order mark, UTF-16, trailing whitespace and trailing garbage, bodies on both sides of the
2 KiB layout threshold.  For each, against ``json.loads`` and an independent decode/edit/re-encode
reference:

* agentd refuses exactly what ``json.loads`` refuses, plus the documented stricter cases
  (docs/operations.md §12, §14), each with a 400 whose ``param`` names the field;
* what it accepts, it reads as ``json.loads`` does (``stream``, ``model``, the Program id);
* the bytes it forwards decode to exactly the reference's object (values and number types; NaN
  equal to NaN), each top-level key once when it edited the body, and are the client's bytes
  unchanged when it made no edit.
"""

from __future__ import annotations

import codecs
import json
import math
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from daemon.http.errors import ApiError
from tests.http.test_outgoing_body import Lease, make_engine

MAX_DEPTH = 64  # docs/operations.md §12: deeper bodies are a 400 invalid_json


# ------------------------------------------------------------------------------------------------
# JSON text, written token by token
# ------------------------------------------------------------------------------------------------


class Raw:
    """A literal JSON fragment (a number spelt a particular way, NaN, ...) and the value
    ``json.loads`` gives for it."""

    def __init__(self, text: str) -> None:
        self.text = text


class Dup:
    """An object written with repeated keys: ``pairs`` in order (``json.loads`` keeps the last)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


WS = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n", "  \n\t"])
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
NUMBER_TEXTS = st.sampled_from(
    ["0", "-0", "1", "-1", "1.0", "1e2", "1E+2", "2.5e-3", "-0.0", "1e400", "-1e400", "123456789012345678901234567890",
     "0.1000000000000000055511151231257827", "NaN", "Infinity", "-Infinity", "9007199254740993"]
)  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
    | NUMBER_TEXTS.map(Raw)
)
KEYS = st.sampled_from(["a", "é", "stream", "agentic_context", "include_usage", 'q"', "\\"]) | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(KEYS, inner, max_size=3)
        | st.lists(st.tuples(KEYS, inner), min_size=2, max_size=3).map(Dup)
    ),
    max_leaves=12,
)


STYLE = st.sampled_from(["plain", "plain", "plain", "u", "dumps"])
HEX_CASE = st.sampled_from(["x", "X"])
LONG = 64  # longer strings (the 2 KiB padding) get a few escapes, not one draw per character


@st.composite
def _string(draw: st.DrawFn, text: str) -> str:
    """``text`` as a JSON string literal, some characters written as escapes (``\\u0061``, ``\\/``)."""
    styles: dict[int, str] | None = None
    if len(text) > LONG:
        styles = {i: draw(STYLE) for i in sorted(set(draw(st.lists(st.integers(0, len(text) - 1), max_size=3))))}
    out = ['"']
    for i, ch in enumerate(text):
        how = draw(STYLE) if styles is None else styles.get(i, "plain")
        if ch == "/" and how == "dumps":
            out.append("\\/")
        elif ch in ('"', "\\") or ord(ch) < 0x20 or how == "dumps":
            out.append(json.dumps(ch)[1:-1])
        elif how == "u" and ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04{draw(HEX_CASE)}}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


@st.composite
def _write(draw: st.DrawFn, value: Any) -> str:
    """``value`` as JSON text with random whitespace between tokens and escapes in strings."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, str):
        return draw(_string(value))
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, list):
        items = [draw(WS) + draw(_write(v)) + draw(WS) for v in value]
        return "[" + ",".join(items) + "]" if items else "[" + draw(WS) + "]"
    pairs = value.pairs if isinstance(value, Dup) else list(value.items())
    members = [draw(WS) + draw(_string(k)) + draw(WS) + ":" + draw(WS) + draw(_write(v)) + draw(WS) for k, v in pairs]
    return "{" + ",".join(members) + "}" if members else "{" + draw(WS) + "}"


CONTEXT = st.fixed_dictionaries(
    {"program_id": st.sampled_from(["p1", "é-agent", 'q"uote', "a\\b"])},
    optional={"step_id": st.integers(0, 9), "task_id": st.sampled_from(["t", "ü"]), "note": VALUES},
)
XARGS = st.tuples(st.dictionaries(st.sampled_from(["top_k", "seed", "x"]), SCALARS, max_size=2), CONTEXT).flatmap(
    lambda rc: st.sampled_from(
        [rc[0], {**rc[0], "agentic_context": rc[1]}, {"agentic_context": rc[1], **rc[0]}, {"agentic_context": None}]
    )
)
STREAM = st.sampled_from([True, True, True, True, False, False, None, True, Raw("1"), True, "true", True, Raw("0")])
STREAM_OPTIONS = st.sampled_from(
    [
        None,
        {},
        {"include_usage": False},
        {"include_usage": True},
        {"continuous_usage_stats": True},
        {"include_usage": False, "continuous_usage_stats": True},
        {"include_usage": True, "continuous_usage_stats": True},
        {"continuous_usage_stats": False, "include_usage": None},
        {"include_usage": True},
        {"include_usage": False},
        {"include_usage": "true"},
    ]
)
OPTIONAL: dict[str, Any] = {
    "stream": STREAM,
    "stream_options": STREAM_OPTIONS,
    "vllm_xargs": XARGS,
    "priority": st.integers(-3, 3),
    "temperature": st.floats(0, 2) | st.sampled_from([Raw("0.5"), Raw("1E0"), Raw("NaN"), Raw("1e400")]),
    "metadata": st.dictionaries(TEXT, SCALARS, max_size=2),
    "extra": VALUES,
}
EDITED = ("stream", "stream_options", "vllm_xargs", "priority")  # (duplicated more often)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, str]:
    """(the raw body, what was done to it) - a chat request written as JSON text."""
    pairs: list[tuple[str, Any]] = [("model", "m")]
    messages: list[Any] = [{"role": "user", "content": draw(TEXT)}]
    if draw(st.booleans()):  # over the 2 KiB layout threshold (docs/operations.md §13.6)
        messages.append({"role": "assistant", "content": "x" * draw(st.integers(1900, 2200))})
    pairs.append(("messages", messages))
    for key in draw(st.permutations(list(OPTIONAL))):
        if draw(st.booleans()):
            pairs.append((key, draw(OPTIONAL[key])))
    for _ in range(draw(st.integers(0, 2))):  # a top-level key again, elsewhere
        key = draw(st.sampled_from([*EDITED, "model", "extra"]))
        strategy = OPTIONAL.get(key, st.just("m"))
        pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(strategy)))
    # (rare cases: drawn as one value of a range, not 0, which Hypothesis favours)
    if draw(st.integers(0, 9)) == 7:  # very deep nesting, either side of the limit
        depth = draw(st.sampled_from([20, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 5]))
        pairs.append(("deep", Raw("[" * depth + "]" * depth)))
    if draw(st.integers(0, 29)) == 7:  # an integer json.loads refuses (over 4,300 digits)
        pairs.append(("huge", Raw("9" * 4301)))
    if draw(st.integers(0, 19)) == 7:  # a lone surrogate escape
        pairs.append(("lone", Raw('"\\ud800"')))
    text = draw(WS) + draw(_write(Dup(pairs))) + draw(WS)
    form = draw(st.sampled_from(["utf-8"] * 8 + ["bom", "utf-16", "garbage"]))
    if form == "bom":
        return codecs.BOM_UTF8 + text.encode("utf-8"), form
    if form == "utf-16":
        return text.encode("utf-16-le"), form
    if form == "garbage":
        return text.encode("utf-8") + draw(st.sampled_from([b"x", b"{}", b",", b"]", b"\x00"])), form
    return text.encode("utf-8"), form


# ------------------------------------------------------------------------------------------------
# The references
# ------------------------------------------------------------------------------------------------


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(map(_non_finite, value.values()))
    if isinstance(value, list):
        return any(map(_non_finite, value))
    return False


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def documented_refusal(obj: dict[str, Any]) -> set[str | None]:
    """The ``param`` values of the 400s agentd documents for a body ``json.loads`` accepts
    (docs/operations.md §12, §14), empty when it must be accepted; ``None`` = ``invalid_json``."""
    out: set[str | None] = set()
    if _depth(obj) > MAX_DEPTH:
        out.add(None)
    if _has_lone_surrogate(obj):
        out.add(None)
    stream = obj.get("stream")
    if stream is not None and not isinstance(stream, bool):
        out.add("stream")
    options = obj.get("stream_options")
    if isinstance(options, dict):
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            out.add("stream_options.include_usage")
    temperature = obj.get("temperature")
    if isinstance(temperature, float) and not math.isfinite(temperature):
        out.add("temperature")
    xargs = obj.get("vllm_xargs")
    context = xargs.get("agentic_context") if isinstance(xargs, dict) else None
    if isinstance(context, dict) and _non_finite(context):
        out.add("vllm_xargs.agentic_context")  # (a prefix: the param names the member)
    return out


def reference_edit(obj: dict[str, Any], mode: str, wants_usage: bool) -> dict[str, Any]:
    """What the worker must receive: the decoded body with agentd's edits (docs/operations.md
    §13.6, docs/priority.md §5.4), written here independently of agentd's code."""
    out = dict(obj)
    xargs = out.get("vllm_xargs")
    if mode != "unchanged" and isinstance(xargs, dict) and "agentic_context" in xargs:
        xargs = dict(xargs)
        if mode == "strip":
            del xargs["agentic_context"]
        elif isinstance(xargs["agentic_context"], dict):
            xargs["agentic_context"] = json.dumps(xargs["agentic_context"], separators=(",", ":"), ensure_ascii=False)
        if xargs:
            out["vllm_xargs"] = xargs
        else:
            del out["vllm_xargs"]
    out.pop("priority", None)  # a stock worker never sees it
    options = out.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    if out.get("stream") is True and wants_usage and not asked:
        options = dict(options) if isinstance(options, dict) else {}
        options["include_usage"] = True
        if options.get("continuous_usage_stats"):
            # the client asked for no usage, so it must not get usage on every chunk either
            options["continuous_usage_stats"] = False
        out["stream_options"] = options
    return out


def _same(a: Any, b: Any) -> bool:
    """JSON equality with the number's type kept (1 is not 1.0) and NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _top_level_keys(raw: bytes) -> list[str]:
    keys: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys[:] = [k for k, _ in pairs]  # the top level is the last object closed
        return dict(pairs)

    json.loads(raw, object_pairs_hook=hook)
    return keys


ENGINES = {mode: make_engine(mode, priority_worker=False) for mode in ("strip", "json_string", "unchanged")}


def check(raw: bytes, mode: str, wants_usage: bool) -> None:
    engine = ENGINES[mode]
    try:
        obj = json.loads(raw)
        loads_error = None
    except (ValueError, RecursionError) as exc:
        obj, loads_error = None, exc
    try:
        req = engine.build_request("chat", raw, {"content-type": "application/json"})
    except ApiError as error:
        event(f"refused: {error.param}")
        assert error.status == 400, (error.status, error.body())
        if loads_error is not None:
            assert error.code == "invalid_json" and error.param is None, error.body()
            return
        assert isinstance(obj, dict)
        allowed = documented_refusal(obj)
        param = error.param
        if param is not None and param.startswith("vllm_xargs.agentic_context"):
            param = "vllm_xargs.agentic_context"
        assert param in allowed, (error.body(), allowed)
        return
    assert loads_error is None, f"accepted what json.loads refuses: {loads_error}"
    assert isinstance(obj, dict)
    assert not documented_refusal(obj), (documented_refusal(obj), obj)
    # agentd reads the fields it needs as json.loads does
    assert _same(req.body, obj)
    assert req.stream == (obj.get("stream") is True)
    assert req.model == obj.get("model")
    xargs = obj.get("vllm_xargs")
    context = xargs.get("agentic_context") if isinstance(xargs, dict) else None
    if isinstance(context, dict):
        assert req.identity is not None
        identity = req.identity.identity
        assert identity.program_id == context["program_id"]
        assert identity.step_id == context.get("step_id")
        assert identity.task_id == context.get("task_id", identity.task_id)
    else:
        assert req.identity is None
    # the forwarded bytes
    sent, injected = engine._outgoing_body(req, Lease(wants_usage), raw)  # type: ignore[arg-type]
    expected = reference_edit(obj, mode, wants_usage)
    if _same(expected, obj):
        event("forwarded unchanged")
        assert sent == raw  # no edit: the client's bytes, unchanged
        return
    size = "large" if len(raw) >= 2048 else "small"
    event(f"edited, {'with' if req.layout is not None else 'without'} a layout, {size}")
    assert _same(json.loads(sent), expected), (sent[:400], expected)
    keys = _top_level_keys(sent)
    assert len(keys) == len(set(keys)), f"the worker would see a key twice: {keys}"
    options = obj.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    assert injected == (obj.get("stream") is True and wants_usage and not asked)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=bodies(), mode=st.sampled_from(["strip", "json_string", "unchanged"]), wants_usage=st.booleans())
@example(  # NaN inside an object context, forwarded as a JSON string: a 500 before session 32
    body=(b'{"model":"m","messages":[{"role":"user","content":"x"}],'
          b'"vllm_xargs":{"agentic_context":{"program_id":"p","note":NaN}}}', "utf-8"),
    mode="json_string", wants_usage=False,
)  # fmt: skip
@example(  # the edited member repeated, small body: the worker saw vllm_xargs twice
    body=(b'{"model":"m","messages":[{"role":"user","content":"x"}],'
          b'"vllm_xargs":{"agentic_context":{"program_id":"p"}},"vllm_xargs":{"agentic_context":{"program_id":"q"}}}',
          "utf-8"),
    mode="strip", wants_usage=False,
)  # fmt: skip
@example(  # the same with the first key spelt with an escape
    body=(b'{"model":"m","messages":[{"role":"user","content":"x"}],'
          b'"vllm_\\u0078args":{"agentic_context":{"program_id":"p"}},"vllm_xargs":{"agentic_context":{"program_id":"q"}}}',
          "utf-8"),
    mode="strip", wants_usage=False,
)  # fmt: skip
@example(  # continuous usage stats without include_usage: the client must get no usage at all
    body=(b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,'
          b'"stream_options":{"include_usage":false,"continuous_usage_stats":true}}', "utf-8"),
    mode="strip", wants_usage=True,
)  # fmt: skip
def test_forwarded_body_is_the_decoded_edited_body(body: tuple[bytes, str], mode: str, wants_usage: bool) -> None:
    raw, _form = body
    check(raw, mode, wants_usage)
