"""One module per CLI sub-command.

Each module defines ``NAME`` (the sub-command), ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit code).  ``daemon.cli`` imports them lazily so that ``agentd --help``
stays fast and a broken optional command cannot break the others.
"""
