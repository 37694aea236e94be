"""``agentd start``: run the daemon in the foreground until SIGINT/SIGTERM.

Accepts ``--config PATH`` plus the reference router's launch flags (they override the file).
Prints exactly one line on stdout, ``agentd listening on http://H:P`` (the real bound port when
``--port 0``), once the server accepts connections; logs go to stderr.  A configuration error
prints its lines to stderr and exits 2; a clean shutdown exits 0.
"""

from __future__ import annotations

import argparse
import sys

import trio

from daemon.config import AgentdConfig
from daemon.config_loading import ConfigError, add_router_flags, load_config, overrides_from_args
from daemon.logs import configure_logging

NAME = "start"
HELP = "Run the agentd daemon in front of vLLM-compatible workers (or the embedded simulator)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="PATH", help="TOML or JSON configuration file (defaults apply without it)")
    add_router_flags(parser)


async def _main(cfg: AgentdConfig) -> None:
    from daemon.supervisor import run_daemon

    async with trio.open_nursery() as nursery:
        handles = await nursery.start(lambda task_status: run_daemon(cfg, handle_signals=True, task_status=task_status))
        print(f"agentd listening on {handles.http_url}", flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, overrides_from_args(args))
    except ConfigError as error:
        for line in error.lines:
            print(line, file=sys.stderr)
        return 2
    configure_logging(cfg.server.log_level, cfg.server.log_format)
    trio.run(_main, cfg)
    return 0
