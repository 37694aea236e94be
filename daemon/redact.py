"""Credential redaction for everything agentd shows: logs, metrics labels, diagnostics, error
bodies (docs/operations.md §10).

:func:`redact` replaces the user-info of URLs (``http://user:pass@host`` -> ``http://***@host``),
bearer tokens, HTTP Basic credentials and ``api_key=``-style values with ``***``; :func:`redact_url`
is the URL form used for target ids.  Pure string functions, no imports of ours, so every layer of
the edge can use them.
"""

from __future__ import annotations

import base64
import re

MASK = "***"
# user-info before a host, up to the authority's last "@" (a password with a raw "@",
# "http://u:pa55@word@w0:8000", is user-info "u:pa55@word" to httpx and urllib, which send it so:
# before session 44 "word" was shown); not the ``@<rank>`` suffix of a target id
# (``http://w0:8000@1``).  The characters are user-info's (RFC 3986 §3.2.1) and "@", so a quote
# ends it and a URL inside compact JSON never runs into the next member
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[\w\-.~%!$&'()*+,;=:@]+@(?!\d+(?![\w.-]))")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]+")
# HTTP Basic credentials, base64 of user:password (a worker URL's user-info is sent so, and a worker
# echoing its Authorization header in an error would show them): only a token that decodes to
# something with a colon, so "basic questions" stays as it is
_BASIC = re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{4,}={0,2})")
_KEY_VALUE = re.compile(r"(?i)\b((?:api[_-]?key|password|passwd|secret|token)[\"']?\s*[=:]\s*[\"']?)[^\s\"',;&]+")


def redact(text: str) -> str:
    """``text`` with credentials masked (cheap when there is nothing to mask)."""
    if "@" in text:
        text = _USERINFO.sub(rf"\g<1>{MASK}@", text)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(rf"\g<1>{MASK}", text)
    if "asic" in text or "ASIC" in text:
        text = _BASIC.sub(_basic_masked, text)
    if "=" in text or ":" in text:
        text = _KEY_VALUE.sub(rf"\g<1>{MASK}", text)
    return text


def _basic_masked(match: re.Match[str]) -> str:
    token = match.group(2)
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except ValueError:
        return match.group(0)
    return f"{match.group(1)}{MASK}" if b":" in decoded else match.group(0)


def redact_url(url: str) -> str:
    return _USERINFO.sub(rf"\g<1>{MASK}@", url) if "@" in url else url
