"""A CT-like dataset in Hounsfield units, for the normalisation tests and benchmark.

Air at -1000 around a body of soft tissue (about 40 HU, with some voxels of water at exactly
0 HU) holding a brighter lesion (about 120 HU), which is the label. A per-case z-score over
non-zero voxels (MRI's normalisation) treats the air as foreground and the water as background.

    python tests/_support/ctdata.py OUT [--cases 8] [--shape 16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import nibabel as nib
import numpy as np


def write_ct(root: Path, cases: int = 8, shape: tuple[int, int, int] = (16, 16, 16), seed: int = 0) -> Path:
    """CT-like cases in Hounsfield units: air -1000 around a body of soft tissue (~40 HU, some voxels
    exactly 0 HU, i.e. water) with a brighter lesion (~120 HU) that is the label."""
    rng = np.random.default_rng(seed)
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"))
    training = []
    for i in range(cases):
        centre = np.array(shape) / 2 + rng.uniform(-1.5, 1.5, 3)
        r = np.sqrt((((grid.T - centre) / np.array(shape)) ** 2).sum(-1)).T
        body, lesion = r < 0.42, r < 0.16
        image = np.full(shape, -1000.0, np.float32)
        image[body] = rng.normal(40, 15, int(body.sum()))
        image[body & (rng.random(shape) < 0.05)] = 0.0  # water: exactly 0 HU, inside the body
        image[lesion] = rng.normal(120, 15, int(lesion.sum()))
        label = lesion.astype(np.uint8)
        nib.save(nib.Nifti1Image(image, np.eye(4)), root / "imagesTr" / f"CT_{i}.nii.gz")
        nib.save(nib.Nifti1Image(label, np.eye(4)), root / "labelsTr" / f"CT_{i}.nii.gz")
        training.append({"image": f"./imagesTr/CT_{i}.nii.gz", "label": f"./labelsTr/CT_{i}.nii.gz"})
    (root / "dataset.json").write_text(
        json.dumps({"modality": {"0": "CT"}, "labels": {"0": "background", "1": "lesion"}, "training": training})
    )
    return root


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--cases", type=int, default=8)
    p.add_argument("--shape", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(write_ct(Path(a.out), cases=a.cases, shape=(a.shape,) * 3, seed=a.seed))
