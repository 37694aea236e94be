"""``agentd check-config [PATH]``: validate a configuration without starting anything.

``PATH`` (or ``--config PATH``, as for ``agentd start``) is a TOML file, or JSON when its suffix is
``.json`` in any case.  Without it the defaults are checked - what ``agentd start`` runs without
``--config`` - and a line on stderr says so.

Prints the effective configuration (defaults filled in) as JSON and any warnings, exit 0; or the
errors, one per line naming the field, the rule and the value, exit 2.  Like ``agentd start`` it
also reads the files the configuration names - the API key file (``auth.api_keys_file``) and the
worker TLS files (``worker_tls``) - and checks the Batch API's database path, so a configuration that
passes here does not fail at start.  Accepts the same
router-compatible flags as ``agentd start`` so a launch command can be checked before it runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from daemon.commands.paths import batch_database_problem
from daemon.config_loading import (
    ConfigError,
    add_router_flags,
    config_file_warnings,
    config_warnings,
    dump_config,
    ignored_flag_warnings,
    load_config_from_args,
    overrides_from_args,
)

NAME = "check-config"
HELP = "Validate a configuration file (and flags); print the effective configuration and warnings."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        metavar="PATH",
        help="TOML (or .json) configuration file; without it the defaults are checked, as agentd start "
        "runs without --config",
    )
    parser.add_argument("--config", dest="config_flag", metavar="PATH", help="the same as PATH (as for agentd start)")
    add_router_flags(parser)


def run(args: argparse.Namespace) -> int:
    from daemon.security import load_security, unauthenticated_listener  # reads the files the configuration names

    if args.config is not None and args.config_flag is not None and args.config != args.config_flag:
        print(
            f"agentd check-config: --config: two files given ({args.config!r} and --config {args.config_flag!r}); "
            "give one",
            file=sys.stderr,
        )
        return 2
    path = args.config if args.config is not None else args.config_flag
    args.config = path
    try:
        overrides = overrides_from_args(args)
        if path is None:
            # a bare `agentd check-config` printed the defaults as if they were a file's: say so
            what = "the defaults with the flags given" if overrides else "the defaults"
            print(
                f"agentd check-config: no PATH given: checking {what} (what agentd start runs without --config)",
                file=sys.stderr,
            )
        cfg = load_config_from_args(path, args)
        security = load_security(cfg)
        problem = batch_database_problem(cfg)
        if problem is not None:
            raise ConfigError([problem])
    except ConfigError as exc:
        source = args.config or "command line"
        print(f"agentd: invalid configuration ({source}):", file=sys.stderr)
        for line in exc.lines:
            print(f"  {line}", file=sys.stderr)
        return 2
    print(json.dumps(dump_config(cfg), indent=2))
    exposed = unauthenticated_listener(cfg, security)  # (agentd start logs it once listening)
    warnings = [*config_file_warnings(path), *ignored_flag_warnings(args), *config_warnings(cfg)]
    for warning in [*warnings, *([exposed] if exposed is not None else [])]:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
