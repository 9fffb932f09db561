"""Records every write a Python process makes under a directory, for tests/adversarial/test_links.py.

Put this folder on ``PYTHONPATH`` with ``DISTMIS_WRITE_AUDIT=<log>`` and
``DISTMIS_WRITE_AUDIT_ROOT=<dir>`` set: every process of a command (the CLI, Ray's trial workers,
which inherit the environment) appends one JSON line per file it opens for writing under the
root, with the open's flags, and per rename or replace into the root. The list of paths a command
writes is so derived from what the code does, not written down by hand.
"""

from __future__ import annotations

import json
import os
import sys

_LOG = os.environ.get("DISTMIS_WRITE_AUDIT")
_ROOT = os.environ.get("DISTMIS_WRITE_AUDIT_ROOT")


def _install(log: str, root: str) -> None:
    # opened before the hook exists, and written with os.write, which raises no audit event
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    root = os.path.realpath(root)
    writing = os.O_WRONLY | os.O_RDWR

    def under_root(path: object) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        try:
            full = os.path.abspath(os.fsdecode(path))  # noqa: PTH100 - no link resolved: the path as opened
        except (TypeError, ValueError):
            return None
        return full if full.startswith(root + os.sep) else None

    def record(entry: dict) -> None:
        os.write(fd, (json.dumps({**entry, "pid": os.getpid()}) + "\n").encode())

    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) == 3 and isinstance(args[2], int) and args[2] & writing:
            path = under_root(args[0])
            if path:
                record({"event": "open", "path": path, "flags": args[2]})
        elif event == "os.rename" and len(args) >= 2:
            path = under_root(args[1])
            if path:
                record({"event": "rename", "path": path})

    sys.addaudithook(hook)


if _LOG and _ROOT:
    _install(_LOG, _ROOT)
