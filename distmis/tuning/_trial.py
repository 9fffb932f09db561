"""One Tune trial (experiment parallelism): train one sampled configuration on one worker.

A class trainable rather than a function: Ray Tune 2.60 can reuse an actor between trials
only through ``reset_config`` (function trainables refuse reuse), and reuse is what keeps
the trial processes warm — TensorFlow imported and its thread pools set up once per actor,
not once per trial. Each Tune iteration is one epoch; Tune checkpoints every epoch so ASHA
can stop a trial and a failed trial restarts from its last epoch.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from distmis.tuning._keys import (
    CONFIGURATION_ERRORS,
    NODE,
    PID,
    REPORTED_AT,
    STARTED_AT,
    configuration_failure,
    describe_failure,
    sampled_params,
)


@dataclass(frozen=True)
class TrialContext:
    """What every trial needs besides its sampled parameters (shared via the object store)."""

    base_config: dict[str, Any]
    prepared: str
    trials_dir: str
    metric: str
    mode: str
    threads: int


class DistmisTrial(tune.Trainable):
    """Tune trainable: ``setup`` builds a :class:`~distmis.training.RunSession`, ``step`` runs an epoch."""

    _context: TrialContext  # set by ``trainable_for``

    def setup(self, config: dict[str, Any]) -> None:
        from distmis.training import configure_tensorflow

        configure_tensorflow(self._context.threads)
        self._start_session(config)

    def _start_session(self, config: dict[str, Any]) -> None:
        """Start the trial's run; a configuration the trial cannot train is recorded, not raised.

        Raising would make Tune retry the trial ``max_failures`` times with the same
        configuration and the same outcome; instead the first ``step`` reports the reason once
        and ends the trial (see :func:`configuration_failure`).
        """
        self._failure: str | None = None
        try:
            self._open_session(config)
        except CONFIGURATION_ERRORS as exc:
            self._failure = describe_failure(exc)
            print(f"distmis: trial {self.trial_id} cannot run its configuration: {self._failure}", flush=True)

    def _open_session(self, config: dict[str, Any]) -> None:
        import keras
        import ray

        from distmis.config import ExperimentConfig, apply_params
        from distmis.training import RunSession

        keras.backend.clear_session()  # a reused actor must not keep the previous trial's graphs
        ctx = self._context
        self._started = time.time()
        trial_config = apply_params(ExperimentConfig.model_validate(ctx.base_config), sampled_params(config))
        self._epochs = trial_config.train.epochs
        self._node = ray.util.get_node_ip_address()
        run_dir = Path(ctx.trials_dir) / self.trial_id
        # a restarted trial (its process died) continues from its own last epoch even when
        # Tune has no checkpoint of it yet; Tune's own checkpoint, if newer, is loaded after this
        own = run_dir / "checkpoint"
        resume = own if (own / "state.npz").is_file() else None
        self._session = RunSession(trial_config, ctx.prepared, run_dir, metric=ctx.metric, mode=ctx.mode)
        if resume is not None:  # Tune knows of none of these epochs (yet): all are reported again
            self._session.restore(resume, reported_epochs=0)
        if resume is not None:
            print(f"distmis: trial {self.trial_id} resumes from epoch {self._session.epoch}", flush=True)

    def step(self) -> dict[str, Any]:
        if self._failure is not None:
            return configuration_failure(self._failure, self._started)
        metrics = self._session.step().as_dict()
        metrics.update({STARTED_AT: self._started, REPORTED_AT: time.time(), PID: os.getpid(), NODE: self._node})
        if self._session.done:
            metrics[tune.result.DONE] = True
        return metrics

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self._failure is not None:
            return
        src = self._session.checkpoint_dir
        for name in ("state.npz", "state.json"):
            shutil.copy2(src / name, Path(checkpoint_dir) / name)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self._session.restore(checkpoint_dir)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._start_session(new_config)
        return True


def trainable_for(context: TrialContext) -> type[DistmisTrial]:
    """A trainable class bound to ``context`` (kept small: Tune ships the class to every actor)."""
    return type("distmis_trial", (DistmisTrial,), {"_context": context})
