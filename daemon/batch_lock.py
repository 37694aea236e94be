"""One daemon per Batch API database: an exclusive advisory lock held for the executor's life.

Two daemons on one database (two quick starts on different ports, both with the default
``batch_api.database_path``) would each resume and run its batches: every line sent twice, the
output written by whichever finished last.  Exactly once (docs/batch.md §4) needs one owner, so the
executor takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<database>.lock`` beside the database before
it resumes anything and keeps the descriptor open until it stops.  The kernel drops the lock when
the descriptor is closed, including when the process dies, so a SIGKILL-and-restart finds it free.
The holder writes its pid into the file so that the second daemon can say who holds it; the file
itself is left in place (removing it would race with a daemon that just opened it).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

FIELD = "batch_api.database_path"


class BatchDatabaseLocked(Exception):
    """The database is another process's (or its lock file cannot be made): ``lines`` name
    ``batch_api.database_path``; ``agentd start`` prints them and exits 2 (docs/config.md)."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.lines = [line]


def lock_path(database: Path) -> Path:
    """``batches.sqlite3`` -> ``batches.sqlite3.lock``, in the same directory."""
    return database.with_name(database.name + ".lock")


def _holder(fd: int) -> str:
    """The pid written by the holder, or "" (it writes it just after locking; a race reads "")."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


class BatchDatabaseLock:
    """The lock on one database; :meth:`acquire` raises :class:`BatchDatabaseLocked`."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = lock_path(database)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        try:
            # private, as the database beside it (daemon/batch_store.py create_private)
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # close-on-exec (os.open's default, PEP 446): a worker or Program process the daemon
            # starts must not keep the lock after the daemon is gone
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            # mkdir over a file says "File exists": name what is wrong instead
            reason = "not a directory" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
            raise BatchDatabaseLocked(f"{FIELD}: cannot create the lock file {str(self.path)!r} ({reason})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if isinstance(exc, BlockingIOError):
                who = f"another agentd (pid {holder})" if holder else "another agentd"
                raise BatchDatabaseLocked(
                    f"{FIELD}: {str(self.database)!r} is in use by {who}, which holds {str(self.path)!r}; "
                    "give each daemon its own database ([batch_api] database_path in its --config file; "
                    "[batch_api] enabled = false turns the Batch API off) or stop the other one"
                ) from None
            raise BatchDatabaseLocked(f"{FIELD}: cannot lock {str(self.path)!r} ({exc.strerror or exc})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # the kernel drops the lock with the last descriptor
