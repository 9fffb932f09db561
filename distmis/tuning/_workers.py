"""A data-parallel trial's worker group, kept warm across trials.

A Ray Train ``TensorflowTrainer`` per trial would start new worker processes, import
TensorFlow again and set up the collective again for every trial: many times an epoch of a
small search (``benchmarks/data_parallel.py``), so ``distmis compare`` would measure process
start-up more than data parallelism.

Here the trainable asks Tune for one (empty) bundle for itself and one per worker
(``PlacementGroupFactory``), starts one :class:`TrainingWorker` actor in each worker bundle,
and keeps them for as long as Tune reuses the trainable (``reuse_actors``). Each worker
builds its ``MultiWorkerMirroredStrategy`` once; each trial builds its model and optimiser in
that strategy's scope (:class:`~distmis.training.RunSession` already takes a strategy) - the
way Keras Tuner runs many trials under one strategy. The actors live in the trial's own
placement group, so when Tune stops the trial (ASHA) or the trainable, Ray removes the group
and the workers with it: nothing leaks (Ray #54305 is that leak between Tune and Train V2).

A worker that dies makes every call on the group fail at once (``ray.wait`` returns the dead
actor's error instead of waiting on the survivors, which hang in their collective): the group
is killed and the trial fails, and Tune restarts it on a new group from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmis.files import ensure_directory, write_text_atomic
from distmis.metrics import NODE, PID


class WorkerLost(RuntimeError):
    """A worker process of the trial's group died; the trial is restarted on a new group."""


@dataclass(frozen=True)
class TrialStart:
    """What a trial's run needs to start: its configuration, data and run directory."""

    base_config: dict[str, Any]
    params: dict[str, Any]
    prepared: str
    run_dir: str
    metric: str
    mode: str
    #: a checkpoint to continue from (the run directory's own, after a restart)
    resume_from: str | None = None
    #: epochs Tune has already seen; those after it are reported again
    reported_epochs: int | None = 0
    #: Unix time by which an epoch must end to be kept (``search.time_budget``; ``None``: no budget)
    keep_until: float | None = None


class TrialSession:
    """One process's part of a trial, the same whether the trial has one worker or N.

    A single-worker trial holds one in its trainable's process; each worker actor of a group is
    one (:class:`TrainingWorker`). It runs a :class:`~distmis.training.RunSession` per trial, in the
    process's strategy (the default one, or the group's ``MultiWorkerMirroredStrategy``).
    """

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world
        self.strategy: Any = None
        self.session: Any = None
        #: the custom gradients registered before this process's current trial traced its steps
        self.gradients_before: frozenset[str] | None = None

    def start(self, spec: TrialStart) -> int:
        """A new run for this trial; returns the epoch it starts from."""
        from distmis.config import ExperimentConfig, apply_params
        from distmis.tensorflow_env import custom_gradient_names, forget_custom_gradients
        from distmis.training import RunSession, release_in_background

        t0 = time.perf_counter()
        release_in_background(self, "session")  # the previous trial's run goes, off this path
        if self.gradients_before is not None:
            forget_custom_gradients(self.gradients_before)  # or its traced train step stays with the process
        self.gradients_before = custom_gradient_names()
        # no keras.backend.clear_session(): the layer names are explicit, and clearing the kernel cache
        # waits for the previous trial's input pipeline to shut down, which can take seconds
        config = apply_params(ExperimentConfig.model_validate(spec.base_config), spec.params)
        run = Path(spec.run_dir)
        ensure_directory(run, what="trial directory")
        t1 = time.perf_counter()
        self.session = RunSession(
            config,
            spec.prepared,
            run,
            strategy=self.strategy,
            is_chief=self.rank == 0,
            metric=spec.metric,
            mode=spec.mode,
            keep_until=spec.keep_until,
        )
        t2 = time.perf_counter()
        if spec.resume_from is not None:
            self.session.restore(spec.resume_from, reported_epochs=spec.reported_epochs, prefer_own=True)
        if self.world > 1:
            self._record(run, {"release": t1 - t0, "build": t2 - t1, "total": time.perf_counter() - t0})
        return int(self.session.epoch)

    def _record(self, run: Path, seconds: dict[str, float]) -> None:
        """``worker-<rank>.json``: where this worker ran and how long its trial set-up took."""
        import ray

        context = ray.get_runtime_context()
        write_text_atomic(
            run / f"worker-{self.rank}.json",
            json.dumps(
                {
                    "rank": self.rank,
                    "world": self.world,
                    NODE: ray.util.get_node_ip_address(),
                    PID: os.getpid(),
                    "placement_group": context.get_placement_group_id(),
                    "setup_seconds": {k: round(v, 3) for k, v in seconds.items()},
                }
            ),
        )

    def restore(self, checkpoint: str) -> int:
        """Continue from a checkpoint Tune hands back (or this run's own, when newer)."""
        self.session.restore(checkpoint, reported_epochs=None, prefer_own=True)
        return int(self.session.epoch)

    def step(self) -> dict[str, Any]:
        """One epoch (collectives inside, on a group); the metrics are global, so any rank's do."""
        metrics = self.session.step().as_dict()
        metrics["done"] = bool(self.session.done)
        metrics["global_batch"] = self.session.trainer.global_batch
        return metrics

    def weights(self) -> list[Any]:
        """The model's variables (tests: a trial starts from a fresh build, nothing leaks)."""
        import numpy as np

        return [np.asarray(v.numpy()) for v in self.session.trainer.model.weights]


