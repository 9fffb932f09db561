"""A small real disk for full-disk tests: a tmpfs of a given size, mounted under the test's tmp path.

A full disk is a state of the machine, not of the input, so it is made for real (``mount -t tmpfs
-o size=...``, as root) rather than imitated; without root or ``mount`` the test is skipped with
the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

PAGE = 4096  # a tmpfs file takes whole pages


def pages(path: Path) -> int:
    """Bytes ``path`` takes on a tmpfs: whole 4 KiB pages."""
    return -(-path.stat().st_size // PAGE) * PAGE


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """``where`` as a tmpfs of ``size`` (``"8k"``, ``"2m"``) for the block, unmounted after it."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(f"needs root and mount to make a small tmpfs (mount -t tmpfs -o size={size})")
    where.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]).returncode != 0:
        pytest.skip(f"mount -t tmpfs -o size={size} failed here")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def resize(where: Path, size: str) -> None:
    """Give a mounted small disk ``size`` (room again after it filled)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)
