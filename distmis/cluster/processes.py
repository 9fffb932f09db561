"""Stopping exactly the processes one started: a process group, with bounded waits.

``ray stop`` kills every Ray on the host (other jobs', other users'), so distmis starts Ray
(and tests start their servers) in a new session and stops that process group alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process of process group ``pgid`` is left."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_process_group(
    proc: subprocess.Popen, *, grace: float = 20.0, kill_wait: float = 10.0, graceful: bool = True
) -> None:
    """SIGTERM the group of ``proc`` (started with ``start_new_session``), SIGKILL after ``grace`` s.

    ``graceful=False`` sends SIGKILL at once (when the caller itself is about to be killed).
    """
    pgid = proc.pid
    steps = ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)) if graceful else ((signal.SIGKILL, kill_wait),)
    for sig, wait in steps:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(pgid):
                return
            time.sleep(0.2)


__all__ = ["group_alive", "stop_process_group"]
