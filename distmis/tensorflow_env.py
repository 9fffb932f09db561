"""The environment distmis's TensorFlow runs in, in every process that may import it.

TensorFlow reads these variables once, when it is imported, so they are set first thing in
the CLI and handed to every Ray worker (``runtime_env``) and child ``distmis`` process. A
value the user set wins: each is only a default.

* ``TF_CPP_MIN_LOG_LEVEL=2`` hides the C++ info banners (CPU features, oneDNN).
* ``TF_ENABLE_ONEDNN_OPTS=1`` turns on TensorFlow's oneDNN CPU kernels. TensorFlow enables them
  by itself only on CPUs with AVX-512 VNNI/BF16 or AMX; on the others (AVX2 laptops and older
  cluster nodes) Conv3D runs on TensorFlow's generic kernels, whose weight gradient builds an
  im2col buffer 27 times its input, so oneDNN's kernels are both faster and far smaller in
  memory there (``benchmarks/remat.py`` measures both). GPU kernels are not affected.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

DEFAULTS: dict[str, str] = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_ENABLE_ONEDNN_OPTS": "1",
}


def tensorflow_env() -> dict[str, str]:
    """The TensorFlow variables in force for this process: the user's value, else distmis's default."""
    return {name: os.environ.get(name, default) for name, default in DEFAULTS.items()}


def onednn_enabled() -> bool | None:
    """Whether TensorFlow, as imported in this process, runs its oneDNN CPU kernels; None if unknown.

    TensorFlow's own decision, not the variable's: with ``TF_ENABLE_ONEDNN_OPTS`` unset or empty
    it depends on the CPU, and it only reads the variable when it is imported. The answer comes
    from a private module (no public API reports it), so a TensorFlow without it gives None
    rather than a guess. Imports TensorFlow (through :func:`import_tensorflow`) if needed.
    """
    import_tensorflow()
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    is_enabled = getattr(_pywrap_util_port, "IsMklEnabled", None)
    return bool(is_enabled()) if is_enabled is not None else None


def apply_tensorflow_env() -> None:
    """Set the defaults this process's environment lacks; call before TensorFlow is imported."""
    for name, default in DEFAULTS.items():
        os.environ.setdefault(name, default)


# What TensorFlow prints at import once oneDNN is on: absl's notice that logging is not yet
# initialised, then port.cc's "oneDNN custom operations are on". Both come from absl before its
# logging is set up, so TF_CPP_MIN_LOG_LEVEL (and no other setting) hides them.
_IMPORT_BANNERS = ("All log messages before absl::InitializeLog() is called", "oneDNN custom operations are on")


#: packages Keras 3 imports eagerly when they are installed, for features distmis never uses: its
#: scikit-learn wrappers (``keras.wrappers``) and its image gallery (``keras.visualization``, pyplot).
#: Both imports are guarded by ``except ImportError`` in Keras. scikit-learn comes with MLflow and
#: matplotlib draws distmis's plots, so both are installed wherever distmis is.
KERAS_OPTIONAL = ("sklearn", "matplotlib")


