"""Credential redaction for everything agentd shows: logs, metrics labels, diagnostics, error
bodies (docs/operations.md §10).

:func:`redact` replaces the user-info of URLs (``http://user:pass@host`` -> ``http://***@host``),
bearer tokens and ``api_key=``-style values with ``***``; :func:`redact_url` is the URL form used
for target ids.  Pure string functions, no imports of ours, so every layer of the edge can use them.
"""

from __future__ import annotations

import re

MASK = "***"
# user-info before a host; not the ``@<rank>`` suffix of a target id (``http://w0:8000@1``)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@(?!\d+(?![\w.-]))")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]+")
_KEY_VALUE = re.compile(r"(?i)\b((?:api[_-]?key|password|passwd|secret|token)[\"']?\s*[=:]\s*[\"']?)[^\s\"',;&]+")


def redact(text: str) -> str:
    """``text`` with credentials masked (cheap when there is nothing to mask)."""
    if "@" in text:
        text = _USERINFO.sub(rf"\g<1>{MASK}@", text)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(rf"\g<1>{MASK}", text)
    if "=" in text or ":" in text:
        text = _KEY_VALUE.sub(rf"\g<1>{MASK}", text)
    return text


def redact_url(url: str) -> str:
    return _USERINFO.sub(rf"\g<1>{MASK}@", url) if "@" in url else url
