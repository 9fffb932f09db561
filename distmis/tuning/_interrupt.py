"""Telling a search that was asked to stop (the wall-time warning, Ctrl-C) from one that ended."""

from __future__ import annotations

import threading

from ray.tune import Callback

#: set by SIGUSR1 / SIGINT: before Tune runs (the search then starts no trial) or while it runs
#: (Tune stops gracefully and saves its state; the search exits 75, resumable with --resume)
STOP_REQUESTED = threading.Event()


def stop_on_walltime_warning() -> None:
    """Make SIGUSR1 (the wall-time warning the SLURM job script forwards) request a stop.

    The warning may come before Tune runs (while data is checked or Ray starts): the command
    then starts no trial and exits 75, resumable. While Tune runs, :class:`InterruptWatch` wraps
    Tune's own handler instead.
    """
    import signal

    signal.signal(signal.SIGUSR1, lambda *_: STOP_REQUESTED.set())


def stop_on_signals() -> None:
    """After Tune has run, make both Ctrl-C and SIGUSR1 request a stop (checked between steps).

    Tune leaves its own SIGINT handler in place when it returns, which only logs; work after the
    trials (a finalize's out-of-fold predictions) would ignore Ctrl-C and the wall-time warning.
    """
    import signal

    for sig in (signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, lambda *_: STOP_REQUESTED.set())


class InterruptWatch(Callback):
    """Notices that Tune was asked to stop (SIGUSR1 from the job script, SIGINT from Ctrl-C).

    Tune installs its own handlers for both when the experiment starts and stops gracefully
    (saving its state), but after its clean-up the trials it stopped look finished. This
    callback's ``setup`` runs after Tune's handlers are in place and wraps them, so the search
    can tell an interruption (exit 75, resumable) from an end.
    """

    def setup(self, **info: object) -> None:
        import signal

        for sig in (signal.SIGUSR1, signal.SIGINT):
            previous = signal.getsignal(sig)

            def handler(signum: int, frame: object, previous: object = previous) -> None:
                STOP_REQUESTED.set()
                if callable(previous):
                    previous(signum, frame)

            signal.signal(sig, handler)


__all__ = ["STOP_REQUESTED", "InterruptWatch", "stop_on_signals", "stop_on_walltime_warning"]
