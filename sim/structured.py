"""Structured output for the simulated backend: JSON text of a planned length (docs/simulator.md §3).

A request with ``response_format`` ``{"type": "json_object"}`` or ``{"type": "json_schema",
"json_schema": {"schema": ...}}`` (vLLM's older ``guided_json`` too) is answered with JSON instead
of pseudo-text.  For a schema, the value has its basic shape: the ``required`` properties of an
object (every property when the schema lists none), each of its JSON type (``const`` and the first
``enum`` value win; the first of ``anyOf``/``oneOf``/``allOf``; the first non-null type of a type
list; a local ``$ref`` is followed); an array is empty unless ``minItems`` asks for items.  The
pseudo-words of the usual output fill the string values, so the text has exactly the planned
number of tokens when a string value can take them; a schema without a string is answered with its
value's own tokens, fewer than planned, ending there as guided decoding ends it.  An output planned
shorter than the smallest value is cut there, as a real server cut by ``max_tokens`` is (the text
is then not JSON; ``json_pieces`` says so, and the request ends with ``length``, a whole value with
``stop``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sim import tokenizer

MAX_DEPTH = 16  # deeper schemas end in null
MAX_ITEMS = 8  # minItems beyond this is not honoured

# A template: literal text and string slots (the slot's index), rendered with the slots' words.
Template = list[str | int]


class FormatError(ValueError):
    """A malformed ``response_format`` or ``guided_json``: vLLM's 400 naming ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def json_target(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The schema the output must match (``{}`` for any JSON object), None for plain text; a
    malformed format raises :class:`FormatError`."""
    where = "response_format"
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise FormatError(where, "must be an object")
        kind = rf.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return {}
        if kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema", {}) if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise FormatError(f"{where}.json_schema", "must be an object with a 'schema' object")
            return schema
        raise FormatError(f"{where}.type", f"must be text, json_object or json_schema, got {kind!r}")
    guided = body.get("guided_json")
    if guided is None:
        return None
    if isinstance(guided, str):
        try:
            guided = json.loads(guided)
        except ValueError:
            raise FormatError("guided_json", "not a JSON schema") from None
    if not isinstance(guided, dict):
        raise FormatError("guided_json", "must be a JSON schema object")
    return guided


def _resolve(root: Mapping[str, Any], ref: str) -> Any:
    """The schema a local ``$ref`` (``#/$defs/Step``, ``#/definitions/Step``, ``#``) names, else ``{}``."""
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for part in [p for p in ref[1:].split("/") if p]:
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _template(
    schema: Any, out: Template, slots: list[int], depth: int, *, top: bool = False, root: Mapping[str, Any]
) -> None:
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        out.append("null" if depth > MAX_DEPTH else "{}")
        return
    ref = schema.get("$ref")
    if isinstance(ref, str):
        # a nested model (pydantic writes every one as {"$ref": "#/$defs/Name"}); before session 41
        # it was taken as a string, which the client's parse() refused
        _template(_resolve(root, ref), out, slots, depth + 1, top=top, root=root)
        return
    if "const" in schema:
        out.append(json.dumps(schema["const"]))
        return
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        out.append(json.dumps(enum[0]))
        return
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            _template(options[0], out, slots, depth + 1, top=top, root=root)
            return
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if ("properties" in schema or top) else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            if top:  # any JSON object: one string member carries the text
                props, required = {"answer": {"type": "string"}}, ["answer"]
            else:
                out.append("{}")
                return
        else:
            given = schema.get("required")
            required = [k for k in given if k in props] if isinstance(given, list) else list(props)
        out.append("{")
        for i, key in enumerate(required):
            out.append(("" if i == 0 else ", ") + json.dumps(key) + ": ")
            _template(props[key], out, slots, depth + 1, root=root)
        out.append("}")
    elif kind == "array":
        n = schema.get("minItems")
        n = min(n, MAX_ITEMS) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
        out.append("[")
        for i in range(n):
            if i:
                out.append(", ")
            _template(schema.get("items", {}), out, slots, depth + 1, root=root)
        out.append("]")
    elif kind == "string":
        slots.append(len(slots))
        out.append(slots[-1])
    elif kind in ("integer", "number"):
        low = schema.get("minimum")
        value = low if isinstance(low, (int, float)) and not isinstance(low, bool) else 0
        out.append(json.dumps(int(value) if kind == "integer" else value))
    elif kind == "boolean":
        out.append("true")
    else:
        out.append("null")


def _render(template: Template, n_slots: int, words: list[str]) -> str:
    parts = [" ".join(words[i::n_slots]) for i in range(n_slots)] if n_slots else []
    return "".join(p if isinstance(p, str) else '"' + parts[p] + '"' for p in template)


def json_pieces(seed_material: str, n_tokens: int, schema: dict[str, Any]) -> tuple[list[str], bool]:
    """Token pieces of JSON text matching ``schema``'s basic shape, ``n_tokens`` of them, and whether
    that text is the whole value (False: cut, the planned tokens are fewer than its smallest text)."""
    template: Template = []
    slots: list[int] = []
    _template(schema, template, slots, 0, top=True, root=schema)
    words = tokenizer.generate_words(seed_material, n_tokens) if slots else []

    def count(w: int) -> int:
        return tokenizer.count_tokens(_render(template, len(slots), words[:w]))

    w = 0
    if slots:
        # the count grows by one token per word (words are 2-3 letters, one piece each)
        w = max(0, min(len(words), n_tokens - count(0)))
        while w > 0 and count(w) > n_tokens:
            w -= 1
        while w < len(words) and count(w + 1) <= n_tokens:
            w += 1
    pieces = tokenizer.split_pieces(_render(template, len(slots), words[:w]))
    if len(pieces) > n_tokens:
        return pieces[:n_tokens], False  # cut short, as max_tokens cuts a real answer
    # fewer pieces than planned only when no string carries words: the value is whole and ends
    # there, as guided decoding ends it (padding it out re-tokenized to fewer tokens than counted)
    return pieces, True
