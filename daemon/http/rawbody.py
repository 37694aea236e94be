"""Request bodies as bytes: the top-level JSON object with the spans of its members, and edits
of top-level members that splice the original bytes instead of re-encoding the whole body
(docs/operations.md §13, "Large bodies").

Agent bodies are large (100 KB+ of conversation) and agentd rewrites only small top-level members
of them: ``vllm_xargs`` (the agentic context stripped or re-encoded), ``priority`` (set or
removed) and ``stream_options`` (``include_usage`` injected).  :func:`parse_object` decodes the
body exactly as ``json.loads`` does - the same C scanner decodes each member's value, so values,
number types and errors are the same - and records where each top-level member starts and ends;
:meth:`Layout.rebuild` then writes the edited members and copies everything else byte for byte.

Whenever the member-wise parse meets something it does not handle (a body that is not a JSON
object, another encoding than UTF-8, invalid JSON of any kind) it defers to ``json.loads``, so
every invalid body raises exactly the error it raised before.  :meth:`Layout.rebuild` returns None
when a raw edit is not possible (a top-level key given twice): the caller re-encodes the decoded
body then and counts the fallback.

Large bodies skip the UTF-8 decode of the whole body (docs/operations.md §13.6): unless the body
holds a ``\\u`` escape next to non-ASCII bytes, the C scanner runs over the body's bytes read as
Latin-1 (one character per byte, a copy at memory speed, and scanning one-byte characters is
cheaper than the two-byte text an emoji or a CJK word makes of the whole body).  JSON's syntax is
ASCII, so this finds the same structure, numbers and escapes, and character offsets are byte
offsets; a string that holds non-ASCII bytes comes out as those bytes, one character each, and
:func:`fix_and_check_depth` decodes just those strings as UTF-8 (surrogates passed, as
``json.loads`` does) while it checks the nesting depth, which the caller needs anyway.  A string
that is not valid UTF-8 sends the body to ``json.loads``, which raises its own error.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, Final

__all__ = ["DELETE", "MIN_LAYOUT_BYTES", "Layout", "TooDeep", "edit_last_member", "fix_and_check_depth", "parse_object"]

# Below this size a body is decoded by json.loads alone and re-encoded when edited: the layout's
# bookkeeping (a few microseconds) costs more than re-encoding a body that small.
MIN_LAYOUT_BYTES = 2048

_DECODER = json.JSONDecoder()
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]  # the C scanner json.loads runs
_WS = re.compile(r"[ \t\n\r]*")
# any \u escape: with non-ASCII bytes beside it a Latin-1 scan could not tell the escape's
# character from raw bytes, so such a body is decoded as UTF-8 first (one search at C speed)
_U_ESCAPE = re.compile(rb"\\u")
# a string after "{" or "," holding a \u escape: every member key spelt with an escape, also some
# array items (a false match only costs a member-wise scan of a small body, :func:`edit_last_member`);
# linear: the string part cannot match "\u" itself, so each attempt stops at its first escape or quote
_ESCAPED_KEY = re.compile(rb'[{,][ \t\n\r]*"(?:[^"\\]|\\[^u])*\\u')


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE: Final = _Delete()  # a :meth:`Layout.rebuild` change that removes the member


class TooDeep(ValueError):
    """The body nests arrays/objects deeper than the ``max_depth`` given to :func:`parse_object`."""


class _NotHandled(Exception):
    """The member-wise parse does not handle this body: ``json.loads`` decides."""


class Layout:
    """Where the top-level members of one UTF-8 JSON object are.

    ``members``: (key, key start, value start, value end) in body order, duplicates included;
    offsets are bytes of ``raw`` when ``text`` is None (the Latin-1 scan), else characters of
    ``text`` (the body decoded as UTF-8).
    """

    __slots__ = ("_ascii", "duplicates", "members", "raw", "text")

    def __init__(
        self, raw: bytes, text: str | None, members: list[tuple[str, int, int, int]], duplicates: bool
    ) -> None:
        self.raw = raw
        self.text = text
        self.members = members
        self.duplicates = duplicates
        self._ascii = text is None or text.isascii()

    def _byte(self, index: int) -> int:
        """The byte offset in ``raw`` of offset ``index`` (encoding the shorter side of ``text``)."""
        if self._ascii:
            return index
        text = self.text
        assert text is not None
        if index <= len(text) - index:
            return len(text[:index].encode("utf-8", "surrogatepass"))
        return len(self.raw) - len(text[index:].encode("utf-8", "surrogatepass"))

    def value_bytes(self, start: int, end: int) -> bytes:
        """The raw bytes between two offsets of :attr:`members`."""
        return self.raw[self._byte(start) : self._byte(end)]

    def rebuild(self, changes: Mapping[str, Any]) -> bytes | None:
        """The body with each key of ``changes`` set to its value (:data:`DELETE` removes it; a key
        the body lacks is appended), every other member copied byte for byte; None when a raw edit
        is not possible (a top-level key appears more than once).

        The result decodes to the same JSON value as re-encoding the decoded body with the same
        changes; whitespace around members may differ."""
        if self.duplicates:
            return None
        pieces: list[bytes] = []
        run_start = -1  # key start of the current run of unchanged members
        run_end = -1
        present: set[str] = set()
        for key, key_start, _, value_end in self.members:
            if key in changes:
                present.add(key)
                if run_start >= 0:
                    pieces.append(self.raw[self._byte(run_start) : self._byte(run_end)])
                    run_start = -1
                value = changes[key]
                if value is not DELETE:
                    pieces.append(_member(key, value))
            else:
                if run_start < 0:
                    run_start = key_start
                run_end = value_end
        if run_start >= 0:
            pieces.append(self.raw[self._byte(run_start) : self._byte(run_end)])
        for key, value in changes.items():
            if key not in present and value is not DELETE:
                pieces.append(_member(key, value))
        return b"{" + b",".join(pieces) + b"}"


_WS_BYTES = b" \t\n\r"
_NEEDLES: dict[str, bytes] = {}  # a key as json.dumps writes it


def edit_last_member(raw: bytes, body: dict[str, Any], key: str, value: Any) -> bytes | None:
    """``raw`` (a body without a :class:`Layout`, ``body`` its decoded value) with its **last**
    top-level member ``key`` set to ``value`` (:data:`DELETE` removes it), splicing the bytes
    without a layout; None when that member is not the body's last one as written (the caller
    re-encodes then).

    For a small body whose one edited member ends it (an agent SDK appends ``vllm_xargs`` from
    its extra body last): one search from the end and a scan of that member's value, where
    re-encoding the body walks all of it (docs/benchmarks.md §10.2.7).  Valid JSON (``body``
    came from it) makes the checks sufficient: a ``"key"`` preceded by ``{`` or ``,`` and followed
    by ``:`` is a member's key, not text inside a string (a quote inside a string follows a
    backslash), and the object it belongs to is closed by the body's last ``}`` when only
    whitespace and that brace follow its value.  The textually last top-level occurrence of a
    key is the one ``json.loads`` keeps.  A body that may hold a top-level key twice (the needle
    found twice, or a key spelt with a ``\\u`` escape before it) is scanned member by member, and
    one that does is left to re-encoding, so the worker sees each key once (before session 32 the
    first copy of a repeated ``vllm_xargs``, agentic context included, stayed)."""
    if not body or next(reversed(body)) != key or raw.lstrip(_WS_BYTES)[:1] != b"{":
        return None  # (a byte-order mark or UTF-16/32: re-encoded, as without a layout)
    needle = _NEEDLES.get(key)
    if needle is None:
        needle = _NEEDLES[key] = json.dumps(key).encode()  # (the few keys agentd edits)
    at = raw.rfind(needle)
    if at < 0:
        return None
    head = raw[:at].rstrip(_WS_BYTES)
    if raw.find(needle, 0, at) >= 0 or (_U_ESCAPE.search(raw, 0, at) and _ESCAPED_KEY.search(head) is not None):
        # the key written twice, or a key spelt with an escape ("vllm_\u0078args"): one may be a
        # top-level key given twice, which is re-encoded so that the worker sees it once
        try:
            if _members(raw.decode("utf-8", "surrogatepass"))[2]:
                return None
        except (UnicodeDecodeError, _NotHandled):
            return None
    opener = head[-1:]
    if opener not in (b",", b"{"):
        return None
    try:
        tail = raw[at + len(needle) :].decode("utf-8", "surrogatepass")
        colon = _ws(tail, 0)
        if tail[colon] != ":":
            return None
        found, end = _SCAN(tail, _ws(tail, colon + 1))
    except (UnicodeDecodeError, ValueError, IndexError, StopIteration):
        return None
    if tail[end:].strip(" \t\n\r") != "}" or found != body[key]:
        return None
    if value is DELETE:
        return (head[:-1] if opener == b"," else head) + b"}"
    return head + _member(key, value) + b"}"


def _member(key: str, value: Any) -> bytes:
    # ASCII escapes, as json.dumps(body) writes them: a lone surrogate can never break the encoding
    return f"{json.dumps(key)}:{json.dumps(value)}".encode()


def _ws(text: str, index: int) -> int:
    return _WS.match(text, index).end()  # type: ignore[union-attr]  # matches the empty string


# Top-level members read one by one at most: a request has a few dozen, and the member-wise walk
# costs about three times json.loads per member (a 12 MB body of a million members took 2.3 s of
# the event loop instead of 0.7 s). Past this the body is parsed by json.loads and edited by
# re-encoding.
_MAX_MEMBERS = 1024


def _members(text: str) -> tuple[dict[str, Any], list[tuple[str, int, int, int]], bool]:
    """The object ``text`` holds and its members; :class:`_NotHandled` for anything else."""
    try:
        i = _ws(text, 0)
        if text[i] != "{":
            raise _NotHandled
        obj: dict[str, Any] = {}
        members: list[tuple[str, int, int, int]] = []
        i = _ws(text, i + 1)
        if text[i] == "}":
            end = i + 1
        else:
            while True:
                if text[i] != '"':
                    raise _NotHandled
                key, j = scanstring(text, i + 1, True)
                j = _ws(text, j)
                if text[j] != ":":
                    raise _NotHandled
                start = _ws(text, j + 1)
                value, value_end = _SCAN(text, start)
                obj[key] = value
                members.append((key, i, start, value_end))
                if len(members) > _MAX_MEMBERS:
                    raise _NotHandled  # json.loads alone, without a layout (docs/operations.md §13.6)
                j = _ws(text, value_end)
                if text[j] == ",":
                    i = _ws(text, j + 1)
                    continue
                if text[j] != "}":
                    raise _NotHandled
                end = j + 1
                break
        if _ws(text, end) != len(text):
            raise _NotHandled  # extra data after the object
    except (ValueError, IndexError, StopIteration) as exc:
        raise _NotHandled from exc
    return obj, members, len(obj) != len(members)


def _utf8(text: str) -> str:
    """A string of the Latin-1 scan (one character per byte) as the UTF-8 text it holds."""
    return text.encode("latin-1").decode("utf-8", "surrogatepass")


_CONTAINERS = (dict, list)


def fix_and_check_depth(value: Any, limit: int, latin1: bool) -> bool:
    """Whether ``value`` nests arrays/objects more than ``limit`` levels deep, walking it level by
    level without recursion (one comprehension per level, not per container); with ``latin1`` also
    decodes, in place, every non-ASCII string (keys included) that the Latin-1 scan produced
    (``UnicodeDecodeError`` when one is not UTF-8)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        dicts = [x for x in level if type(x) is dict]
        lists = [x for x in level if type(x) is list] if len(dicts) < len(level) else []
        if latin1:
            if not "".join([k for d in dicts for k in d]).isascii():
                for d in dicts:  # a non-ASCII key (rare): rebuild that object, keeping the order
                    if not "".join(d).isascii():
                        fixed = {(k if k.isascii() else _utf8(k)): v for k, v in d.items()}
                        d.clear()
                        d.update(fixed)
            for obj, key in [(d, k) for d in dicts for k, v in d.items() if type(v) is str and not v.isascii()]:
                obj[key] = _utf8(obj[key])
            for arr, i in [(a, i) for a in lists for i, v in enumerate(a) if type(v) is str and not v.isascii()]:
                arr[i] = _utf8(arr[i])
        level = [v for d in dicts for v in d.values() if type(v) in _CONTAINERS]
        if lists:
            level += [v for a in lists for v in a if type(v) in _CONTAINERS]
    return False