class TrainingWorker(TrialSession):
    """One worker process of a data-parallel trial: its strategy once, a run per trial."""

    def __init__(self, rank: int, world: int, threads: int) -> None:
        from distmis.training import configure_tensorflow

        super().__init__(rank, world)
        self.started_at = _process_start_time()
        configure_tensorflow(threads)  # before TensorFlow runs anything in this process

    def process_started_at(self) -> float:
        return self.started_at

    def endpoint(self) -> str:
        """``ip:port`` for this worker's collective (a port free now on the node's address)."""
        import ray

        ip = ray.util.get_node_ip_address()
        # TensorFlow's server binds the port on every address (0.0.0.0), so the port must be free on
        # all of them, not only on this node's: nodes that share a host (127.0.0.11, 127.0.0.12) would
        # otherwise be handed the same port, and the second worker's server fails to start
        with socket.socket() as s:
            s.bind(("", 0))
            return f"{ip}:{s.getsockname()[1]}"

    def build_strategy(self, workers: list[str]) -> float:
        """Join the collective over ``workers``; returns when every worker has (seconds taken)."""
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": self.rank}}
        )
        import tensorflow as tf

        start = time.perf_counter()
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return time.perf_counter() - start


def _process_start_time() -> float:
    """When this process started (Unix seconds): a worker's cold start-up includes its spawn."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return time.time()


class WorkerGroup:
    """The worker actors of one trainable, one per bundle of its placement group."""

    def __init__(self, workers: int, *, cpus: float, gpus: float, threads: int) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        start = time.time()
        group = ray.util.get_current_placement_group()
        actor = ray.remote(TrainingWorker)
        self.actors = [
            actor.options(
                num_cpus=cpus,
                num_gpus=gpus,
                max_restarts=0,
                max_concurrency=1,
                # the trainable's own bundle is empty: its bundles are the workers', index = rank
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
                if group is not None
                else None,
            ).remote(rank, workers, threads)
            for rank in range(workers)
        ]
        endpoints = self._all("endpoint", lambda a: a.endpoint.remote())
        self.collective_seconds = max(self._all("build_strategy", lambda a: a.build_strategy.remote(endpoints)))
        self.started_at = min([*self._all("process_started_at", lambda a: a.process_started_at.remote()), start])
        #: cold start-up of this group: from the first worker process's spawn to a joined collective
        self.startup_seconds = time.time() - self.started_at

    # the trial's calls: every worker runs the same, the chief's (rank 0's) answer is the trial's
    def start(self, spec: TrialStart) -> int:
        return int(self._all("start", lambda a: a.start.remote(spec))[0])

    def step(self) -> dict[str, Any]:
        return dict(self._all("step", lambda a: a.step.remote())[0])

    def restore(self, checkpoint: str) -> int:
        return int(self._all("restore", lambda a: a.restore.remote(checkpoint))[0])

    def weights(self) -> list[list[Any]]:
        """Every worker's model variables, in rank order."""
        return self._all("weights", lambda a: a.weights.remote())

    def _all(self, what: str, call: Callable[[Any], Any]) -> list[Any]:
        """``call`` on every worker at once; the results in rank order.

        Raises:
            WorkerLost: as soon as any worker dies (the others are killed: they would wait
                forever in their collective).
        """
        return self._gather([call(a) for a in self.actors], what)

    def _gather(self, refs: list[Any], what: str) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        order = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    results[order[ref]] = ray.get(ref)
                except RayActorError as exc:
                    self.shutdown()
                    raise WorkerLost(
                        f"worker {order[ref]} of {len(refs)} died during {what}: {str(exc).splitlines()[0][:200]}"
                    ) from None
                except RayTaskError as exc:
                    self.shutdown()
                    if _lost_a_peer(exc):
                        raise WorkerLost(
                            f"worker {order[ref]} of {len(refs)} lost a peer during {what}: "
                            f"{str(exc.cause).splitlines()[0][:200]}"
                        ) from None
                    raise exc.as_instanceof_cause() from None
        return results

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(actor, no_restart=True)
        self.actors = []


def _lost_a_peer(exc: Any) -> bool:
    """Whether a worker's call (a step, a restore) failed because another worker vanished mid-collective.

    When a worker is killed, the survivor's all-reduce may fail first, with TensorFlow's
    ``UnavailableError`` (connection reset by peer), before Ray reports the dead actor: it is
    the same lost worker, and is reported as one. Matched by name, so the driver never imports
    TensorFlow for it."""
    return type(getattr(exc, "cause", None)).__name__ == "UnavailableError"


__all__ = ["TrainingWorker", "TrialSession", "TrialStart", "WorkerGroup", "WorkerLost"]
