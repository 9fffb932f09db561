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
