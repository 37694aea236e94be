"""Checks of the files and directories a command will read or write, made before any work starts.

A command that runs for minutes (a simulation, a bench, a batch) must not find out at the end that
its ``--out`` names a directory or lives in a directory that does not exist: each function returns
the problem as one line naming the flag (the command prints it and exits 2), or ``None``.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.config import AgentdConfig


def _create_problem(directory: Path) -> str | None:
    """Why no file can be created in ``directory``, found by creating (and removing) one, or None.

    ``os.access`` asks the permission bits only: for root every directory passes, also one where
    the file system refuses new files (``/proc``, a read-only mount), and the command ran for
    minutes before its final write failed (a traceback, or an exit 1 that said to resume)."""
    probe = directory / f".agentd-write-probe.{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(probe)
    return None


def atomic_target(path: str | os.PathLike[str]) -> Path | None:
    """The file an atomic write of ``path`` (a temporary file renamed over it) replaces: ``path`` with
    its symbolic links resolved, so a link keeps pointing at the new file instead of being replaced
    by it; or None when ``path`` exists and is not a regular file (``/dev/null``, a FIFO, a terminal),
    which is written in place: a rename would replace the device node itself (run as root, an
    ``--out /dev/null`` left a regular file at /dev/null for every other program on the machine)."""
    real = Path(os.path.realpath(path))
    try:
        mode = real.stat().st_mode
    except FileNotFoundError:
        return real
    return real if stat.S_ISREG(mode) else None


# "-" is standard input or output only where a command says so (agentd trace, --trace): elsewhere
# it was a file named "-" in the current directory (agentd batch -o - said "results in -")
STDIO_NAME = "-"


def _stdio_problem(path: str, flag: str, stream: str) -> str | None:
    if path != STDIO_NAME:
        return None
    return f"{flag}: '-' ({stream}) is not accepted here: give a file name"


def input_file_problem(path: str, flag: str) -> str | None:
    """Why ``path`` cannot be read as an input file, or None."""
    if not path:
        return f"{flag}: must not be empty"
    if (stdio := _stdio_problem(path, flag, "standard input")) is not None:
        return stdio
    p = Path(path)
    if not p.exists():
        return f"{flag}: no such file: {path}"
    if p.is_dir():
        return f"{flag}: is a directory, not a file: {path}"
    if not p.is_file():
        return f"{flag}: not a regular file: {path}"
    if not os.access(p, os.R_OK):
        return f"{flag}: not readable: {path}"
    return None


def output_file_problem(path: str, flag: str) -> str | None:
    """Why a file cannot be written (created or replaced) at ``path``, or None."""
    if not path:
        return f"{flag}: must not be empty"
    if (stdio := _stdio_problem(path, flag, "standard output")) is not None:
        return stdio
    p = Path(path)
    if p.is_dir():
        return f"{flag}: is a directory, give a file name: {path}"
    parent = p.parent
    if not parent.exists():
        return f"{flag}: directory does not exist: {parent}"
    if not parent.is_dir():
        return f"{flag}: not a directory: {parent}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag}: directory not writable: {parent}"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{flag}: not writable: {path}"
    reason = _create_problem(parent)
    if reason is not None:
        return f"{flag}: cannot create a file in {parent}: {reason}"
    return None


def output_dir_problem(path: str, flag: str) -> str | None:
    """Why ``path`` cannot be used (or created, with its missing parents) as an output directory."""
    if not path:  # Path("") is the current directory: an empty --out wrote there
        return f"{flag}: must not be empty"
    if path == STDIO_NAME:
        return f"{flag}: '-' names a directory here, not standard output: give a directory name"
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            return f"{flag}: exists and is not a directory: {path}"
        if not os.access(p, os.W_OK | os.X_OK):
            return f"{flag}: directory not writable: {path}"
        reason = _create_problem(p)
        if reason is not None:
            return f"{flag}: cannot create a file in {path}: {reason}"
        return None
    ancestor = p.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{flag}: cannot create {path}: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{flag}: cannot create {path}: {ancestor} is not writable"
    reason = _create_problem(ancestor)
    if reason is not None:
        return f"{flag}: cannot create {path} in {ancestor}: {reason}"
    return None


SQLITE_HEADER = b"SQLite format 3\x00"


def batch_database_problem(cfg: AgentdConfig) -> str | None:
    """Why the Batch API's database (``batch_api.database_path``, docs/batch.md §4) cannot be used,
    or None.  Checked by ``agentd start`` and ``check-config``: an existing database is opened at
    start (a directory or another program's file there was a traceback), a new one at the first
    Batch API call (a path that cannot be created made every call a 500)."""
    if not cfg.batch_api.enabled:
        return None
    path = cfg.batch_api.resolved_database_path()
    field = "batch_api.database_path"
    if path.is_dir():
        return f"{field}: {str(path)!r} is a directory; give the database file's name"
    if path.exists():
        if not path.is_file():
            return f"{field}: {str(path)!r} is not a regular file"
        try:
            with path.open("rb") as fh:
                head = fh.read(len(SQLITE_HEADER))
        except OSError as exc:
            return f"{field}: cannot read {str(path)!r} ({exc.strerror})"
        if head and head != SQLITE_HEADER:
            return f"{field}: {str(path)!r} is not an SQLite database (another file is in its place)"
        if not os.access(path, os.R_OK | os.W_OK):
            return f"{field}: {str(path)!r} is not writable"
        return None
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{field}: cannot create {str(path)!r}: {str(ancestor)!r} is not a writable directory"
    reason = _create_problem(ancestor)
    if reason is not None:
        return f"{field}: cannot create {str(path)!r} in {str(ancestor)!r}: {reason}"
    return None
