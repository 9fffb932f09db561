"""Finding the processes a test started, and no others, from ``/proc``.

A test that pauses or kills a trial's process must touch only the processes of the search it
started: matching every ``ray::...`` process on the host would also hit another test's search
(a parallel test run), a CI job beside it, or a user's own Ray. Ray's workers are children of
the raylet, which is a child of the driver (a local ``ray.init``) or of ``ray start``, so the
processes of one search are the descendants of the process the test started. Read by hand:
``/proc`` is all this needs, and no test dependency (psutil) is added for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import defaultdict
from pathlib import Path


def _parents() -> dict[int, int]:
    """``pid -> parent pid`` of every process on the host at this moment."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return parents


def descendants(*roots: int) -> set[int]:
    """The PIDs below ``roots`` in the process tree (the roots themselves excluded)."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, parent in _parents().items():
        children[parent].append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def processes_under(roots: int | list[int], *prefixes: bytes) -> list[int]:
    """PIDs below ``roots`` whose command line starts with one of ``prefixes`` (e.g. ``b"ray::"``)."""
    pids = []
    for pid in sorted(descendants(*([roots] if isinstance(roots, int) else roots))):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(prefixes):
            pids.append(pid)
    return pids


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def stop_tree(pids: set[int], timeout: float = 30.0) -> None:
    """SIGKILL ``pids`` and every process still below them; return once none of them runs.

    Why: Ray 2.60 starts each worker in a process group of its own, so stopping a killed
    driver's group leaves its trial workers running until they notice that their raylet is gone.
    A clean-clone CI failed where a test compares a killed ``finalize``'s directory byte for byte
    (which file changed went unseen: pytest's diff of the bytes ran past the timeout); such
    workers are the one writer left there. Take ``pids`` (:func:`descendants`) before the kill:
    afterwards the orphans belong to init.

    Raises:
        AssertionError: a process still runs ``timeout`` seconds after SIGKILL.
    """
    every = set(pids) | descendants(*pids)
    for pid in every:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while running := sorted(pid for pid in every if _alive(pid)):
        assert time.monotonic() < deadline, f"processes {running} still run {timeout:.0f} s after SIGKILL"
        time.sleep(0.1)
