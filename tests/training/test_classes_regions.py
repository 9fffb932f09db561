"""Per-class and per-region metrics, region-based training, mixed precision, rematerialisation, inspect."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from distmis.config import ExperimentConfig
from distmis.labels import MSD_TASK01_REGIONS

pytestmark = pytest.mark.slow

EVAL = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from distmis.training import configure_tensorflow
configure_tensorflow(1)
import tensorflow as tf
from distmis.config import ExperimentConfig
from distmis.data import load_manifest
from distmis.training import Trainer
prepared, out = sys.argv[1], sys.argv[2]
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "TF_CONFIG" in os.environ else None
cfg = ExperimentConfig.model_validate({"train": {"batch_size_per_replica": 1, "seed": 5},
                                       "model": {"depth": 2, "filters": 4, "norm": "none"}})
trainer = Trainer(cfg, load_manifest(prepared), strategy=strategy)
plain, classes = trainer.evaluate()  # the same seeded weights on both worker counts
if trainer.worker_index == 0:
    with open(out, "w") as f:
        json.dump({**plain, **classes}, f)
"""


@pytest.fixture(scope="module")
def multiclass16(msd16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """msd16 prepared multi-class with the BraTS regions: 4 validation cases."""
    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset

    out = tmp_path_factory.mktemp("mc") / "prepared"
    prepare_dataset(
        msd16,
        out,
        PrepareConfig(shape=(16, 16, 16), label_mode="multiclass", split=(0.5, 0.34, 0.16)),
        regions=MSD_TASK01_REGIONS,
    )
    return out


def test_per_class_validation_is_global_across_workers(multiclass16: Path, tmp_path: Path) -> None:
    """Two workers each validate half the cases: the per-class and per-region values are the
    sums over both, equal to one worker's over all cases (not rank 0's shard)."""
    from _support.raycluster import free_port

    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    one = tmp_path / "one.json"
    subprocess.run([sys.executable, "-c", EVAL, str(multiclass16), str(one)], env=env, check=True, timeout=300)
    ports = [free_port() for _ in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", EVAL, str(multiclass16), str(tmp_path / "two.json")],
            env={
                **env,
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": i}}
                ),
            },
        )
        for i in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    a, b = json.loads(one.read_text()), json.loads((tmp_path / "two.json").read_text())
    names = [k for k in a if k.startswith(("val_dice_", "val_iou_"))]
    assert {"val_dice_edema", "val_dice_enhancing_tumour", "val_dice_WT", "val_dice_TC", "val_dice_ET"} <= set(names)
    for key in ["val_dice", "val_iou", *names]:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert len({round(a[k], 4) for k in names}) > 3  # the values differ per class: no constant was compared
    # val_dice is the mean over the classes (not the regions)
    assert a["val_dice"] == pytest.approx(
        np.mean([a["val_dice_edema"], a["val_dice_non_enhancing_tumor"], a["val_dice_enhancing_tumour"]]), rel=1e-5
    )


def test_region_training_reaches_whole_tumour_and_enhancing_tumour(msd16: Path, tmp_path: Path) -> None:
    """One sigmoid channel per region with a Dice + BCE loss: WT >= 0.8 and ET >= 0.6 within a
    bounded number of epochs; the model is then evaluated per region and predicts MSD labels."""
    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset
    from distmis.inference import evaluate
    from distmis.training import fit

    prepared = tmp_path / "prepared"
    prepare_dataset(
        msd16,
        prepared,
        PrepareConfig(shape=(16, 16, 16), label_mode="regions", split=(0.7, 0.15, 0.15)),
        regions=MSD_TASK01_REGIONS,
    )
    config = ExperimentConfig.model_validate(
        {
            "name": "regions",
            "data": {
                "source": str(prepared),
                "regions": "msd_task01",
                "prepare": {"shape": [16, 16, 16], "label_mode": "regions"},
            },
            "train": {
                "epochs": 60,
                "batch_size_per_replica": 2,
                "threads": 2,
                "loss": "dice_bce",
                "augment": {"flip": False, "intensity": 0.0},
            },
            "model": {"depth": 3, "filters": 8, "norm": "group", "groups": 4},
            "optimizer": {"lr": 0.01},
            "search": {"metric": "val_dice_ET"},
        }
    )
    result = fit(
        config,
        prepared,
        tmp_path / "run",
        metric="val_dice_ET",
        on_epoch=lambda m, _: m.classes["val_dice_WT"] >= 0.8 and m.classes["val_dice_ET"] >= 0.6,
    )
    last = result.history[-1]
    assert last["val_dice_WT"] >= 0.8 and last["val_dice_ET"] >= 0.6, (len(result.history), last)
    header = next(csv.reader(open(tmp_path / "run" / "metrics.csv")))
    assert {"val_dice_WT", "val_dice_TC", "val_dice_ET", "val_iou_ET"} <= set(header)
    record = json.loads((tmp_path / "run" / "best" / "preprocessing.json").read_text())
    assert record["label_mode"] == "regions" and record["regions"] == MSD_TASK01_REGIONS
    ev = evaluate(tmp_path / "run" / "best", prepared, split="test", out=tmp_path / "ev", track=False)
    for metric in ("dice_WT", "dice_TC", "dice_ET", "hd95_mm_ET", "dice_edema"):
        assert metric in ev.rows[0] and metric in ev.summary["metrics"], metric
    pred = np.asarray(nib.load(next((tmp_path / "ev" / "predictions").glob("*.nii.gz"))).dataobj)
    assert set(np.unique(pred)) <= {0, 1, 2, 3}  # written back as MSD label values


