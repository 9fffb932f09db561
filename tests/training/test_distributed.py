"""Gradient averaging across workers is right: one step on 2 workers == one step on 1 worker.

Two real processes joined by ``MultiWorkerMirroredStrategy`` (TF_CONFIG on 127.0.0.1 ports),
the same training loop as every trial. 4 training cases and a global batch of 4: one worker
takes all 4 in one step; two workers take 2 each — if they read the same cases instead of
disjoint halves, or if the per-example losses were not averaged over the global batch, the
updated weights would differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _support.raycluster import free_port

pytestmark = pytest.mark.slow

STEP = r"""
import faulthandler, json, os, sys
faulthandler.dump_traceback_later(280, exit=True)  # a step that hangs prints every thread's stack before the 300 s kill
import numpy as np
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from distmis.training import configure_tensorflow
configure_tensorflow(1)
import tensorflow as tf
from distmis.config import ExperimentConfig
from distmis.data import load_manifest
from distmis.training import Trainer
prepared, out, per_replica = sys.argv[1], sys.argv[2], int(sys.argv[3])
multi = "TF_CONFIG" in os.environ
strategy = tf.distribute.MultiWorkerMirroredStrategy() if multi else None
cfg = ExperimentConfig.model_validate({
    "train": {"epochs": 1, "batch_size_per_replica": per_replica, "steps_per_epoch": 1, "seed": 7,
              "augment": {"flip": False, "intensity": 0.0, "noise": 0.0}},
    "model": {"depth": 2, "filters": 4, "norm": "none"},   # batch statistics would differ per replica
    "optimizer": {"name": "sgd", "lr": 0.5, "momentum": 0.0},
    "data": {"prepare": {"shape": [16, 16, 16]}},
})
trainer = Trainer(cfg, load_manifest(prepared), strategy=strategy)
before = trainer.model_weights()
loss, dice, _ = trainer.train_epoch()
after = trainer.model_weights()
if trainer.worker_index == 0:
    np.savez(out, *before, *after)
    with open(out + ".json", "w") as f:
        json.dump({"loss": loss, "replicas": trainer.replicas, "global_batch": trainer.global_batch}, f)
"""


@pytest.fixture(scope="module")
def prepared4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset, write_synthetic_msd

    root = tmp_path_factory.mktemp("dist")
    write_synthetic_msd(root / "msd", cases=6, shape=(16, 16, 16), test_cases=0, seed=11)
    prepare_dataset(root / "msd", root / "prep", PrepareConfig(shape=(16, 16, 16), split=(0.67, 0.33, 0.0)))
    return root / "prep"


def _run(prepared: Path, out: Path, per_replica: int, workers: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if workers == 1:
        subprocess.run(
            [sys.executable, "-c", STEP, str(prepared), str(out), str(per_replica)], env=env, check=True, timeout=300
        )
        return
    ports = [free_port() for _ in range(workers)]
    procs = []
    for i in range(workers):
        tf_config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": i}}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", STEP, str(prepared), str(out), str(per_replica)],
                env={**env, "TF_CONFIG": json.dumps(tf_config)},
            )
        )
    try:
        assert [p.wait(timeout=300) for p in procs] == [0] * workers
    finally:
        for p in procs:
            p.kill()


def test_two_workers_step_equals_one_worker_step(prepared4: Path, tmp_path: Path) -> None:
    from distmis.data import load_manifest

    assert load_manifest(prepared4).num_cases("train") == 4
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    _run(prepared4, one, per_replica=4, workers=1)
    _run(prepared4, two, per_replica=2, workers=2)
    meta1, meta2 = json.loads(Path(f"{one}.json").read_text()), json.loads(Path(f"{two}.json").read_text())
    assert (meta1["replicas"], meta1["global_batch"]) == (1, 4)
    assert (meta2["replicas"], meta2["global_batch"]) == (2, 4)
    a, b = np.load(one), np.load(two)
    n = len(a.files) // 2
    for i in range(n):  # same initial weights
        np.testing.assert_allclose(a[f"arr_{i}"], b[f"arr_{i}"], rtol=0, atol=0)
    moved = 0.0
    for i in range(n, 2 * n):  # same update
        np.testing.assert_allclose(a[f"arr_{i}"], b[f"arr_{i}"], rtol=1e-4, atol=1e-5)
        moved = max(moved, float(np.abs(a[f"arr_{i}"] - a[f"arr_{i - n}"]).max()))
    assert moved > 1e-4  # the step really changed the weights
    assert meta1["loss"] == pytest.approx(meta2["loss"], rel=1e-4)


def test_a_warm_group_starts_each_trial_fresh_and_steps_like_one_worker(prepared4: Path, tmp_path: Path) -> None:
    """A worker group that already ran a trial: the next trial's weights equal a fresh build with the
    same seed (no variable, optimiser slot or batch-norm statistic leaks), and its 2-worker step
    equals a 1-worker step with the same global batch."""
    import ray

    from distmis.config import ExperimentConfig
    from distmis.raysession import init_ray
    from distmis.tuning import TrialStart, WorkerGroup

    one = tmp_path / "one.npz"
    _run(prepared4, one, per_replica=4, workers=1)  # the reference: fresh process, one worker
    reference = np.load(one)
    n = len(reference.files) // 2
    init_ray(None, num_cpus=2)
    try:
        group = WorkerGroup(2, cpus=1, gpus=0, threads=1)
        previous = ExperimentConfig.model_validate(
            {
                "data": {"source": str(prepared4)},
                "train": {"epochs": 2, "batch_size_per_replica": 1, "seed": 3},
                "model": {"depth": 2, "filters": 4, "norm": "batch"},
                "optimizer": {"name": "adam", "lr": 0.01},
            }
        ).to_yaml_dict()
        group.start(TrialStart(previous, {}, str(prepared4), str(tmp_path / "a"), "val_dice", "max"))
        group.step()
        group.step()  # trained weights, Adam slots and batch-norm statistics now exist in the group
        trial = ExperimentConfig.model_validate(
            {
                "data": {"source": str(prepared4), "prepare": {"shape": [16, 16, 16]}},
                "train": {
                    "epochs": 1,
                    "batch_size_per_replica": 2,
                    "steps_per_epoch": 1,
                    "seed": 7,
                    "augment": {"flip": False, "intensity": 0.0, "noise": 0.0},
                },
                "model": {"depth": 2, "filters": 4, "norm": "none"},
                "optimizer": {"name": "sgd", "lr": 0.5, "momentum": 0.0},
            }
        ).to_yaml_dict()
        group.start(TrialStart(trial, {}, str(prepared4), str(tmp_path / "b"), "val_dice", "max"))
        before = group.weights()
        for rank in range(2):  # a fresh build with the same seed: nothing left of the previous trial
            assert len(before[rank]) == n
            for i in range(n):
                np.testing.assert_array_equal(before[rank][i], reference[f"arr_{i}"])
        metrics = group.step()
        assert metrics["global_batch"] == 4
        after = group.weights()[0]
        for i in range(n):  # the same update as one worker taking the whole global batch
            np.testing.assert_allclose(after[i], reference[f"arr_{n + i}"], rtol=1e-4, atol=1e-5)
        group.shutdown()
    finally:
        ray.shutdown()