def parse_object(raw: bytes, min_bytes: int = 0, max_depth: int | None = None) -> tuple[Any, Layout | None]:
    """``json.loads(raw)`` and, when it is a UTF-8 JSON object of at least ``min_bytes``, its
    :class:`Layout`.

    Raises exactly what ``json.loads(raw)`` raises for a body it refuses (``RecursionError`` for
    nesting deeper than the interpreter allows included).  With ``max_depth``, a body nesting
    arrays/objects deeper than that raises :class:`TooDeep` (checked during the walk the Latin-1
    scan needs anyway, docs/operations.md §13.6)."""
    if len(raw) >= min_bytes and json.detect_encoding(raw) == "utf-8":
        try:
            ascii_body = raw.isascii()
            if ascii_body or _U_ESCAPE.search(raw) is None:
                obj, members, duplicates = _members(raw.decode("latin-1"))
                if not ascii_body:
                    members = [(k if k.isascii() else _utf8(k), a, b, c) for k, a, b, c in members]
                if (max_depth is not None or not ascii_body) and fix_and_check_depth(
                    obj, max_depth if max_depth is not None else sys.maxsize, not ascii_body
                ):
                    if not ascii_body:  # the walk stopped early: invalid UTF-8 below is reported first
                        raw.decode("utf-8", "surrogatepass")
                    raise TooDeep
                return obj, Layout(raw, None, members, duplicates)
            text = raw.decode("utf-8", "surrogatepass")  # what json.loads does with bytes
            obj, members, duplicates = _members(text)
        except (UnicodeDecodeError, _NotHandled):
            pass
        else:
            if max_depth is not None and fix_and_check_depth(obj, max_depth, False):
                raise TooDeep
            return obj, Layout(raw, text, members, duplicates)
    obj = json.loads(raw)
    if max_depth is not None and fix_and_check_depth(obj, max_depth, False):
        raise TooDeep
    return obj, None
