"""Writing the kit's outputs: reports and traces land whole or not at all.

``write_atomic`` writes through a temporary file in the destination's directory and renames it over
the destination, so a reader (or a run that is interrupted) never sees a half-written file: it
finds the previous file or the complete new one.  ``write_report`` is how the ``replay`` and
``simulate`` commands emit a JSON report: to ``--out`` or, without it, to stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Mapping
from typing import Any

from daemon.commands.paths import atomic_target


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one rename; the file gets the umask's permissions.
    A symbolic link's target is replaced (the link stays); a destination that is not a regular file
    (``/dev/null``) is written in place (:func:`daemon.commands.paths.atomic_target`)."""
    target = atomic_target(path)
    if target is None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def report_json(report: Mapping[str, Any]) -> str:
    """The JSON text of a report (indented, keys sorted: runs diff cleanly)."""
    return json.dumps(report, indent=2, sort_keys=True)


def write_report(report: Mapping[str, Any], out: str | None) -> None:
    """The report as JSON plus a newline: into the file ``out`` (atomically) or onto stdout."""
    text = report_json(report)
    if out:
        write_atomic(out, text + "\n")
    else:
        print(text)
