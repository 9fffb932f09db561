"""The Ray Tune callback that feeds :class:`SearchTracker` from the driver.

It runs in the Tune driver, not in the trials: in data-parallel trials no worker ever
talks to MLflow, and a trial's metrics are logged once whatever its worker count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ray.tune import Callback

from distmis.metrics import (
    FAILURE,
    GROUP_STARTUP,
    PID,
    REPORTED_AT,
    STARTED_AT,
    TRACKED,
    WARM,
    is_class_metric,
)
from distmis.schema import RunFile, Tag
from distmis.space import sampled_params
from distmis.tracking._mlflow import SearchTracker, flatten
from distmis.tracking._plots import import_plotting


def tracked_metrics(epoch: Mapping[str, Any]) -> dict[str, float]:
    """What a trial's MLflow run logs of one epoch (a Tune result or a ``metrics.csv`` row): the
    tracked numbers and every per-class / per-region metric."""
    metrics = {k: epoch[k] for k in TRACKED if k in epoch}
    metrics.update({k: v for k, v in epoch.items() if is_class_metric(k) and isinstance(v, (int, float))})
    return metrics


def trial_end_tags(
    *,
    failed: bool,
    epochs: int,
    planned_epochs: int,
    error: str | None = None,
    started_at: float | None = None,
    finished_at: float | None = None,
) -> dict[str, str]:
    """The tags that close a trial's MLflow run, in one place so that the Tune callback and the
    catch-up of epochs Tune never reported write the same record as results.csv."""
    tags = {
        Tag.STATUS: "ERROR" if failed else "TERMINATED",
        Tag.EPOCHS: str(epochs),
        Tag.STOPPED_EARLY: str(not failed and epochs < planned_epochs).lower(),
    }
    if error:
        tags[Tag.ERROR] = error[:500]
    # measured trial interval (Unix seconds): timelines and time-to-target from MLflow alone
    for value, tag in ((started_at, Tag.STARTED_AT), (finished_at, Tag.FINISHED_AT)):
        if value:
            tags[tag] = repr(float(value))
    return tags


class MlflowTrialCallback(Callback):
    def __init__(
        self,
        tracker: SearchTracker,
        *,
        base_config: dict[str, Any],
        epochs: int,
        label: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        self.tracker = tracker
        self.base_config = base_config
        self.epochs = epochs
        #: the trial's MLflow run name from its config (a finalize's ``c0/fold1``); else Tune's trial id
        self.label = label

    def _params(self, trial: Any) -> dict[str, str]:
        from distmis.config import ExperimentConfig, apply_params

        cfg = apply_params(ExperimentConfig.model_validate(self.base_config), sampled_params(trial.config))
        data = cfg.to_yaml_dict()
        return flatten("", {k: data[k] for k in ("model", "optimizer", "train", "parallelism")}, {})

    def _tags(self) -> dict[str, str]:
        par = self.base_config["parallelism"]
        tags = {Tag.PARALLELISM_MODE: par["mode"], Tag.WORKERS_PER_TRIAL: str(par["workers_per_trial"])}
        try:
            import ray

            tags["ray.job_id"] = ray.get_runtime_context().get_job_id()
        except Exception:  # noqa: BLE001 - not connected: no tag
            pass
        if os.environ.get("RAY_JOB_SUBMISSION_ID"):
            tags["ray.submission_id"] = os.environ["RAY_JOB_SUBMISSION_ID"]
        if os.environ.get("SLURM_JOB_ID"):
            tags["slurm.job_id"] = os.environ["SLURM_JOB_ID"]
        return tags

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        searched = sampled_params(trial.config or {})  # grid / fixed points: the point's names, not "grid_point"
        self.tracker.trial_started(
            trial.trial_id,
            self.label(trial.config or {}) if self.label else trial.trial_id,
            self._params(trial),
            {**self._tags(), Tag.SEARCHED: ", ".join(sorted(searched))},
        )

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if "epoch" not in result:
            return
        if result.get("training_iteration") == 1 and result.get(STARTED_AT):
            # where the time before training went (read back by the comparison notebook)
            overhead = float(result["finished_at"]) - float(result[STARTED_AT]) - float(result["epoch_seconds"])
            self.tracker.trial_tags(
                trial.trial_id,
                {
                    Tag.GROUP_STARTUP_SECONDS: repr(float(result.get(GROUP_STARTUP, 0.0))),
                    Tag.WARM: str(bool(result.get(WARM))).lower(),
                    Tag.OVERHEAD_SECONDS: repr(overhead),
                    Tag.SLOT: str(result.get(PID, "")),
                },
            )
        self.tracker.trial_result(
            trial.trial_id, int(result["epoch"]), tracked_metrics(result), float(result.get(REPORTED_AT, time.time()))
        )

    def _finish(self, trial: Any, status: str) -> None:
        last = trial.last_result or {}
        if last.get(FAILURE):  # its configuration could not be trained: reported once, as a failure
            status = "FAILED"
        tags = trial_end_tags(
            failed=status == "FAILED",
            epochs=int(last.get("epoch", 0)),
            planned_epochs=self.epochs,
            error=str(last[FAILURE]) if last.get(FAILURE) else None,
            started_at=last.get(STARTED_AT),
            finished_at=last.get(REPORTED_AT),
        )
        best = Path(self.tracker.out) / RunFile.TRIALS_DIR / trial.trial_id / "best"
        self.tracker.trial_finished(trial.trial_id, status=status, tags=tags, best_dir=best)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finish(trial, "FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finish(trial, "FAILED")


class PlottingPreload(Callback):
    """Imports the plotting modules (:func:`~distmis.tracking.import_plotting`) on a thread when
    Tune's loop takes its first step, so the plots at the end do not wait for them.

    Why then: the plotting libraries take a second or two of CPU to import, and from Tune's first
    step until the first trial has imported TensorFlow a core is idle, while during Ray's start
    every core is busy (``benchmarks/tune_overhead.py`` measures the fixed cost it saves).
    """

    def __init__(self) -> None:
        self._started = False  # a flag, not the thread: Tune pickles its callbacks with the Tuner

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if not self._started:
            self._started = True
            from distmis.waits import Background

            # not waited for: an import error surfaces where the plots are drawn
            Background(import_plotting, name="distmis-plotting-import", nice=10)
