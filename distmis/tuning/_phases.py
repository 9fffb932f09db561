"""Phases a command that runs trials is made of, each small: ``tune``, ``compare`` and ``finalize`` compose them.

A search is: checks, ownership of ``--out``, data, a Ray session, tracking, trials, results, and
one ending for every way it can end. The Ray session and the timing of phases are context
managers here; the output's ownership is :mod:`distmis.files` and :mod:`distmis.locks`, tracking
is :mod:`distmis.tuning._tracking`, the trials :mod:`distmis.tuning._tuner`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from distmis.files import write_json_atomic
from distmis.waits import Background

if TYPE_CHECKING:
    from distmis.config import ExperimentConfig
    from distmis.tracking import SearchTracker

T = TypeVar("T")


class Timings:
    """Where a command's wall time went, phase by phase (``timings.json``: read by
    ``benchmarks/tune_overhead.py`` to profile the fixed cost outside the trials)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.seconds: dict[str, float] = {}
        self.summed: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def write(self, path: Path) -> None:
        """Phases of the command's wall time, then ``summed_*``: seconds summed over every trial's
        epochs (training steps and sliding-window validation), which overlap the ``trials`` phase."""
        write_json_atomic(path, {k: round(v, 3) for k, v in {**self.seconds, **self.summed}.items()})

    def sum_trial_epochs(self, grid: Any) -> None:
        """Total the trials' ``train_seconds`` and ``val_seconds`` (what validation costs a search)."""
        totals = {"summed_trial_train_seconds": 0.0, "summed_trial_validation_seconds": 0.0}
        for result in grid:
            frame = getattr(result, "metrics_dataframe", None)
            if frame is None:
                continue
            for column, key in (
                ("train_seconds", "summed_trial_train_seconds"),
                ("val_seconds", "summed_trial_validation_seconds"),
            ):
                if column in frame:
                    totals[key] += float(frame[column].fillna(0).sum())
        self.summed = totals


class RaySession:
    """The Ray a command runs on: its resources, and its end (see :func:`ray_session`)."""

    def __init__(self, resources: dict[str, float], *, connected_here: bool) -> None:
        self.resources = resources
        self._connected_here = connected_here
        self._ending: Background | None = None

    def end_in_background(self, *, disconnect_within: float = 30.0) -> None:
        """Stop the local Ray (or disconnect) on a thread; returns once this process is disconnected.

        Why: ``ray.shutdown()`` first disconnects this process, which ends its forwarding of the
        workers' output, then waits for a local Ray's processes to exit (0.1 s here with
        :func:`~distmis.raysession.shutdown_ray`; up to 1 s for each kind of process). Only the
        first part must come before what follows the trials (results, plots, MLflow's flush:
        this process's own work), so the workers' last lines still go where they went; the
        second runs beside it.
        :meth:`close` waits for it. The wait for the disconnection is bounded: past it, the
        search goes on and at most a few of Ray's lines reach the console.
        """
        if self._ending is not None or not self._connected_here:
            return
        import ray

        # Every object that exists now is out of the collector's reach until the shutdown is
        # through (gc.freeze); the shutdown's thread hands them back (gc.unfreeze).
        # Why: Ray 2.60's shutdown marks the driver disconnected first and shuts its core worker
        # down after. An ObjectRef freed in between (in a garbage cycle that the plots'
        # allocations got collected) calls into the core worker being shut down, and Ray
        # quick-exits the process with status 1 ("The core worker has already been shutdown"):
        # a finished search that exits 1 without its summary. Seen once in CI, in the test that
        # kills a trial's process (a RayActorError's traceback keeps ObjectRefs in a cycle), and
        # reproduced by collecting such cycles right after the disconnection (4 crashes in 5
        # runs). Once the core worker is gone, a freed ObjectRef finds none and Ray ignores it.
        # Freezing moves the collector's lists aside in constant time, where collecting them
        # first took 0.23-0.25 s of every search's end; objects made meanwhile (the plots') are
        # collected as usual, and so no explicit gc.collect() in a library reaches Ray's either.
        gc.freeze()
        self._ending = Background(lambda: self._end(unfreeze=True), name="distmis-ray-shutdown")
        deadline = time.monotonic() + disconnect_within
        while ray.is_initialized() and self._ending.running() and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        """Stop (or wait for the stop started by :meth:`end_in_background`): Ray is gone when this returns."""
        if self._ending is None and self._connected_here:
            self._end()
        elif self._ending is not None:
            self._ending.result()

    def _end(self, *, unfreeze: bool = False) -> None:
        import ray

        from distmis.raysession import shutdown_ray

        try:
            if ray.is_initialized():
                shutdown_ray()
        finally:
            if unfreeze:  # frozen by end_in_background until the core worker is gone
                gc.unfreeze()


