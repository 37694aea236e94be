"""``agentd start``: run the daemon in the foreground until SIGINT/SIGTERM.

Accepts ``--config PATH`` plus the reference router's launch flags (they override the file).
Prints exactly one line on stdout once the server accepts connections: ``agentd listening on
http://H:P`` (the real bound port when ``--port 0``), or with ``--log-format json`` the JSON event
``daemon_listening`` (``url``, ``metrics_url``); logs go to stderr.  A configuration error prints
its lines to stderr (one JSON ``config_error`` line when the requested format is json) and exits 2;
a clean shutdown exits 0.  In json mode library logs and Python warnings are JSON lines too
(:func:`daemon.logs.capture_process_output`) and an uncaught exception becomes one
``daemon_crashed`` line (traceback as a string field) and exit 1; in kv mode it propagates as before.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import traceback
from typing import TYPE_CHECKING, Any

import trio

from actors.logevents import get_logger, log_event
from daemon.batch_lock import BatchDatabaseLocked
from daemon.commands.paths import batch_database_problem
from daemon.config import HTTP1_ENV, HTTP1_IMPLEMENTATIONS, LOG_FORMATS, AgentdConfig
from daemon.config_loading import (
    ConfigError,
    ConfigWarning,
    add_router_flags,
    config_file_warnings,
    ignored_flag_warnings,
    load_config_from_args,
    read_config_file,
)
from daemon.dataplane.processes import RelayStartError
from daemon.logs import banner_line, capture_process_output, configure_logging, event_line
from daemon.security import load_security

if TYPE_CHECKING:
    from daemon.http.serve import ListenError

NAME = "start"
HELP = "Run the agentd daemon in front of vLLM-compatible workers (or the embedded simulator)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH", help="TOML or JSON configuration file (defaults apply without it)")
    add_router_flags(parser)


async def _main(cfg: AgentdConfig) -> None:
    from daemon.heap import settle_heap
    from daemon.supervisor import run_daemon

    async with trio.open_nursery() as nursery:
        handles = await nursery.start(lambda task_status: run_daemon(cfg, handle_signals=True, task_status=task_status))
        settle_heap()  # docs/operations.md §13.8
        print(banner_line(cfg.server.log_format, handles.http_url, handles.metrics_url), flush=True)


def requested_log_format(args: argparse.Namespace) -> str:
    """The log format asked for (flag first, then the file's ``[server] log_format``), for output
    written before the configuration is valid; ``kv`` when neither names a valid one."""
    flag = getattr(args, "log_format", None)
    if flag is not None:
        return flag if flag in LOG_FORMATS else "kv"
    if args.config is None:
        return "kv"
    try:
        server: Any = read_config_file(args.config).get("server")
    except ConfigError:
        return "kv"
    value = server.get("log_format") if isinstance(server, dict) else None
    return value if isinstance(value, str) and value in LOG_FORMATS else "kv"


def raise_open_file_limit() -> int | None:
    """Every client and worker connection is a file descriptor: use the hard limit, not the soft
    one (often 1024), so ``[limits] max_connections`` is what caps connections.  The open-file
    limit in effect afterwards; None when unlimited or unknown."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ValueError, OSError):  # not permitted here: keep the soft limit
        pass
    return None if soft == resource.RLIM_INFINITY else soft


# descriptors a process holds beside its connections: listeners, the epoll and wake-up handles,
# log and database files, relay links and pipes
OTHER_FILES = 64


def open_file_limit_warning(cfg: AgentdConfig, limit: int | None) -> ConfigWarning | None:
    """WARN ``open_file_limit_low`` when ``limit`` cannot hold ``[limits] max_connections`` client
    connections plus a worker connection per in-flight request (docs/config.md ``[limits]``): past
    it, accepting fails with EMFILE and the listener stalls while connections are under the cap."""
    if limit is None:
        return None
    limits = cfg.limits
    needed = limits.max_connections + limits.max_in_flight_requests + OTHER_FILES
    if limit >= needed:
        return None
    return ConfigWarning(
        "open_file_limit_low",
        f"the process may open {limit} files (ulimit -n, its hard limit), fewer than the {needed} that "
        f"limits.max_connections ({limits.max_connections} client connections), a worker connection for each of "
        f"limits.max_in_flight_requests ({limits.max_in_flight_requests}) and {OTHER_FILES} other files need: "
        "raise the limit (ulimit -Hn, LimitNOFILE= of a systemd unit) or lower the two caps (docs/config.md)",
        (("open_file_limit", limit), ("needed", needed)),
    )


def _leaf_errors(exc: BaseException) -> str:
    """``Type: message`` of the exceptions inside (nested) exception groups, ``; ``-joined."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_leaf_errors(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def find_exception(exc: BaseException, types: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of one of ``types`` in ``exc``, possibly nested in exception groups."""
    if isinstance(exc, types):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_exception(inner, types)
            if found is not None:
                return found
    return None


def listen_error(exc: BaseException) -> ListenError | BatchDatabaseLocked | None:
    """The :class:`ListenError` (a listener cannot open) or :class:`BatchDatabaseLocked` (another
    daemon holds the Batch API's database) inside ``exc``, possibly nested in exception groups."""
    from daemon.http.serve import ListenError  # (hypercorn: imported only to serve)

    found = find_exception(exc, (ListenError, BatchDatabaseLocked))
    return found if isinstance(found, (ListenError, BatchDatabaseLocked)) else None


def _config_error(lines: list[str], log_format: str, source: str | None = None) -> int:
    """A configuration error: one line per problem (one ``config_error`` JSON line in json mode,
    docs/operations.md §7); exit code 2.  With ``source`` (the file, or the command line) the lines
    come under the header ``agentd check-config`` prints, indented as there (docs/config.md)."""
    if log_format == "json":
        print(event_line("json", "agentd.start", logging.ERROR, "config_error", lines=lines), file=sys.stderr)
    elif source is not None:
        print(f"agentd: invalid configuration ({source}):", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
    else:
        for line in lines:
            print(line, file=sys.stderr)
    return 2


def _serve(cfg: AgentdConfig) -> int:
    """Run the daemon; a listener that cannot open or a Batch API database held by another daemon
    is a configuration error: its lines, exit 2."""
    try:
        trio.run(_main, cfg)
    except Exception as exc:
        error = listen_error(exc)
        if error is None:
            raise
        return _config_error(error.lines, cfg.server.log_format)
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config_from_args(args.config, args)
    except ConfigError as error:
        return _config_error(error.lines, requested_log_format(args), args.config or "command line")
    try:
        load_security(cfg)  # the key file and the worker TLS files, before anything starts
        problem = batch_database_problem(cfg)
        if problem is not None:
            raise ConfigError([problem])
    except ConfigError as error:
        return _config_error(error.lines, cfg.server.log_format, args.config or "command line")
    forced = os.environ.get(HTTP1_ENV)
    if forced and forced not in HTTP1_IMPLEMENTATIONS:  # overrides [server] http1_implementation
        line = f"{HTTP1_ENV}: must be one of {', '.join(HTTP1_IMPLEMENTATIONS)}, got {forced!r}"
        return _config_error([line], cfg.server.log_format)
    files = open_file_limit_warning(cfg, raise_open_file_limit())
    configure_logging(cfg.server.log_level, cfg.server.log_format)
    # an empty file; reference-router flags agentd ignores (docs/operations.md §13.10); too few files
    for warning in [*config_file_warnings(args.config), *ignored_flag_warnings(args), *([files] if files else [])]:
        log_event(get_logger("start"), logging.WARNING, warning.event, message=warning.message, **dict(warning.fields))
    if cfg.server.log_format != "json":
        try:
            return _serve(cfg)
        except Exception as exc:  # a relay that did not start: one line (its own output is above)
            failed = find_exception(exc, (RelayStartError,))
            if failed is None:
                raise
            print(f"agentd start: {failed}; the daemon stopped", file=sys.stderr)
            return 1
    capture_process_output()
    try:
        return _serve(cfg)
    except Exception as exc:  # the top of the process: one JSON line, exit 1
        log_event(
            get_logger("start"),
            logging.CRITICAL,
            "daemon_crashed",
            error=_leaf_errors(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
        return 1
    return 0
