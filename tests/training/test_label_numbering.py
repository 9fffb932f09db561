"""Labels as the dataset numbers them: BraTS's original 0, 1, 2, 4 gives 3 foreground classes (not 4 with
a phantom class 3 that scores 0 every epoch), metrics named as the dataset names them, and
segmentations written back in the dataset's own values."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml

from distmis.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def brats_numbering(msd16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """msd16 with its label 3 renumbered 4, as BraTS numbers enhancing tumour."""
    raw = tmp_path_factory.mktemp("numbering") / "raw"
    shutil.copytree(msd16, raw)
    meta = json.loads((raw / "dataset.json").read_text())
    names = meta["labels"]
    meta["labels"] = {"0": names["0"], "1": names["1"], "2": names["2"], "4": names["3"]}
    (raw / "dataset.json").write_text(json.dumps(meta))
    for path in (raw / "labelsTr").glob("*.nii.gz"):
        image = nib.load(path)
        label = np.asarray(image.dataobj).astype(np.uint8)
        label[label == 3] = 4
        nib.save(nib.Nifti1Image(label, image.affine), path)
    return raw


def test_labels_0_1_2_4_train_three_classes_and_predict_in_the_datasets_values(
    brats_numbering: Path, tmp_path: Path, data_home: Path
) -> None:
    names = json.loads((brats_numbering / "dataset.json").read_text())["labels"]
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "numbering",
                "data": {
                    "source": str(brats_numbering),
                    "prepare": {"shape": [16, 16, 16], "label_mode": "multiclass", "split": [0.5, 0.25, 0.25]},
                },
                "train": {"epochs": 1, "batch_size_per_replica": 2, "loss": "dice_ce", "foreground_oversampling": 0.5},
                "model": {"depth": 2, "filters": 4},
            }
        )
    )
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 0
    preprocessing = json.loads((tmp_path / "run" / "best" / "preprocessing.json").read_text())
    assert preprocessing["num_classes"] == 4, preprocessing
    with open(tmp_path / "run" / "metrics.csv") as fh:
        columns = next(csv.reader(fh))
    per_class = sorted(c for c in columns if c.startswith("val_dice_"))
    from distmis.labels import metric_suffix

    assert per_class == sorted(f"val_dice_{metric_suffix(names[v])}" for v in ("1", "2", "4")), per_class

    segs = tmp_path / "segs"
    assert main(["predict", str(tmp_path / "run" / "best"), str(brats_numbering / "imagesTs"), "--out", str(segs)]) == 0
    values = set()
    for path in segs.glob("*.nii.gz"):
        values |= set(np.unique(np.asarray(nib.load(path).dataobj)).astype(int).tolist())
    assert values <= {0, 1, 2, 4} and 3 not in values, values


def test_a_class_is_written_as_the_value_it_stands_for() -> None:
    from distmis.inference import probabilities_to_labels
    from distmis.labels import class_values

    values = class_values({0: "background", 1: "edema", 2: "core", 4: "enhancing"}, 4)
    assert values == [0, 1, 2, 4]
    probs = np.zeros((2, 2, 2, 4), np.float32)
    probs[..., 0] = 0.5
    probs[0, 0, 0, 3] = 0.9  # class 3: the enhancing tumour, value 4
    probs[1, 1, 1, 2] = 0.9
    labels = probabilities_to_labels(probs, values=values)
    assert labels[0, 0, 0] == 4 and labels[1, 1, 1] == 2 and labels[0, 1, 0] == 0
    # data prepared when every value up to the largest was a class keeps that numbering
    assert class_values({0: "b", 1: "x", 3: "y"}, 4) == [0, 1, 2, 3]
