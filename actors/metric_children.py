"""Labelled metric children looked up once (docs/benchmarks.md §10.2.4).

``metric.labels(*values)`` takes the metric's lock, checks and converts every value and builds
the key on each call: about 3 µs, four to six times per proxied request.  :class:`Children`
keeps each child it handed out in a plain dict keyed by the label values, so a repeated
lookup is one dict access.  Only for label sets that are bounded (targets, endpoints, outcomes,
classes, the top-k tenant labels): every child stays for the life of the process, as it does in
the metric itself.  A value that is not a string is passed through to ``labels`` unchanged (it
converts it) and cached under the converted key only by the metric.
"""

from __future__ import annotations

from typing import Any


class Children:
    """``get(*values)``: ``metric.labels(*values)``, cached per tuple of values."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def get(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child
