"""Start-up checks of the security settings that read files (docs/operations.md §10).

:func:`load_security` reads the API-key file and builds the TLS context for ``https://`` workers
once, before anything listens; every problem is a :class:`~daemon.config_loading.ConfigError`
line naming the field, so ``agentd start`` exits 2 exactly as for any other bad configuration.
"""

from __future__ import annotations

import ssl

import attrs

from daemon.auth import Authenticator, AuthFileError
from daemon.config import AgentdConfig, WorkerTlsConfig
from daemon.config_loading import ConfigError


@attrs.frozen(eq=False)
class Security:
    authenticator: Authenticator
    worker_ssl: ssl.SSLContext | None  # None: the default verification of https:// workers


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
        lines.append(f"worker_tls: cannot load the CA bundle or client certificate ({exc})")
    if lines:
        raise ConfigError(lines)
    return Security(authenticator, context)
