"""Real size: BraTS-shaped cases (240 x 240 x 155 x 4) through prepare, the loader, one epoch of
training with sliding-window validation, and predict, as a user runs them.

Synthesising a case of this size takes ~7 s, so one training case is made and linked under four
names (each is still read and prepared on its own); the test case is its own volume.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

pytestmark = pytest.mark.slow

SHAPE = (240, 240, 155)
PREPARED = "240,240,160"

# Peak RSS of a loader process over 12 batches of two 64³ patches, after its first batch: what
# the patches in flight may add. The loader this replaced parsed a whole case per patch (a case
# here is 147 MB of image), so one volume is the bound it could never meet.
PROBE = """
import json, resource, sys
from distmis.data import make_dataset
from distmis.config import AugmentConfig
from distmis.training import configure_tensorflow
configure_tensorflow(2)
ds = make_dataset(sys.argv[1], "train", batch_size=2, training=True, patch=(64, 64, 64),
                  augment_config=AugmentConfig(), threads=2, foreground_oversampling=0.33)
it = iter(ds)
x, y, w = next(it)
after_first = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
for _ in range(12):
    x, y, w = next(it)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"after_first_mb": after_first, "peak_mb": peak, "shape": list(x.shape), "label": list(y.shape)}))
# drop the iterator before the interpreter finalises: a patch read still in flight then could never
# take the GIL again, and the iterator's destructor would wait for it forever
del it
"""


def _distmis(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "distmis", *argv], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"distmis {' '.join(argv)}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def real_size(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from distmis.data import write_synthetic_msd

    root = tmp_path_factory.mktemp("real-size")
    src = write_synthetic_msd(root / "synth", cases=1, shape=SHAPE, test_cases=1, seed=3)
    meta = json.loads((src / "dataset.json").read_text())
    base = meta["training"][0]
    training = []
    for i in range(4):
        for key, sub in (("image", "imagesTr"), ("label", "labelsTr")):
            os.link(src / base[key], src / sub / f"CASE_{i}.nii.gz")
        training.append({"image": f"./imagesTr/CASE_{i}.nii.gz", "label": f"./labelsTr/CASE_{i}.nii.gz"})
    for key in ("image", "label"):
        (src / base[key]).unlink()
    meta.update(training=training, numTraining=4)
    (src / "dataset.json").write_text(json.dumps(meta))
    return root


def test_prepare_train_validate_and_predict_at_real_size(real_size: Path) -> None:
    env = {**os.environ, "DISTMIS_DATA_HOME": str(real_size / "cache")}
    _distmis(["prepare", "synth", "prepared", "--shape", PREPARED, "--split", "0.5,0.25,0.25"], real_size, env)
    info = json.loads((real_size / "prepared" / "info.json").read_text())
    assert info["shape"] == [240, 240, 160] and len(info["cases"]) == 4
    nii = sum(f.stat().st_size for f in (real_size / "synth" / "imagesTr").glob("CASE_0.nii.gz"))
    case = next(iter(info["cases"].values()))["files"]
    assert case["image"]["bytes"] <= 1.5 * nii  # the prepared case is no larger than 1.5x its .nii.gz

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(real_size / "prepared")], env=env, capture_output=True, text=True
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    rss = json.loads(probe.stdout.strip().splitlines()[-1])
    assert rss["shape"] == [2, 64, 64, 64, 4] and rss["label"] == [2, 64, 64, 64, 1]
    volume_mb = 240 * 240 * 160 * 4 * 4 / 2**20
    assert rss["peak_mb"] - rss["after_first_mb"] < volume_mb, rss

    (real_size / "train.yaml").write_text(
        "name: real\ndata: {source: prepared}\n"
        "train: {epochs: 1, batch_size_per_replica: 1, patch: [128, 128, 128], steps_per_epoch: 2}\n"
        "model: {depth: 2, filters: 4}\n"
    )
    _distmis(["train", "train.yaml", "--out", "run"], real_size, env)
    rows = (real_size / "run" / "metrics.csv").read_text().splitlines()
    header, last = rows[0].split(","), rows[-1].split(",")
    values = dict(zip(header, last, strict=True))
    assert np.isfinite(float(values["val_dice"])) and float(values["val_seconds"]) > 0, values

    _distmis(["predict", "run/best", "synth/imagesTs", "--out", "segs"], real_size, env)
    scan = next((real_size / "synth" / "imagesTs").glob("*.nii.gz"))
    segmentation = nib.load(real_size / "segs" / scan.name)
    source = nib.load(scan)
    assert segmentation.shape == SHAPE
    np.testing.assert_allclose(segmentation.affine, source.affine)
