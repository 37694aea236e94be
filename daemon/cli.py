"""The ``agentd`` command line.

Sub-commands live in ``daemon.commands.<module>``; this file only wires them into argparse and maps
exit codes: 0 success, 1 runtime failure, 2 bad usage or bad configuration (argparse's own code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from daemon import __version__

# (sub-command, module under daemon.commands).  Order is the order shown in --help.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("start", "start"),
    ("check-config", "check_config"),
    ("sim-backend", "sim_backend"),
    ("trace", "trace"),
    ("replay", "replay"),
    ("bench", "bench"),
    ("simulate", "simulate"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentd",
        description="Scheduling daemon that makes LLM agents fast in front of vLLM-compatible workers.",
    )
    parser.add_argument("--version", action="version", version=f"agentd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS:
        try:
            module = importlib.import_module(f"daemon.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"daemon.commands.{module_name}":
                raise
            continue  # command not built yet in this checkout
        cmd_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd_parser)
        cmd_parser.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
