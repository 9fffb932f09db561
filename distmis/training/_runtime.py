"""Process-level TensorFlow settings: threads, GPU memory growth, quiet logs.

TensorFlow by default starts as many threads as the host has cores and reserves all GPU
memory. Two trials on one node then fight over both (seen here: two unpinned trials on 2
cores ran only 1.13x faster than one at a time, 1.38x when pinned). These must be set
before TensorFlow runs its first op, so the trial calls this first thing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sys
from typing import Any

from distmis.tensorflow_env import import_tensorflow

_log = logging.getLogger(__name__)
_threads: int | None = None  # what configure_tensorflow applied in this process


def configured_threads() -> int | None:
    """The thread budget set by :func:`configure_tensorflow` in this process (``None``: unlimited)."""
    return _threads


def release_in_background(owner: object, attribute: str) -> None:
    """Set ``owner.attribute`` to ``None`` and let its old value be torn down on a background thread.

    A finished trial's run (model, optimiser, traced steps, ``tf.data`` iterators under a
    multi-worker strategy) can take seconds to tear down; done inline it would delay the next
    trial on the same slot by as much. The old value must have no
    other reference, or it is torn down wherever that one is dropped.
    """
    import threading

    box = [getattr(owner, attribute)]
    setattr(owner, attribute, None)
    threading.Thread(target=box.clear, name="distmis-release", daemon=True).start()


def configure_tensorflow(threads: float | int | None) -> int | None:
    """Pin TensorFlow to ``threads`` intra-op threads (inter-op 2-3) and enable GPU memory growth.

    Returns the thread count applied, or ``None`` when TensorFlow was already initialised in
    this process (a reused trial actor): the earlier setting then stays in force.
    """
    global _threads
    tf = import_tensorflow()

    quiet_stop_requests_in_finalizers()
    applied: int | None = None
    if threads:
        n = max(1, int(math.floor(threads)))
        try:
            tf.config.threading.set_intra_op_parallelism_threads(n)
            # one inter-op thread more than the compute uses: the tf.data pipeline runs on this
            # pool (no private pool, see data._loader), so input and compute overlap instead of
            # the input waiting for the step
            tf.config.threading.set_inter_op_parallelism_threads(min(2, n) + 1)
            applied = _threads = n
        except RuntimeError:  # runtime already initialised in this process
            applied = None
    for gpu in tf.config.list_physical_devices("GPU"):
        with contextlib.suppress(RuntimeError):  # already initialised: it must be set before first use
            tf.config.experimental.set_memory_growth(gpu, True)
    return applied


def quiet_stop_requests_in_finalizers() -> None:
    """Keep a stop request that lands in a finalizer from printing a traceback on the user's console.

    A Ray worker answers SIGTERM by raising ``SystemExit`` wherever its main thread is. When that
    is a finalizer (TensorFlow's ``ConcreteFunction.__del__`` runs often while a trial is torn
    down), Python cannot raise it and prints an "Exception ignored" traceback instead, which Ray
    forwards to the console of a search that is already ending. The request is not lost by
    dropping it: whoever sends SIGTERM escalates (the raylet sends SIGKILL after
    ``kill_worker_timeout_milliseconds``, SLURM after ``KillWait``), and sending it again from
    here would run the handler inside this hook, still under the finalizer. Only a ``SystemExit``
    while SIGTERM has a Python handler is dropped; everything else goes to the hook that was
    there before. Idempotent.
    """
    if getattr(sys.unraisablehook, "_distmis_quiet_stop", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        stop = unraisable.exc_type is not None and issubclass(unraisable.exc_type, SystemExit)
        if stop and callable(signal.getsignal(signal.SIGTERM)):
            return
        previous(unraisable)

    hook._distmis_quiet_stop = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
