"""CT normalised as CT, or as MRI: the prepared intensities and a short training run, side by side.

Writes a CT-like dataset in Hounsfield units (``tests/_support/ctdata.py``: air -1000, soft tissue about
40 HU with water at exactly 0 HU, a lesion about 120 HU), prepares it twice, with the per-case
z-score over non-zero voxels that every channel got before (``--normalization zscore``) and with
CT's dataset-wide clip and z-score (``auto``, what distmis does for a ``CT`` modality now), prints
what each makes of air, water, tissue and lesion, and trains the same model on each for a few
epochs (``distmis train``, same seed), printing the validation Dice per epoch.

    python benchmarks/normalization.py [--cases 16] [--shape 32] [--epochs 6]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
from benchlib import add_out_option, write_report

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=16)
    p.add_argument("--shape", type=int, default=32)
    p.add_argument("--epochs", type=int, default=6)
    add_out_option(p, "normalization")
    a = p.parse_args()
    from _support.ctdata import write_ct

    from distmis.data import load_manifest, normalize

    work = Path(tempfile.mkdtemp(prefix="ct-normalization-"))
    raw = write_ct(work / "ct", cases=a.cases, shape=(a.shape,) * 3)
    image = np.asarray(nib.load(raw / "imagesTr" / "CT_0.nii.gz").dataobj, np.float32)
    label = np.asarray(nib.load(raw / "labelsTr" / "CT_0.nii.gz").dataobj)
    body = image > -1000
    regions = {
        "air": image == -1000,
        "water (0 HU)": body & (image == 0),
        "tissue": body & (image != 0) & (label == 0),
        "lesion": label > 0,
    }
    print(f"{a.cases} CT-like cases at {a.shape}^3 in {work}\n")
    print(f"{'':14s}" + "".join(f"{name:>16s}" for name in regions) + "   (case CT_0, mean after normalisation)")
    curves, rows = {}, []
    for scheme in ("zscore", "auto"):
        prepared = work / f"prepared-{scheme}"
        subprocess.run(
            [sys.executable, "-m", "distmis", "prepare", str(raw), str(prepared), "--shape", str(a.shape),
             "--split", "0.75,0.25,0", "--normalization", scheme],
            check=True, capture_output=True,
        )  # fmt: skip
        spec = load_manifest(prepared).info.preprocessing.normalisation_spec
        out = normalize(image[..., None], spec)[..., 0]
        print(f"{scheme:14s}" + "".join(f"{float(out[m].mean()):>16.3f}" for m in regions.values()) + f"   {spec[0]}")
        rows.append({"scheme": scheme, **{f"mean, {name}": float(out[m].mean()) for name, m in regions.items()}})
        config = work / f"train-{scheme}.yaml"
        config.write_text(
            f"name: ct_{scheme}\ndata: {{source: {prepared}}}\n"
            f"train: {{epochs: {a.epochs}, batch_size_per_replica: 2, threads: 2, loss: dice, seed: 0}}\n"
            "model: {depth: 3, filters: 8, norm: group, groups: 4}\noptimizer: {lr: 3.0e-3}\n"
        )
        run = work / f"run-{scheme}"
        subprocess.run([sys.executable, "-m", "distmis", "train", str(config), "--out", str(run)], check=True,
                       capture_output=True)  # fmt: skip
        curves[scheme] = [float(r["val_dice"]) for r in csv.DictReader(open(run / "metrics.csv"))]
    print(f"\nval Dice per epoch ({a.epochs} epochs, same model and seed):")
    for scheme, values in curves.items():
        print(f"{scheme:14s}" + " ".join(f"{v:.3f}" for v in values) + f"   best {max(values):.3f}")
    print(json.dumps({"curves": curves}))
    for row in rows:
        row["best val Dice"] = max(curves[row["scheme"]])

    def draw(fig: Any) -> None:
        axes = fig.add_subplot()
        for scheme, values in curves.items():
            axes.plot(range(1, len(values) + 1), values, marker="o", label=scheme)
        axes.set_xlabel("epoch")
        axes.set_ylabel("val Dice")
        axes.legend()

    title = f"{a.cases} CT-like cases at {a.shape}^3: intensities after normalisation (case CT_0), val Dice"
    write_report(a.out, "normalization", title=title, rows=rows, data={"curves": curves}, figure=draw, echo=False)


if __name__ == "__main__":
    main()
