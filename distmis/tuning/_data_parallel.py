"""Data-parallel trials: each Tune trial is a light driver that fits a Ray Train ``TensorflowTrainer``.

Ray 2.60 Train V2 pattern: the Tune trial (a function holding no CPU, only one unit of the
custom ``trial_driver`` resource) builds a ``TensorflowTrainer`` over ``workers_per_trial``
workers and forwards their reports to Tune (``TuneReportCallback``). Each worker runs the
*same* :class:`~distmis.training.RunSession` and training loop as an experiment-parallel
trial, under ``MultiWorkerMirroredStrategy`` instead of the default strategy, so comparing
the modes compares parallelism, not two code paths. Workers are fresh processes per trial
(TensorFlow's collective state lives in the process). Only rank 0 writes files and reports a
checkpoint; every rank calls ``ray.train.report`` (a barrier) and reads the state arrays (a
collective for synchronised variables).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from distmis.tuning._keys import NODE, PID, REPORTED_AT, STARTED_AT, sampled_params

DRIVER_RESOURCE = "trial_driver"


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """What every Ray Train worker of a data-parallel trial runs."""
    import ray
    import ray.train

    from distmis.training import configure_tensorflow

    ctx_train = ray.train.get_context()
    rank, world = ctx_train.get_world_rank(), ctx_train.get_world_size()
    context = config["context"]
    configure_tensorflow(context["threads"])
    import keras
    import tensorflow as tf

    from distmis.config import ExperimentConfig, apply_params
    from distmis.training import RunSession

    keras.backend.clear_session()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    trial_config = apply_params(ExperimentConfig.model_validate(context["base_config"]), config["params"])
    run_dir = Path(config["run_dir"])
    node = ray.util.get_node_ip_address()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"worker-{rank}.json").write_text(json.dumps({"rank": rank, "world": world, "node_ip": node, "pid": os.getpid()}))

    checkpoint = ray.train.get_checkpoint()
    own = run_dir / "checkpoint" / "state.npz"
    session = RunSession(trial_config, context["prepared"], run_dir, strategy=strategy, is_chief=rank == 0,
                         metric=context["metric"], mode=context["mode"])
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            session.restore(d)
    elif own.is_file():  # the trial's own last checkpoint (shared filesystem), e.g. after a driver restart
        session.restore(own.parent)
    # the trial's start is its driver's (worker-group start-up is part of what data parallelism costs)
    started = float(config.get("trial_started") or time.time())
    from ray.train import Checkpoint

    while not session.done:
        metrics = session.step().as_dict()
        metrics.update({STARTED_AT: started, REPORTED_AT: time.time(), PID: os.getpid(), NODE: node,
                        "workers": world, "global_batch": session.trainer.global_batch})
        ckpt = Checkpoint.from_directory(str(session.checkpoint_dir)) if rank == 0 else None
        ray.train.report(metrics, checkpoint=ckpt)


def data_parallel_trial(config: dict[str, Any], context: Any) -> None:
    """The Tune function trainable of a data-parallel trial: build and fit the trainer."""
    from ray import tune
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_started = time.time()
    trial_id = tune.get_context().get_trial_id()
    par = context.base_config["parallelism"]
    run_dir = Path(context.trials_dir) / trial_id
    trainer = TensorflowTrainer(
        train_loop_per_worker,
        train_loop_config={"params": sampled_params(config), "context": asdict(context), "run_dir": str(run_dir),
                           "trial_started": trial_started},
        scaling_config=ScalingConfig(
            num_workers=int(par["workers_per_trial"]),
            use_gpu=float(par["gpus_per_worker"]) > 0,
            resources_per_worker={"CPU": float(par["cpus_per_worker"]), "GPU": float(par["gpus_per_worker"])},
        ),
        run_config=RunConfig(
            name=f"train-{trial_id}",
            storage_path=str(Path(context.trials_dir).parent / "train"),
            callbacks=[TuneReportCallback()],
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    trainer.fit()
