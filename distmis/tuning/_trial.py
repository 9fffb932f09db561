"""One Tune trial, for every parallelism mode: train one sampled configuration.

A class trainable rather than a function: Ray Tune 2.60 can reuse an actor between trials
only through ``reset_config`` (function trainables refuse reuse), and reuse is what keeps the
trial processes warm. One worker (experiment parallelism) trains in this process, TensorFlow
imported and its thread pools set up once per actor. N workers (data or hybrid parallelism)
are a :class:`~distmis.tuning._workers.WorkerGroup` of actors in this trial's own placement
group bundles, kept across trials as well: the comparison of the modes measures parallelism,
not process start-up. Each Tune iteration is one epoch; Tune checkpoints every epoch so ASHA
can stop a trial and a failed trial restarts from its last epoch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from distmis.tuning._keys import (
    CONFIGURATION_ERRORS,
    GROUP_STARTUP,
    NODE,
    PID,
    REPORTED_AT,
    STARTED_AT,
    WARM,
    configuration_failure,
    describe_failure,
    sampled_params,
)

#: seconds from the trial's start to its run being ready (a warm slot: building the model)
TRIAL_SETUP = "trial_setup_seconds"


@dataclass(frozen=True)
class TrialContext:
    """What every trial needs besides its sampled parameters (shared via the object store)."""

    base_config: dict[str, Any]
    prepared: str
    trials_dir: str
    metric: str
    mode: str
    threads: int
    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0


def trial_resources(workers: int, cpus_per_worker: float, gpus_per_worker: float) -> Any:
    """One bundle for a single-worker trial; an empty bundle (the trainable only coordinates)
    plus one per worker otherwise, placed by Tune like the trial itself."""
    from ray.tune import PlacementGroupFactory

    bundle = {"CPU": cpus_per_worker, "GPU": gpus_per_worker}
    if workers == 1:
        return PlacementGroupFactory([bundle])
    return PlacementGroupFactory([{}] + [dict(bundle) for _ in range(workers)], strategy="PACK")


class DistmisTrial(tune.Trainable):
    """Tune trainable: ``setup`` opens a run (here, or on the worker group), ``step`` runs an epoch."""

    _context: TrialContext  # set by ``trainable_for``

    def setup(self, config: dict[str, Any]) -> None:
        from distmis.tuning._workers import _process_start_time

        ctx = self._context
        self._group: Any = None
        self._trials_here = 0
        created = _process_start_time()
        if ctx.workers == 1:
            from distmis.training import configure_tensorflow

            configure_tensorflow(ctx.threads)
            import tensorflow  # noqa: F401 - part of this slot's cold start, not of the trial's set-up
        else:
            from distmis.tuning._workers import WorkerGroup

            self._group = WorkerGroup(
                ctx.workers, cpus=ctx.cpus_per_worker, gpus=ctx.gpus_per_worker, threads=ctx.threads
            )
            created = min(created, self._group.started_at)
        self._startup = time.time() - created  # once per slot (trainable + its workers)
        self._start_session(config)

    def _start_session(self, config: dict[str, Any]) -> None:
        """Start the trial's run; a configuration the trial cannot train is recorded, not raised.

        Raising would make Tune retry the trial ``max_failures`` times with the same
        configuration and the same outcome; instead the first ``step`` reports the reason once
        and ends the trial (see :func:`configuration_failure`).
        """
        self._failure: str | None = None
        self._started = time.time()
        self._warm = self._trials_here > 0
        self._trials_here += 1
        try:
            self._open_session(config)
        except CONFIGURATION_ERRORS as exc:
            self._failure = describe_failure(exc)
            print(f"distmis: trial {self.trial_id} cannot run its configuration: {self._failure}", flush=True)
        self._setup_seconds = time.time() - self._started

    def _open_session(self, config: dict[str, Any]) -> None:
        import ray

        from distmis.config import ExperimentConfig, apply_params

        ctx = self._context
        params = sampled_params(config)
        trial_config = apply_params(ExperimentConfig.model_validate(ctx.base_config), params)  # here: fails fast
        self._node = ray.util.get_node_ip_address()
        self._run_dir = Path(ctx.trials_dir) / self.trial_id
        # a restarted trial (its process died) continues from its own last epoch even when
        # Tune has no checkpoint of it yet; Tune's own checkpoint, if newer, is loaded after this
        own = self._run_dir / "checkpoint"
        resume = own if (own / "state.npz").is_file() else None
        if self._group is None:
            from distmis.training import RunSession, release_in_background

            if hasattr(self, "_session"):
                release_in_background(self, "_session")  # torn down off the next trial's path
            self._session = RunSession(trial_config, ctx.prepared, self._run_dir, metric=ctx.metric, mode=ctx.mode)
            if resume is not None:  # Tune knows of none of these epochs (yet): all are reported again
                self._session.restore(resume, reported_epochs=0)
            epoch = self._session.epoch
        else:
            self._run_dir.mkdir(parents=True, exist_ok=True)
            (self._run_dir / "group.json").write_text(
                json.dumps(
                    {  # where this trial's workers must run
                        "placement_group": ray.get_runtime_context().get_placement_group_id(),
                        "trainable_pid": os.getpid(),
                    }
                )
            )
            epoch = self._group.call(
                "start_trial",
                ctx.base_config,
                params,
                ctx.prepared,
                str(self._run_dir),
                ctx.metric,
                ctx.mode,
                str(resume) if resume else None,
                0,
            )[0]
        if resume is not None:
            print(f"distmis: trial {self.trial_id} resumes from epoch {epoch}", flush=True)

    def step(self) -> dict[str, Any]:
        if self._failure is not None:
            return configuration_failure(self._failure, self._started)
        if self._group is None:
            metrics = self._session.step().as_dict()
            metrics["done"] = self._session.done
            metrics["global_batch"] = self._session.trainer.global_batch
        else:
            metrics = self._group.call("step")[0]
        done = metrics.pop("done")
        metrics.update(
            {
                STARTED_AT: self._started,
                REPORTED_AT: time.time(),
                PID: os.getpid(),
                NODE: self._node,
                "workers": self._context.workers,
                GROUP_STARTUP: self._startup,
                TRIAL_SETUP: self._setup_seconds,
                WARM: self._warm,
            }
        )
        if done:
            metrics[tune.result.DONE] = True
        return metrics

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self._failure is not None:
            return
        src = self._run_dir / "checkpoint"  # written by this process, or by the group's chief
        for name in ("state.npz", "state.json"):
            shutil.copy2(src / name, Path(checkpoint_dir) / name)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        if self._failure is not None:
            return
        if self._group is None:
            self._session.restore(checkpoint_dir)
        else:
            self._group.call("restore", checkpoint_dir, None)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._start_session(new_config)
        return True

    def cleanup(self) -> None:
        if self._group is not None:
            self._group.shutdown()


def trainable_for(context: TrialContext) -> type[DistmisTrial]:
    """A trainable class bound to ``context`` (kept small: Tune ships the class to every actor)."""
    return type("distmis_trial", (DistmisTrial,), {"_context": context})
