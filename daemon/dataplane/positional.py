"""A positional codec for the data-plane frames: attrs values <-> nested JSON-ready lists.

Each attrs class becomes the list of its ``init`` fields in declaration order (no field names on
the wire), nested attrs values nested lists, tuples lists, ``None`` ``null``.  The encoder and the
decoder of every class are generated once, from the class's resolved field types, as plain Python
functions (no per-value type dispatch), which is what makes them several times cheaper than the
general-purpose cattrs converter they replace (docs/benchmarks.md §10.3.1).  A decoder unpacks the
list into locals and tests each primitive's type inline, calling a checker only to raise
(docs/benchmarks.md §10.3.4).

Decoding checks every value's JSON type against the field type (an ``int`` field takes only an
integer, a ``float`` field an integer or a float, which it turns into a float) and every list's
length, so a frame that does not match the classes raises :class:`PositionalError` instead of
building a wrong value.  Supported field types: ``int``, ``float``, ``str``, ``bool``, ``None``,
``NewType`` of those, attrs classes, ``tuple[X, ...]`` and ``X | None`` of any of these.  Any other
type raises ``TypeError`` when the codec is built (at import), never at run time.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

import attrs


class PositionalError(ValueError):
    """A list that does not match the class it is decoded as."""


def _int(x: Any) -> int:
    if type(x) is not int:
        raise PositionalError(f"expected an integer, got {type(x).__name__}")
    return x


def _float(x: Any) -> float:
    t = type(x)
    if t is float:
        return x
    if t is int:
        return float(x)
    raise PositionalError(f"expected a number, got {t.__name__}")


def _str(x: Any) -> str:
    if type(x) is not str:
        raise PositionalError(f"expected a string, got {type(x).__name__}")
    return x


def _bool(x: Any) -> bool:
    if type(x) is not bool:
        raise PositionalError(f"expected a boolean, got {type(x).__name__}")
    return x


def _none(x: Any) -> None:
    if x is not None:
        raise PositionalError(f"expected null, got {type(x).__name__}")


def _list(x: Any, size: int, name: str) -> list[Any]:
    if type(x) is not list or len(x) != size:
        raise PositionalError(f"{name}: expected a list of {size} values")
    return x


def _seq(x: Any) -> list[Any]:
    if type(x) is not list:
        raise PositionalError(f"expected a list, got {type(x).__name__}")
    return x


_PRIMITIVE_CHECKS: dict[Any, str] = {int: "_int", float: "_float", str: "_str", bool: "_bool", type(None): "_none"}


class PositionalCodec:
    """Encoders and decoders of a closed set of attrs classes (and every attrs class they hold)."""

    def __init__(self, classes: tuple[type, ...]) -> None:
        self._namespace: dict[str, Any] = {
            "_int": _int,
            "_float": _float,
            "_str": _str,
            "_bool": _bool,
            "_none": _none,
            "_list": _list,
            "_seq": _seq,
        }
        self.encoders: dict[type, Callable[[Any], list[Any]]] = {}
        self.decoders: dict[type, Callable[[Any], Any]] = {}
        for cls in classes:
            self._build(cls)

    # ---- code generation ----------------------------------------------------------------------

    def _name(self, cls: type) -> str:
        return f"{cls.__module__.replace('.', '_')}_{cls.__qualname__.replace('.', '_')}"

    def _build(self, cls: type) -> str:
        name = self._name(cls)
        if cls in self.encoders:
            return name
        attrs.resolve_types(cls)
        fields = [f for f in attrs.fields(cls) if f.init]
        # register first: a class that holds itself (not used today) would recurse forever
        self._namespace[f"C_{name}"] = cls
        enc_parts = [self._enc(f.type, f"v.{f.name}") for f in fields]
        # the decoder unpacks the list into locals and checks each in place: a type test inline
        # for every primitive (no call unless it fails), a call only for nested values
        names = [f"v{i}" for i in range(len(fields))]
        size = len(fields)
        lines = [f"    if type(x) is not list or len(x) != {size}:", f"        _list(x, {size}, {cls.__qualname__!r})"]
        if fields:
            lines.append(f"    {', '.join(names)}, = x")
        for var, f in zip(names, fields, strict=True):
            lines += ["    " + line for line in self._dec_lines(f.type, var)]
        args = [f"{f.alias}={var}" if f.kw_only else var for var, f in zip(names, fields, strict=True)]
        source = (
            f"def enc_{name}(v):\n    return [{', '.join(enc_parts)}]\n"
            f"def dec_{name}(x):\n" + "\n".join(lines) + f"\n    return C_{name}({', '.join(args)})\n"
        )
        exec(compile(source, f"<positional codec of {cls.__qualname__}>", "exec"), self._namespace)
        self.encoders[cls] = self._namespace[f"enc_{name}"]
        self.decoders[cls] = self._namespace[f"dec_{name}"]
        return name

    def _enc(self, tp: Any, expr: str) -> str:
        tp = _base(tp)
        if attrs.has(tp):
            return f"enc_{self._build(tp)}({expr})"
        inner = _optional(tp)
        if inner is not None:
            encoded = self._enc(inner, expr)
            return expr if encoded == expr else f"(None if {expr} is None else {encoded})"
        item = _homogeneous_tuple(tp)
        if item is not None:
            encoded = self._enc(item, "y")
            return expr if encoded == "y" else f"[{encoded} for y in {expr}]"  # (JSON writes a tuple as a list)
        if tp in _PRIMITIVE_CHECKS:
            return expr
        raise TypeError(f"the positional codec does not support the field type {tp!r}")

    def _dec_lines(self, tp: Any, var: str) -> list[str]:
        """Statements that check the local ``var`` against ``tp`` (raising :class:`PositionalError`)
        and replace it by its decoded value where that differs."""
        tp = _base(tp)
        if attrs.has(tp):
            return [f"{var} = dec_{self._build(tp)}({var})"]
        inner = _optional(tp)
        if inner is not None:
            return [f"if {var} is not None:", *("    " + line for line in self._dec_lines(inner, var))]
        if _homogeneous_tuple(tp) is not None:
            return [f"{var} = {self._dec(tp, var)}"]
        if tp is float:
            return [f"if type({var}) is not float:", f"    {var} = _float({var})"]
        if tp is type(None):
            return [f"if {var} is not None:", f"    _none({var})"]
        check = _PRIMITIVE_CHECKS.get(tp)
        if check is not None:
            return [f"if type({var}) is not {tp.__name__}:", f"    {check}({var})"]
        raise TypeError(f"the positional codec does not support the field type {tp!r}")

    def _dec(self, tp: Any, expr: str) -> str:
        tp = _base(tp)
        if attrs.has(tp):
            return f"dec_{self._build(tp)}({expr})"
        inner = _optional(tp)
        if inner is not None:
            return f"(None if {expr} is None else {self._dec(inner, expr)})"
        item = _homogeneous_tuple(tp)
        if item is not None:
            return f"tuple([{self._dec(item, 'y')} for y in _seq({expr})])"
        check = _PRIMITIVE_CHECKS.get(tp)
        if check is not None:
            return f"{check}({expr})"
        raise TypeError(f"the positional codec does not support the field type {tp!r}")


def _base(tp: Any) -> Any:
    while isinstance(tp, typing.NewType):
        tp = tp.__supertype__
    return tp


def _optional(tp: Any) -> Any | None:
    """``X`` of ``X | None`` (None for any other type; other unions are unsupported)."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) != 1 or len(typing.get_args(tp)) != 2:
        raise TypeError(f"the positional codec supports only X | None unions, not {tp!r}")
    return args[0]


def _homogeneous_tuple(tp: Any) -> Any | None:
    if typing.get_origin(tp) is not tuple:
        return None
    args = typing.get_args(tp)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise TypeError(f"the positional codec supports only tuple[X, ...], not {tp!r}")
    return args[0]
