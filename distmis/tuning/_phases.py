"""Phases a command that runs trials is made of, each small: ``tune``, ``compare`` and ``finalize`` compose them.

A search is: checks, ownership of ``--out``, data, a Ray session, tracking, trials, results, and
one ending for every way it can end. The Ray session and the timing of phases are context
managers here; the output's ownership is :mod:`distmis.files` and :mod:`distmis.locks`, tracking
is :mod:`distmis.tuning._tracking`, the trials :mod:`distmis.tuning._tuner`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from distmis.files import write_json_atomic
from distmis.raysession import RaySession, ray_session
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
    round, and MLflow's import would otherwise compete with them for the CPU. ``check`` runs on the
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
    "Timings",
    "alive_nodes",
    "prepared_data",
    "search_inputs",
    "start_ray_and_tracking",
    "tune_environment",
]
