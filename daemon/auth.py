"""API keys at the edge: who is calling, and which routes they may use (docs/operations.md §10).

Keys are never stored: the configuration holds ``"<tenant>:<sha256 hex>"`` entries (``[auth]
api_keys`` and/or one per line in ``api_keys_file``) and sha256 digests of admin keys
(``admin_keys``).  A presented key (``Authorization: Bearer <key>``, or ``X-Api-Key``) is hashed
once and compared with *every* stored digest with :func:`hmac.compare_digest`, so neither the
comparison nor the number of comparisons depends on which digest matched.  API keys are long
random tokens, so an unsalted sha256 is enough (nothing to brute-force); ``printf %s "$KEY" |
sha256sum`` prints the digest to configure.

:func:`scope_identity` namespaces Program identity by tenant: with authentication on, a client's
``program_id`` (and task/session/parent/root ids) become ``<tenant>/<id>`` before the scheduler
sees them, so one tenant can never join, extend or steal another tenant's Program by naming it.
Without keys nothing changes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path

import attrs

from daemon.config import AuthConfig, valid_key_entry
from daemon.config_loading import read_problem
from daemon.http.errors import ApiError
from daemon.http.identity import ParsedIdentity

BEARER = "bearer "
KEY_HEADER = "x-api-key"
MAX_KEY_CHARS = 512


class AuthFileError(Exception):
    """The key file cannot be read or has a bad line (names the file and the line)."""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def read_key_file(path: str) -> tuple[str, ...]:
    """The ``tenant:sha256`` entries of a key file (blank lines and ``#`` comments skipped)."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError(f"auth.api_keys_file: cannot read {path!r} ({read_problem(exc)})") from None
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not valid_key_entry(line):
            raise AuthFileError(
                f'auth.api_keys_file: line {number} of {path!r} must be "<tenant>:<sha256 hex of the key>"'
            )
        entries.append(line)
    return tuple(entries)


@attrs.frozen(eq=False)
class Authenticator:
    """Maps a request's key to its tenant; ``enabled`` is False when no key is configured."""

    tenants: tuple[tuple[bytes, str], ...]  # (sha256 digest, tenant)
    admin: tuple[bytes, ...]
    enabled: bool

    @classmethod
    def from_config(cls, cfg: AuthConfig) -> Authenticator:
        entries = list(cfg.api_keys)
        if cfg.api_keys_file:
            from_file = read_key_file(cfg.api_keys_file)
            if not from_file and not entries:
                # authentication on with no key at all would refuse every request with a 401
                raise AuthFileError(
                    f"auth.api_keys_file: {cfg.api_keys_file!r} holds no key: add one "
                    '"<tenant>:<sha256 hex of the key>" line per client, or leave it unset to serve '
                    "without authentication"
                )
            entries.extend(from_file)
        tenants = []
        for entry in entries:
            tenant, hexdigest = entry.rsplit(":", 1)
            tenants.append((bytes.fromhex(hexdigest), tenant))
        admin = tuple(bytes.fromhex(h) for h in cfg.admin_keys)
        return cls(tuple(tenants), admin, cfg.enabled)

    @staticmethod
    def presented_key(headers: Mapping[str, str]) -> str | None:
        value = headers.get("authorization")
        if value is not None and value[: len(BEARER)].lower() == BEARER:
            return value[len(BEARER) :].strip()
        return headers.get(KEY_HEADER)

    def tenant_of(self, key: str | None) -> str | None:
        """The tenant whose key this is, else None (constant time over all stored digests)."""
        if key is None or not key or len(key) > MAX_KEY_CHARS:
            return None
        presented = digest(key)
        found: str | None = None
        for stored, tenant in self.tenants:
            if hmac.compare_digest(stored, presented) and found is None:
                found = tenant
        return found

    def is_admin(self, key: str | None) -> bool:
        if key is None or not key or len(key) > MAX_KEY_CHARS:
            return False
        presented = digest(key)
        ok = False
        for stored in self.admin:
            ok = hmac.compare_digest(stored, presented) or ok
        return ok

    def principal(self, headers: Mapping[str, str]) -> str | None:
        """The tenant of an agent-facing request; None when authentication is off.

        Raises a JSON 401 ``invalid_api_key`` for a missing or unknown key (never saying which)."""
        if not self.enabled:
            return None
        tenant = self.tenant_of(self.presented_key(headers))
        if tenant is None:
            # no "Bearer <key>" here: error bodies are redacted, which would mask the rest of the text
            raise unauthorized(MISSING_KEY_MESSAGE)
        return tenant

    def check_admin(self, headers: Mapping[str, str]) -> None:
        """Admin routes on the public listener: open without authentication, else an admin key."""
        if not self.enabled:
            return
        if not self.is_admin(self.presented_key(headers)):
            raise unauthorized("an admin key is required for this route (or use the admin listener)")


MISSING_KEY_MESSAGE = "a valid API key is required in the Authorization header (Bearer) or the X-Api-Key header"


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key", headers=(("www-authenticate", "Bearer"),))


SCOPE_SEPARATOR = "/"


def scope_id(tenant: str, value: str | None) -> str | None:
    return None if value is None else f"{tenant}{SCOPE_SEPARATOR}{value}"


def scope_identity(parsed: ParsedIdentity | None, tenant: str | None) -> ParsedIdentity | None:
    """Program identity namespaced by tenant (unchanged without a tenant): see the module doc."""
    if parsed is None or tenant is None:
        return parsed
    ident = parsed.identity
    scoped = attrs.evolve(
        ident,
        program_id=f"{tenant}{SCOPE_SEPARATOR}{ident.program_id}",
        task_id=scope_id(tenant, ident.task_id),
        session_id=scope_id(tenant, ident.session_id),
        parent_program_id=scope_id(tenant, ident.parent_program_id),
        root_program_id=scope_id(tenant, ident.root_program_id),
        placement_key=f"{tenant}{SCOPE_SEPARATOR}{ident.placement_key}",
        placement_hash_key=f"{tenant}{SCOPE_SEPARATOR}{ident.placement_hash_key}",
    )
    return attrs.evolve(parsed, identity=scoped)
