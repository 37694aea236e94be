"""Start-up checks of the security settings that read files (docs/operations.md §10).

:func:`load_security` reads the API-key file, the worker API key (``[worker_auth]``) and builds
the TLS context for ``https://`` workers once, before anything listens; every problem is a
:class:`~daemon.config_loading.ConfigError` line naming the field, so ``agentd start`` and
``agentd check-config`` exit 2 exactly as for any other bad configuration.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs

from daemon.auth import Authenticator, AuthFileError
from daemon.config import AgentdConfig, WorkerTlsConfig
from daemon.config_loading import ConfigError, ConfigWarning, read_problem


@attrs.frozen(eq=False)
class Security:
    authenticator: Authenticator
    worker_ssl: ssl.SSLContext | None  # None: the default verification of https:// workers
    worker_api_key: str | None = None  # [worker_auth]: sent to workers as a bearer token


def worker_api_key(cfg: AgentdConfig) -> str | None:
    """The ``[worker_auth]`` key (read from ``api_key_file`` when set); None when not configured.

    Raises :class:`ConfigError` naming ``worker_auth.api_key_file`` when the file cannot be read or
    holds no usable key (the key itself never appears in the message)."""
    auth = cfg.worker_auth
    if not auth.api_key_file:
        return auth.api_key or None
    path = Path(auth.api_key_file).expanduser()
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"worker_auth.api_key_file: cannot read {str(path)!r} ({read_problem(exc)})"]) from None
    if not key or any(c.isspace() or not c.isprintable() for c in key):
        raise ConfigError(
            [f"worker_auth.api_key_file: {str(path)!r} must hold one key without whitespace or control characters"]
        )
    return key


def worker_ssl_context(tls: WorkerTlsConfig) -> ssl.SSLContext | None:
    """The TLS context for workers, None when nothing differs from the defaults."""
    if tls.verify and not tls.ca_file and not tls.client_cert_file:
        return None
    context = ssl.create_default_context(cafile=tls.ca_file or None)
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.client_cert_file:
        context.load_cert_chain(tls.client_cert_file, tls.client_key_file or None)
    return context


def worker_tls_problems(tls: WorkerTlsConfig, exc: BaseException) -> list[str]:
    """One line per ``[worker_tls]`` file that cannot be used, naming the field and the file
    (docs/config.md: a missing or bad file is an error naming the field); ``exc`` is what loading
    them all raised, reported when no single file is to blame (a key that does not match its
    certificate)."""
    lines = []
    for name in ("ca_file", "client_cert_file", "client_key_file"):
        path = getattr(tls, name)
        if not path:
            continue
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as err:
            lines.append(f"worker_tls.{name}: cannot read {path!r} ({read_problem(err)})")
    if lines:
        return lines
    if tls.ca_file:
        try:
            ssl.create_default_context(cafile=tls.ca_file)
        except (OSError, ssl.SSLError) as err:
            return [f"worker_tls.ca_file: {tls.ca_file!r} is not a PEM bundle of CA certificates ({err})"]
    fields = "client_cert_file, client_key_file" if tls.client_key_file else "client_cert_file"
    return [f"worker_tls.{fields}: cannot load the client certificate and its key ({exc})"]


def load_security(cfg: AgentdConfig) -> Security:
    lines = []
    try:
        authenticator = Authenticator.from_config(cfg.auth)
    except AuthFileError as exc:
        lines.append(str(exc))
        authenticator = Authenticator((), (), False)
    context = None
    try:
        context = worker_ssl_context(cfg.worker_tls)
    except (OSError, ssl.SSLError) as exc:
        lines.extend(worker_tls_problems(cfg.worker_tls, exc))
    key = None
    try:
        key = worker_api_key(cfg)
    except ConfigError as exc:
        lines.extend(exc.lines)
    if lines:
        raise ConfigError(lines)
    return Security(authenticator, context, key)


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (only this machine can reach the listener)."""
    return host in ("localhost", "::1") or host.startswith("127.")


def unauthenticated_listener(cfg: AgentdConfig, security: Security) -> ConfigWarning | None:
    """The warning for a public listener without API keys (docs/operations.md §10), or None;
    ``agentd start`` logs it once listening, ``agentd check-config`` prints it."""
    if security.authenticator.enabled or loopback(cfg.server.host):
        return None
    return ConfigWarning(
        "unauthenticated_listener",
        "no API keys configured ([auth]) and the server listens beyond loopback: anyone who can reach it "
        "can use the workers and read diagnostics (docs/operations.md §10)",
        (("host", cfg.server.host),),
    )