class _Unavailable(importlib.abc.MetaPathFinder):
    """An import finder that reports ``names`` (top-level packages) as not installed, to the thread
    that created it only: another thread of the process imports them as usual meanwhile."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)
        self.thread = threading.get_ident()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> None:
        if fullname.partition(".")[0] in self.names and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"{fullname} is skipped while TensorFlow is imported", name=fullname)


@contextlib.contextmanager
def _without(names: Sequence[str]) -> Iterator[None]:
    """``names`` cannot be imported by this thread inside the block (unless already imported); afterwards they can.

    Why: Keras imports scikit-learn (with SciPy) and ``matplotlib.pyplot`` as TensorFlow loads.
    Those imports more than double TensorFlow's import time (``benchmarks/tune_overhead.py``), and
    every trial process, worker actor and ``predict`` process pays that import once. Keras's
    guards then leave those optional features off; a later ``import matplotlib`` (distmis's
    plots) works as usual, since the finder is removed when the block ends.
    """
    finder = _Unavailable([n for n in names if n not in sys.modules])
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def exit_without_teardown(code: int) -> NoReturn:
    """End this process with ``code`` now: logging shut down, the standard streams flushed, and no
    interpreter teardown.

    Why: the ``distmis`` command has written everything by then, and Python's own teardown frees
    Ray's, MLflow's and matplotlib's modules one object at a time, which nobody needs to wait for.
    (A tf.data iterator alive at exit no longer needs it: :func:`release_data_iterators`.)
    """
    if "logging" in sys.modules:
        import logging

        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a reader that went away
            stream.flush()
    os._exit(code)


def release_data_iterators() -> int:
    """Destroy every live tf.data iterator now, while the interpreter can still run Python; returns
    how many there were.

    Why: distmis reads patches in Python inside tf.data (``tf.numpy_function``). An iterator still
    alive when the interpreter finalises (a script's global, a notebook's variable) has reads in
    flight or queued, which can never take the GIL again, so its destructor waits forever and the
    script never ends. Run at exit (:func:`release_data_iterators_at_exit`), before finalisation:
    each iterator's resource is dropped, TensorFlow cancels its pipeline and waits for the reads in
    flight, which finish because the GIL is free to take. ``OwnedIterator._iterator_resource`` is
    TensorFlow's own attribute, used here and nowhere else.
    """
    import gc

    if "tensorflow" not in sys.modules:
        return 0
    tf = sys.modules["tensorflow"]
    released = 0
    for obj in gc.get_objects():
        if isinstance(obj, tf.data.Iterator) and getattr(obj, "_iterator_resource", None) is not None:
            with contextlib.suppress(Exception):  # an iterator half made or already gone: nothing to free
                obj._iterator_resource = None
                released += 1
    gc.collect()
    return released


_RELEASE_REGISTERED = False


def release_data_iterators_at_exit() -> None:
    """Register :func:`release_data_iterators` to run at interpreter exit (once per process)."""
    global _RELEASE_REGISTERED
    if not _RELEASE_REGISTERED:
        import atexit

        atexit.register(release_data_iterators)
        _RELEASE_REGISTERED = True


def import_tensorflow() -> Any:
    """Import TensorFlow in distmis's environment, without Keras's optional integrations
    (:data:`KERAS_OPTIONAL`) and its import banner (:func:`_import_banners_dropped`); returns the module."""
    apply_tensorflow_env()
    if "tensorflow" in sys.modules:
        import tensorflow

        return tensorflow
    with _without(KERAS_OPTIONAL), _import_banners_dropped():
        import tensorflow

    return tensorflow


@contextlib.contextmanager
def _import_banners_dropped() -> Iterator[None]:
    """Without an explicit ``TF_CPP_MIN_LOG_LEVEL`` of 0, the import-time oneDNN banner is dropped:
    file descriptor 2 is captured inside the block, and every other line is written back.

    Hand-written because the banner is printed by C++ code before any logging setting applies.
    """
    if os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0":
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not any(banner in line for banner in _IMPORT_BANNERS):
                    sys.stderr.write(line)
            sys.stderr.flush()


#: how TensorFlow names the registration of a ``tf.custom_gradient`` traced in a graph
_CUSTOM_GRADIENT_PREFIX = "CustomGradient-"


def _gradient_registry() -> dict[str, Any] | None:
    """TensorFlow's process-wide gradient registry (name -> entry), or None where this TensorFlow
    keeps it elsewhere (then nothing is forgotten, and nothing breaks)."""
    import_tensorflow()
    try:
        from tensorflow.python.framework import ops
    except ImportError:
        return None
    entries = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
    return entries if isinstance(entries, dict) else None


def custom_gradient_names() -> frozenset[str]:
    """The graph-mode custom gradients registered in this process so far: take it before a trial
    traces its steps, and hand it to :func:`forget_custom_gradients` once the trial is over."""
    entries = _gradient_registry()
    return frozenset(k for k in entries or () if k.startswith(_CUSTOM_GRADIENT_PREFIX))


def forget_custom_gradients(kept: frozenset[str]) -> int:
    """Unregister the graph-mode custom gradients registered since ``kept``; returns how many.

    Why: each trace of a ``tf.custom_gradient`` registers its gradient function under a new
    name in a registry that is never pruned, and that function holds the traced graph (TensorFlow
    #97697). Keras's optimiser all-reduces its gradients through one, so every trial's train step
    stays in memory in a process that runs trial after trial, and every full garbage collection
    walks it again (``benchmarks/warm_trials.py``). Call only once the graphs traced since ``kept``
    will never be differentiated again: the trial that traced them has ended.
    """
    entries = _gradient_registry()
    if entries is None:
        return 0
    stale = [k for k in list(entries) if k.startswith(_CUSTOM_GRADIENT_PREFIX) and k not in kept]
    for name in stale:
        entries.pop(name, None)
    return len(stale)