def test_mixed_float16_really_trains(prepared16: Path, tmp_path: Path) -> None:
    import keras

    from distmis.data import load_manifest
    from distmis.training import Trainer

    config = ExperimentConfig.model_validate(
        {
            "train": {"batch_size_per_replica": 2, "precision": "mixed_float16", "steps_per_epoch": 2},
            "model": {"depth": 2, "filters": 4},
        }
    )
    trainer = Trainer(config, load_manifest(prepared16))
    assert trainer.model.get_layer("down0_conv1").compute_dtype == "float16"
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    first = trainer.run_epoch()
    second = trainer.run_epoch()
    assert np.isfinite([first.loss, second.loss, second.val_dice]).all()
    assert all(np.isfinite(w).all() for w in trainer.model_weights())


def test_remat_computes_the_same_step(prepared16: Path) -> None:
    """Recomputing the blocks' activations changes memory and time, not the result: the same
    losses with dropout (a recomputation must not draw a new mask) and the same batch-norm
    moving statistics (the recomputation updates them a second time)."""
    from distmis.data import load_manifest
    from distmis.training import Trainer

    losses, moving = [], []
    for remat in (False, True):
        config = ExperimentConfig.model_validate(
            {
                "train": {
                    "batch_size_per_replica": 2,
                    "steps_per_epoch": 2,
                    "seed": 3,
                    "augment": {"flip": False, "intensity": 0.0},
                },
                "model": {"depth": 3, "filters": 4, "norm": "batch", "dropout": 0.3, "remat": remat},
            }
        )
        trainer = Trainer(config, load_manifest(prepared16))
        losses.append([trainer.train_epoch()[0] for _ in range(2)])
        moving.append(
            {"/".join(v.path.split("/")[-2:]): v.numpy() for v in trainer.model.weights if "moving" in v.path}
        )
        kinds = {type(layer).__name__ for layer in trainer.model.layers}
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    assert len(moving[0]) == 20 and moving[0].keys() == moving[1].keys()
    for name, value in moving[0].items():
        np.testing.assert_allclose(moving[1][name], value, rtol=1e-4, atol=1e-7, err_msg=name)
    assert "RematBlock" in kinds  # the last model built was the rematerialised one


def test_inspect_fingerprints_and_warns(msd16: Path, tmp_path: Path) -> None:
    from distmis.cli import main
    from distmis.data import write_synthetic_msd

    out = tmp_path / "fp"
    assert main(["inspect", str(msd16), "--out", str(out), "--gpu-memory", "16"]) == 0
    fp = json.loads((out / "fingerprint.json").read_text())
    assert fp["cases"] == 12 and fp["median_shape"] == [16, 16, 16] and fp["median_spacing_mm"] == [1.0, 1.0, 1.0]
    assert set(fp["intensity_foreground"]) == {"FLAIR", "T1w", "t1gd", "T2w"}
    assert set(fp["labels"]) == {"1", "2", "3"} and fp["labels"]["1"]["share_of_cases"] > 0.5
    assert fp["suggestion"]["prepare_shape"] == [16, 16, 16] and fp["suggestion"]["train_patch"] == [16, 16, 16]
    assert "rule" in fp["suggestion"] and fp["warnings"] == []
    assert (out / "overview.png").stat().st_size > 10_000
    # a 3D single-modality set, one case at another spacing
    mono = write_synthetic_msd(tmp_path / "mono", cases=4, shape=(16, 16, 16), modalities=1, test_cases=0, seed=1)
    meta = json.loads((mono / "dataset.json").read_text())
    for i, entry in enumerate(meta["training"]):
        image, label = mono / entry["image"], mono / entry["label"]
        affine = np.diag([1.0, 1.0, 3.0 if i == 2 else 1.0, 1.0])
        nib.save(nib.Nifti1Image(np.asarray(nib.load(image).dataobj)[..., 0], affine), image)
        nib.save(nib.Nifti1Image(np.asarray(nib.load(label).dataobj), affine), label)
    assert main(["inspect", str(mono), "--out", str(tmp_path / "fp2")]) == 0
    fp2 = json.loads((tmp_path / "fp2" / "fingerprint.json").read_text())
    assert list(fp2["intensity_foreground"]) == ["FLAIR"]
    assert any("inconsistent spacing" in w and "SYNTH_002" in w for w in fp2["warnings"]), fp2["warnings"]


def test_prepare_records_the_fingerprint(prepared16: Path) -> None:
    info = json.loads((prepared16 / "info.json").read_text())
    assert info["fingerprint"]["cases"] == 12 and "intensity_foreground" in info["fingerprint"]
