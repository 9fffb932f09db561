"""Stopping exactly the processes one started: a process group, with bounded waits.

``ray stop`` kills every Ray on the host (other jobs', other users'), so distmis starts Ray
(and tests start their servers) in a new session and stops that process group alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

#: Environment for a ``ray start --block`` that distmis starts (and then stops with SIGTERM).
#: Ray 2.60's ``--block`` answers SIGTERM by draining its node first, for up to
#: ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` (default 30 s), so that Ray Serve replicas can stop
#: taking traffic; a head node never finishes draining, so every SLURM job's end waited out
#: :func:`stop_process_group`'s grace and then SIGKILLed its head. distmis runs no Serve and stops Ray
#: only once its search has ended or saved its state, so the drain is off unless the user set it.
RAY_START_DEFAULTS: dict[str, str] = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def ray_start_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`RAY_START_DEFAULTS` added where ``env`` does not set them."""
    return {**RAY_START_DEFAULTS, **env}


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
) -> signal.Signals | None:
    """SIGTERM the group of ``proc`` (started with ``start_new_session``), SIGKILL after ``grace`` s;
    returns the last signal sent (SIGKILL: it did not stop on SIGTERM), or None when it was gone.

    ``graceful=False`` sends SIGKILL at once (when the caller itself is about to be killed).
    """
    pgid = proc.pid
    steps = ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)) if graceful else ((signal.SIGKILL, kill_wait),)
    sent: signal.Signals | None = None
    for sig, wait in steps:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return sent
        sent = sig
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(pgid):
                return sent
            time.sleep(0.2)
    return sent


__all__ = ["RAY_START_DEFAULTS", "group_alive", "ray_start_env", "stop_process_group"]
