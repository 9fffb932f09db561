"""Bounded waits on anything outside the process: a call that may hang is given a deadline.

A library call that connects somewhere (Ray to a cluster address, SQLAlchemy to a database that
accepts connections and never answers) can block for minutes with no word to the user. Such a
call runs on a daemon thread here, and the caller gets :class:`WaitExpired` when the deadline
passes: the command then says what it waited for and exits, and the abandoned thread dies with
the process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitExpired(Exception):
    """The call did not return within its bound (it may still be running on its thread)."""


def call_within(seconds: float, fn: Callable[[], T], *, name: str = "distmis-bounded-call") -> T:
    """``fn()``, or :class:`WaitExpired` if it has not returned after ``seconds``; its error is re-raised."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            error.append(exc)

    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    worker.join(max(0.0, seconds))
    if error:
        raise error[0]
    if not result:
        raise WaitExpired(f"no answer within {seconds:.0f} s")
    return result[0]


def retried_until(
    seconds: float,
    ask: Callable[..., T],
    *,
    retry_on: type[BaseException] = RuntimeError,
    between: Callable[[], object] | None = None,
    interval: float = 0.5,
) -> Callable[..., T]:
    """``ask``, asked again while it raises ``retry_on`` (something not up *yet*) until ``seconds``
    have passed since the first ask; then that error is raised. ``between`` runs after each refusal
    (to undo what a failed ask left); any other error is raised at once."""

    def patient(*args: Any) -> T:
        deadline = time.monotonic() + seconds
        while True:
            try:
                return ask(*args)
            except retry_on:
                if between is not None:
                    between()
                if time.monotonic() > deadline:
                    raise
                time.sleep(interval)  # a poll, bounded by the deadline above

    return patient


def lower_this_threads_priority(nice: int) -> None:
    """Give the calling thread (and threads it starts) the scheduling niceness ``nice``, unless it
    already runs at a lower priority (Linux only).

    Why: start-up work that can wait (MLflow's import while Ray starts its processes) then takes
    only the CPU that Ray's own start leaves idle instead of slowing it down. On Linux the nice
    value is a per-thread attribute (``man 7 sched``); elsewhere ``setpriority`` would apply to
    the whole process (or to whatever process has that number), so nothing is done there. A
    thread cannot raise its priority back without privileges: call this only on a thread that
    ends with its task (:func:`priority_lowered` tells a thread's long-lived helpers so).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread, max(nice, os.getpriority(os.PRIO_PROCESS, thread)))  # never raised


def priority_lowered() -> bool:
    """Whether the calling thread runs at a lower priority than its process's main thread.

    A thread inherits the niceness of the thread that starts it, and cannot raise it back
    without privileges: a long-lived thread (MLflow's sender) started here would keep this
    priority for the whole command, behind every trial. Its owner starts it from another thread.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:  # on Linux the process id names the main thread
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) > os.getpriority(os.PRIO_PROCESS, os.getpid())
    except OSError:
        return False


class Background:
    """``fn()`` started on a thread now, its result (or error) collected later with :meth:`result`.

    Start-up work that waits on something else (MLflow's database while Ray starts its
    processes) runs side by side instead of one after the other.
    """

    def __init__(self, fn: Callable[[], T], *, name: str, nice: int = 0) -> None:
        self._result: list[object] = []
        self._error: list[BaseException] = []

        def target() -> None:
            if nice:
                lower_this_threads_priority(nice)
            try:
                self._result.append(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to result()
                self._error.append(exc)

        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def running(self) -> bool:
        """Whether the call has not returned (or raised) yet."""
        return self._thread.is_alive()

    def result(self) -> object:
        """Wait for the call to end; its return value, or its error raised here."""
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._result[0]


__all__ = [
    "Background",
    "WaitExpired",
    "call_within",
    "lower_this_threads_priority",
    "priority_lowered",
    "retried_until",
]
