"""argparse value types shared by the sub-commands.

Each raises ``argparse.ArgumentTypeError`` with the rule and the value, so argparse prints
``agentd <command>: error: argument --flag: <rule>, got '<value>'`` and exits 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import httpx


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


positive_int = int_at_least(1)


def int_within(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be an integer within [{minimum}, {maximum}], got {text!r}")
        return value

    return parse


def positive_int_list(text: str) -> list[int]:
    """Comma-separated integers >= 1 (e.g. ``--bodies 1,64,256``)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}")
    return values


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def finite_at_least(minimum: float) -> Callable[[str], float]:
    """A finite number >= ``minimum``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value >= minimum and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum:g}, got {text!r}")
        return value

    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """A number within ``(low, high]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low < value <= high:
            raise argparse.ArgumentTypeError(f"must be a number > {low:g} and <= {high:g}, got {text!r}")
        return value

    return parse


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number within [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number within [0, 1], got {text!r}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 65535], got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 65535], got {text!r}")
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def http_url_problem(flag: str, text: str) -> str | None:
    """Why ``text`` (given as ``flag``) is not an http(s) URL with a host, or None; checked before
    any work (``agentd batch``, ``replay`` and ``calibrate``): a URL httpx cannot parse
    (``http://[::1``) was a traceback mid-run, from the first request or ``/metrics`` scrape."""
    try:
        url = httpx.URL(text)
        usable = url.scheme in ("http", "https") and bool(url.host)
    except httpx.InvalidURL:
        usable = False
    return None if usable else f"{flag}: must be an http:// or https:// URL with a host, got {text!r}"