@contextlib.contextmanager
def ray_session(
    address: str | None, *, env_vars: dict[str, str] | None = None, num_cpus: int | None = None
) -> Iterator[RaySession]:
    """A private local Ray, or the cluster at ``address`` / ``RAY_ADDRESS``; yields the session.

    Disconnects at the end when this call connected (a caller's own session is left alone); a
    local Ray it started stops with it.
    """
    from distmis.raysession import init_ray, use_private_token

    use_private_token(address)  # before Ray is imported anywhere in this process
    import ray

    connected_here = not ray.is_initialized()
    session = RaySession(init_ray(address, env_vars=env_vars, num_cpus=num_cpus), connected_here=connected_here)
    try:
        yield session
    finally:
        session.close()


def start_ray_and_tracking(
    session: contextlib.ExitStack,
    address: str | None,
    *,
    env_vars: dict[str, str],
    open_tracking: Callable[[], SearchTracker],
    config: ExperimentConfig,
    check: Callable[[RaySession], T],
) -> tuple[RaySession, SearchTracker, T]:
    """The Ray session (entered into ``session``) and the command's MLflow run, side by side.

    MLflow's part (its import, its database) runs on a thread at nice 10 while Ray starts its
    processes here: Ray's agents must be up before ``ray.init``'s 1 s poll for its node comes
    round (measured: ray+tracking start 3.85 -> 3.05 s, median of 6). ``check`` runs on the
    started Ray (do the trials fit?). A failure in Ray's start or in ``check`` closes the run
    opened meanwhile as FAILED, with the reason, and is raised.
    """
    tracking = Background(open_tracking, name="distmis-tracking", nice=10)
    try:
        ray_here = session.enter_context(ray_session(address, env_vars=env_vars))
        checked = check(ray_here)
    except BaseException as exc:
        _abandon(tracking, config, exc)
        raise
    tracker = cast("SearchTracker", tracking.result())
    tracker.send()  # its sender starts here, at this thread's priority (waits.priority_lowered)
    return ray_here, tracker, checked


def _abandon(tracking: Background, config: ExperimentConfig, exc: BaseException) -> None:
    """Ray could not start, or the trials cannot run on it: a run MLflow opened meanwhile is
    closed as FAILED with the reason."""
    from distmis.tuning._tracking import fail_search_tracking

    try:
        tracker = cast("SearchTracker", tracking.result())
    except BaseException:  # noqa: BLE001 - the Ray error is the one to report
        return
    fail_search_tracking(tracker, config, f"{type(exc).__name__}: {exc}")


def alive_nodes() -> list[dict[str, float]]:
    """The resources of every live node of the connected cluster."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def tune_environment() -> None:
    """Ray Tune's settings for a distmis search (defaults: a user's own values win)."""
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")  # experiment state saved often: resumable after kill -9
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    # checkpointing every epoch is deliberate (resume loses at most one epoch): no warning for it
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")


def search_inputs(config: ExperimentConfig, space_file: Path | None, base_dir: Path) -> dict[str, Any]:
    """What a search reads, which its ``--out`` must never be, contain or lie inside."""
    source = None if config.data.source == "synthetic" else base_dir / Path(config.data.source).expanduser()
    return {"data source": source, "search-space file": space_file}


def prepared_data(config: ExperimentConfig, base_dir: Path) -> Path:
    """The prepared directory a search trains on (made and cached on first use), its case files
    checked: a damaged case is named now, not in every trial."""
    from distmis.data import load_manifest, resolve_prepared, verify_cases

    prepared = resolve_prepared(config.data, base_dir=base_dir)
    manifest = load_manifest(prepared)
    for split in ("train", "val"):
        verify_cases(manifest, split)
    return prepared


__all__ = [
    "RaySession",
    "Timings",
    "alive_nodes",
    "prepared_data",
    "ray_session",
    "search_inputs",
    "start_ray_and_tracking",
    "tune_environment",
]
