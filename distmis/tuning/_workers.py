"""A data-parallel trial's worker group, kept warm across trials.

The first version built a Ray Train ``TensorflowTrainer`` per trial: new worker processes,
TensorFlow imported again, the collective set up again, for every trial. On 2 cores that
was 20-23 s per trial against epochs of about 1 s, so ``distmis compare`` measured process
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

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from distmis.tuning._keys import NODE, PID


class WorkerLost(RuntimeError):
    """A worker process of the trial's group died; the trial is restarted on a new group."""


class TrainingWorker:
    """One worker process of a data-parallel trial: its strategy once, a run per trial."""

    def __init__(self, rank: int, world: int, threads: int) -> None:
        from distmis.training import configure_tensorflow

        self.rank, self.world = rank, world
        self.started_at = _process_start_time()
        configure_tensorflow(threads)  # before TensorFlow runs anything in this process
        self.strategy: Any = None
        self.session: Any = None

    def process_started_at(self) -> float:
        return self.started_at

    def endpoint(self) -> str:
        """``ip:port`` for this worker's collective (a port free now on the node's address)."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
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

    def start_trial(
        self,
        base_config: dict[str, Any],
        params: dict[str, Any],
        prepared: str,
        run_dir: str,
        metric: str,
        mode: str,
        resume_from: str | None,
        reported_epochs: int,
    ) -> int:
        """A new run for this trial, in the group's strategy; returns the epoch it starts from."""
        import ray

        from distmis.config import ExperimentConfig, apply_params
        from distmis.training import RunSession, release_in_background

        t0 = time.perf_counter()
        release_in_background(self, "session")  # the previous trial's run goes, off this path
        # no keras.backend.clear_session(): the layer names are explicit, and clearing the kernel cache
        # waits for the previous trial's input pipeline to shut down (seconds, measured)
        config = apply_params(ExperimentConfig.model_validate(base_config), params)
        run = Path(run_dir)
        run.mkdir(parents=True, exist_ok=True)
        t1 = time.perf_counter()
        self.session = RunSession(
            config, prepared, run, strategy=self.strategy, is_chief=self.rank == 0, metric=metric, mode=mode
        )
        t2 = time.perf_counter()
        if resume_from is not None:
            self.session.restore(resume_from, reported_epochs=reported_epochs, prefer_own=True)
        context = ray.get_runtime_context()
        (run / f"worker-{self.rank}.json").write_text(
            json.dumps(
                {
                    "rank": self.rank,
                    "world": self.world,
                    NODE: ray.util.get_node_ip_address(),
                    PID: os.getpid(),
                    "placement_group": context.get_placement_group_id(),
                    "setup_seconds": {
                        "release": round(t1 - t0, 3),
                        "build": round(t2 - t1, 3),
                        "total": round(time.perf_counter() - t0, 3),
                    },
                }
            )
        )
        return self.session.epoch

    def restore(self, checkpoint: str, reported_epochs: int | None) -> int:
        self.session.restore(checkpoint, reported_epochs=reported_epochs, prefer_own=True)
        return self.session.epoch

    def step(self) -> dict[str, Any]:
        """One epoch on every worker (collectives inside); the metrics are global, so any rank's do."""
        metrics = self.session.step().as_dict()
        metrics["done"] = bool(self.session.done)
        metrics["global_batch"] = self.session.trainer.global_batch
        return metrics

    def weights(self) -> list[Any]:
        """The model's variables (tests: a trial starts from a fresh build, nothing leaks)."""
        import numpy as np

        return [np.asarray(v.numpy()) for v in self.session.trainer.model.weights]


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
        endpoints = self.call("endpoint")
        self.collective_seconds = max(self.call("build_strategy", endpoints))
        self.started_at = min(self.call("process_started_at") + [start])
        #: cold start-up of this group: from the first worker process's spawn to a joined collective
        self.startup_seconds = time.time() - self.started_at

    def call(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every worker at once; the results in rank order.

        Raises:
            WorkerLost: as soon as any worker dies (the others are killed: they would wait
                forever in their collective).
        """
        return self._gather([getattr(a, method).remote(*args) for a in self.actors], method)

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
                    raise exc.as_instanceof_cause() from None
        return results

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []


__all__ = ["TrainingWorker", "WorkerGroup", "WorkerLost"]
