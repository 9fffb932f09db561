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

from distmis.files import ensure_directory, write_text_atomic
from distmis.metrics import (
    FAILURE,
    GROUP_STARTUP,
    NODE,
    PID,
    REPORTED_AT,
    STARTED_AT,
    TRIAL_SETUP,
    WARM,
    configuration_failure,
    divergence,
)
from distmis.space import sampled_params


def _configuration_errors() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError

    from distmis.exceptions import DistmisError

    return (DistmisError, ValidationError)


#: errors that come from a trial's configuration or data, not from chance: retrying the
#: trial would only repeat them (a TensorFlow or Ray error is not among them)
CONFIGURATION_ERRORS = _configuration_errors()


def describe_failure(exc: BaseException) -> str:
    """One line: which field or file, and what was wrong."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        from distmis.documents import describe_validation_error

        return f"invalid configuration: {describe_validation_error(exc)}"[:500]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


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
    #: Unix time by which an epoch must end to be kept (``search.time_budget``; ``None``: no budget)
    keep_until: float | None = None


def trial_resources(workers: int, cpus_per_worker: float, gpus_per_worker: float) -> Any:
    """One bundle for a single-worker trial; an empty bundle (the trainable only coordinates)
    plus one per worker otherwise, placed by Tune like the trial itself."""
    from ray.tune import PlacementGroupFactory

    bundle = {"CPU": cpus_per_worker, "GPU": gpus_per_worker}
    if workers == 1:
        return PlacementGroupFactory([bundle])
    return PlacementGroupFactory([{}] + [dict(bundle) for _ in range(workers)], strategy="PACK")


class DistmisTrial(tune.Trainable):
    """Tune trainable: ``setup`` opens a run, ``step`` runs an epoch, the same calls for one worker or N.

    Its runner is a :class:`~distmis.tuning._workers.TrialSession` in this process (one worker)
    or a :class:`~distmis.tuning._workers.WorkerGroup` of them (N workers): both start, step and
    restore a trial alike, so there is one code path for a trial's epochs.
    """

    _context: TrialContext  # set by ``trainable_for``

    def setup(self, config: dict[str, Any]) -> None:
        from distmis.tuning._workers import TrialSession, WorkerGroup, _process_start_time

        ctx = self._context
        self._trials_here = 0
        created = _process_start_time()
        self._group: WorkerGroup | None = None
        self._runner: TrialSession | WorkerGroup
        if ctx.workers == 1:
            from distmis.training import configure_tensorflow

            configure_tensorflow(ctx.threads)
            import tensorflow  # noqa: F401 - part of this slot's cold start, not of the trial's set-up

            self._runner = TrialSession()
        else:
            self._runner = self._group = WorkerGroup(
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
        from distmis.tuning._workers import TrialStart

        ctx = self._context
        params = sampled_params(config)
        apply_params(ExperimentConfig.model_validate(ctx.base_config), params)  # here: a bad one fails fast
        self._node = ray.util.get_node_ip_address()
        self._run_dir = Path(ctx.trials_dir) / self.trial_id
        ensure_directory(self._run_dir, what="trial directory")
        if self._group is not None:
            write_text_atomic(
                self._run_dir / "group.json",
                json.dumps(
                    {  # where this trial's workers must run
                        "placement_group": ray.get_runtime_context().get_placement_group_id(),
                        "trainable_pid": os.getpid(),
                    }
                ),
            )
        # a restarted trial (its process died) continues from its own last epoch even when Tune
        # has no checkpoint of it yet: none of those epochs reached Tune, so all are reported again;
        # Tune's own checkpoint, if newer, is loaded after this
        own = self._run_dir / "checkpoint"
        resume = str(own) if (own / "state.npz").is_file() else None
        spec = TrialStart(
            ctx.base_config,
            params,
            ctx.prepared,
            str(self._run_dir),
            ctx.metric,
            ctx.mode,
            resume,
            reported_epochs=0,
            keep_until=ctx.keep_until,
        )
        epoch = self._runner.start(spec)
        if resume is not None:
            print(f"distmis: trial {self.trial_id} resumes from epoch {epoch}", flush=True)

    def step(self) -> dict[str, Any]:
        if self._failure is not None:
            return configuration_failure(self._failure, self._started)
        began = time.time()
        metrics = self._runner.step()
        done = metrics.pop("done") or self._next_epoch_too_late(time.time() - began)
        diverged = divergence(metrics, self._context.metric)
        if diverged is not None:  # a failed trial, not a result: Optuna records FAIL, Tune does not retry
            metrics[FAILURE] = diverged
            done = True
            print(f"distmis: trial {self.trial_id} {diverged}", flush=True)
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

    def _next_epoch_too_late(self, last_epoch_seconds: float) -> bool:
        """Whether another epoch as long as the last would end after the search's time budget.

        Such an epoch would be dropped (see :func:`~distmis.tuning._deadline.epochs_kept_until`):
        ending the trial here frees its CPUs or GPUs and ends the search on time instead.
        """
        keep_until = self._context.keep_until
        if keep_until is None or time.time() + last_epoch_seconds <= keep_until:
            return False
        print(
            f"distmis: trial {self.trial_id} ends here: another epoch ({last_epoch_seconds:.0f} s) would end "
            "after search.time_budget",
            flush=True,
        )
        return True

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self._failure is not None:
            return
        src = self._run_dir / "checkpoint"  # written by this process, or by the group's chief
        for name in ("state.npz", "state.json"):
            shutil.copy2(src / name, Path(checkpoint_dir) / name)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        if self._failure is not None:
            return
        self._runner.restore(checkpoint_dir)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._start_session(new_config)
        return True

    def cleanup(self) -> None:
        if self._group is not None:
            self._group.shutdown()


def trainable_for(context: TrialContext) -> type[DistmisTrial]:
    """A trainable class bound to ``context`` (kept small: Tune ships the class to every actor)."""
    return type("distmis_trial", (DistmisTrial,), {"_context": context})
