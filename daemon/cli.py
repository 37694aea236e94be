"""The ``agentd`` command line.

The daemon's own sub-commands live in ``daemon.commands.<module>``; packages above the daemon (the
benchmark kit) add theirs through the ``agentd.commands`` entry-point group (name = sub-command, value
= module), so the daemon never imports them (docs/architecture.md §1).  Each command module has
``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.  This file only wires them into argparse
and maps exit codes: 0 success, 1 runtime failure, 2 bad usage or bad configuration (argparse's own
code), 130 interrupted by Ctrl-C (also when the interruption arrives inside a Trio exception group).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from daemon import __version__

# The daemon's own (sub-command, module); shown first in --help, in this order.
DAEMON_COMMANDS: tuple[tuple[str, str], ...] = (
    ("start", "daemon.commands.start"),
    ("check-config", "daemon.commands.check_config"),
    ("sim-backend", "daemon.commands.sim_backend"),
    ("batch", "daemon.commands.batch"),
)
ENTRY_POINT_GROUP = "agentd.commands"


def commands() -> tuple[tuple[str, str], ...]:
    """Every (sub-command, module): the daemon's own, then the installed plugins' (in the order the
    ``pyproject.toml`` of their package declares them)."""
    own = {name for name, _ in DAEMON_COMMANDS}
    plugins = tuple((ep.name, ep.value) for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in own)
    return DAEMON_COMMANDS + plugins


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``only``, just that sub-command's module is imported (each command
    pulls in its own heavy dependencies, so ``agentd start`` does not import the bench kit)."""
    # allow_abbrev=False: a prefix of a flag is not that flag. The reference router's --api-key (the
    # workers' key) was taken for agentd's --api-keys-file and the key printed in the error
    # (docs/operations.md §13.10)
    parser = argparse.ArgumentParser(
        prog="agentd",
        description="Scheduling daemon that makes LLM agents fast in front of vLLM-compatible workers.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"agentd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in commands():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        cmd_parser = sub.add_parser(name, help=module.HELP, description=module.HELP, allow_abbrev=False)
        module.add_arguments(cmd_parser)
        cmd_parser.set_defaults(_run=module.run)
    return parser


def _requested_command(argv: Sequence[str]) -> str | None:
    """The sub-command named on the command line, if it is a known one (else None: full parser)."""
    names = {name for name, _ in commands()}
    for arg in argv:
        if arg.startswith("-"):
            continue
        return arg if arg in names else None
    return None


def _chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub-)sub-command ``args`` ran: ``agentd trace synth``'s for ``trace synth``."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs and subs[0].dest else None
        if not isinstance(chosen, str) or chosen not in subs[0].choices:
            return parser
        parser = subs[0].choices[chosen]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # importing a command's module takes seconds on a loaded machine: a Ctrl-C then is an
        # interruption too, not a traceback
        parser = build_parser(_requested_command(argv))
    except KeyboardInterrupt:
        return 130
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # parse_args reported them with the top-level usage ("agentd: error: unrecognized
        # arguments"), not the sub-command's that has the flags the user meant
        _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args._run(args))
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        # Ctrl-C inside a Trio run arrives wrapped in the exception group of the nurseries it
        # cancelled (with whatever the cancellation raised beside it): still an interruption
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        return 130
    except BrokenPipeError:
        # the reader left (``agentd check-config X | head``): stop quietly, as other CLI tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
