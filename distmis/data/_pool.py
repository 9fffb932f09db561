"""The process pool that reads and preprocesses cases (``prepare``, ``inspect``).

Spawned, not forked: the parent may have TensorFlow's thread pools running, and forking those
is unsafe. Its workers ignore SIGINT: Ctrl-C at the terminal reaches the whole process group,
and the parent alone handles it (one message, not a traceback per worker): it cancels the
cases not started and stops the workers.
"""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def case_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_interrupts
    )


__all__ = ["case_pool"]
