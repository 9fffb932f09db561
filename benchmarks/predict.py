"""Whole-volume inference: voxels/s and peak memory for 64^3, 128^3 and 192^3 volumes, for
1, 2 and 4 cubes per forward pass at a fixed volume, and for ensembles (``final/`` of a finalize)
of 1, 3 and 5 members with and without test-time mirroring.

Every configuration runs in a fresh process (so peak memory is its own), predicting a
4-modality volume with the quickstart U-Net (depth 3, 8 filters, group norm; random weights,
which cost the same as trained ones) by sliding windows of --patch cubes with --overlap.
Printed per configuration:

  * cubes, seconds, voxels/s (output voxels per second, after one warm-up cube);
  * peak RSS added by prediction (VmHWM minus the RSS after the model is built), the part
    taken by one forward pass of the cube batch (measured before the volume is touched), and
    the part that is volume-sized by construction: the z-scored copy of the input and the
    probability and weight accumulators.

Ensembles run two ways, side by side: ``loaded`` (what distmis does: every member loaded, each
cube batch through every member in turn) and ``sequential`` (one member loaded at a time, the
whole volume through it, its probabilities accumulated), to measure which to keep.

    python benchmarks/predict.py [--patch 64] [--overlap 0.5] [--sizes 64,128,192] [--batches 1,2,4]
                                 [--members 1,3,5] [--ensemble-size 96]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import add_out_option, write_report

CHILD = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
from distmis.training import configure_tensorflow
configure_tensorflow(None)
from distmis.inference import PredictOptions, build_model, make_predict_fn, predict_probabilities, read_model_record

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
from distmis.inference import build_models
model_dir, size, patch, overlap, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
tta, strategy = sys.argv[6] == "1", sys.argv[7]
record = read_model_record(model_dir)
rng = np.random.default_rng(0)
volume = rng.normal(1.0, 0.3, size=(size, size, size, record.channels)).astype(np.float32)
options = PredictOptions(patch=(patch,) * 3, overlap=overlap, batch_size=batch, tta=tta)
base = status("VmRSS:")
cubes = []
if strategy == "loaded":  # every member loaded; each cube batch through all of them
    predict = make_predict_fn(build_models(record), tta=tta)
    predict(np.zeros((batch, patch, patch, patch, record.channels), np.float32))  # trace + the cube batch's activations
    warm = status("VmHWM:")
    start = time.perf_counter()
    probs = predict_probabilities(volume, record, predict, options, progress=lambda d, t: cubes.append(t))
else:  # one member at a time over the whole volume, probabilities accumulated
    warm = status("VmHWM:")
    start = time.perf_counter()
    probs = None
    for member in record.singles:
        predict = make_predict_fn(build_model(member), tta=tta)
        out = predict_probabilities(volume, member, predict, options, progress=lambda d, t: cubes.append(t))
        probs = out if probs is None else probs + out
        del predict
    probs = probs / len(record.singles)
seconds = time.perf_counter() - start
peak = status("VmHWM:")
print(json.dumps({"size": size, "batch": batch, "cubes": cubes[-1], "seconds": seconds, "tta": tta,
                  "members": len(record.singles), "strategy": strategy,
                  "voxels_per_s": size ** 3 / seconds, "peak_added": max(peak - base, 0), "cube_batch": max(warm - base, 0),
                  # z-scored copy of the input + probability accumulator + weight accumulator
                  "volume_sized": volume.nbytes + probs.nbytes + size ** 3 * 4}))
"""


def write_model(directory: Path, patch: int) -> None:
    """A model directory as training writes it, with the quickstart architecture."""
    code = r"""
import json, sys
from pathlib import Path
from distmis.config import ExperimentConfig, dump_config
from distmis.model import build_unet
from distmis.training import save_arrays
out, patch = Path(sys.argv[1]), int(sys.argv[2])
cfg = ExperimentConfig.model_validate({"train": {"patch": [patch] * 3}, "data": {"prepare": {"shape": [patch] * 3}},
                                       "model": {"depth": 3, "filters": 8, "norm": "group", "groups": 4}})
out.mkdir(parents=True, exist_ok=True)
dump_config(cfg, out / "config.yaml")
model = build_unet(cfg.model, channels=4, num_classes=1)
save_arrays(out / "weights.npz", {f"model/{i:04d}": v.numpy() for i, v in enumerate(model.weights)})
(out / "preprocessing.json").write_text(json.dumps({"modalities": ["FLAIR", "T1w", "t1gd", "T2w"], "channels": 4,
    "labels": {"0": "background", "1": "tumour"}, "label_mode": "binary", "num_classes": 1,
    "normalisation": "zscore_nonzero_per_channel", "resize": "crop_pad", "shape": [patch] * 3}))
"""
    subprocess.run(
        [sys.executable, "-c", code, str(directory), str(patch)],
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def write_ensemble(directory: Path, member: Path, members: int) -> None:
    """An ensemble directory as finalize writes it, of ``members`` copies of ``member``."""
    names = []
    for i in range(members):
        shutil.copytree(member, directory / "members" / f"m{i}")
        names.append(f"members/m{i}")
    for shared in ("config.yaml", "preprocessing.json"):
        shutil.copy2(member / shared, directory / shared)
    (directory / "ensemble.json").write_text(
        json.dumps({"format": "distmis-ensemble/1", "members": names, "tta": False, "largest_component": []})
    )


def run(
    model: Path, size: int, patch: int, overlap: float, batch: int, tta: bool = False, strategy: str = "loaded"
) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(model),
            str(size),
            str(patch),
            str(overlap),
            str(batch),
            str(int(tta)),
            strategy,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patch", type=int, default=64)
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--sizes", default="64,128,192")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--batch-size-for-volumes", type=int, default=2, dest="fixed_batch")
    ap.add_argument("--members", default="1,3,5", help="ensemble sizes ('' to skip the ensemble rows)")
    ap.add_argument("--ensemble-size", type=int, default=96, help="volume side of the ensemble rows")
    ap.add_argument("--only-ensembles", action="store_true", help="skip the volume and cube-batch rows")
    add_out_option(ap, "predict")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    mib = 1 / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        write_model(model, args.patch)
        print(f"patch {args.patch}^3, overlap {args.overlap}; peak = RSS added by prediction\n")
        members = ensembles(model, Path(tmp), args, [int(m) for m in args.members.split(",")]) if args.members else []
        title = f"sliding-window prediction, patch {args.patch}^3, overlap {args.overlap}; peak = RSS added"
        if args.only_ensembles:
            write_report(args.out, "predict", title=title, rows=members, echo=False)
            return
        print(
            f"{'volume':>8} {'batch':>5} {'cubes':>5} {'seconds':>8} {'Mvoxel/s':>9} {'peak MiB':>9} {'cube batch MiB':>15} {'volume-sized MiB':>17}"
        )
        rows = []
        for size in sizes:
            rows.append(run(model, size, args.patch, args.overlap, args.fixed_batch))
        mid = sizes[len(sizes) // 2]
        for batch in batches:
            if batch != args.fixed_batch:
                rows.append(run(model, mid, args.patch, args.overlap, batch))
        rows.sort(key=lambda r: (r["size"], r["batch"]))
        for r in rows:
            print(
                f"{r['size']:>7}³ {r['batch']:>5} {r['cubes']:>5} {r['seconds']:>8.1f} {r['voxels_per_s'] / 1e6:>9.3f} "
                f"{r['peak_added'] * mib:>9.0f} {r['cube_batch'] * mib:>15.0f} {r['volume_sized'] * mib:>17.0f}"
            )
        by = {(r["size"], r["batch"]): r for r in rows}
        small, large = by[(sizes[0], args.fixed_batch)], by[(sizes[-1], args.fixed_batch)]
        print(
            f"\nvolume x{(sizes[-1] / sizes[0]) ** 3:.0f} ({sizes[0]}³ -> {sizes[-1]}³, batch {args.fixed_batch}): peak "
            f"x{large['peak_added'] / max(small['peak_added'], 1):.2f}; peak minus volume-sized arrays "
            f"{(small['peak_added'] - small['volume_sized']) * mib:.0f} -> {(large['peak_added'] - large['volume_sized']) * mib:.0f} MiB"
        )
        b1, bn = by[(mid, batches[0])], by[(mid, batches[-1])]
        print(
            f"cube batch {batches[0]} -> {batches[-1]} at {mid}³: peak {b1['peak_added'] * mib:.0f} -> "
            f"{bn['peak_added'] * mib:.0f} MiB (x{bn['peak_added'] / max(b1['peak_added'], 1):.2f}); one forward pass "
            f"{b1['cube_batch'] * mib:.0f} -> {bn['cube_batch'] * mib:.0f} MiB"
        )
        write_report(args.out, "predict", title=title, rows=rows, data={"ensembles": members}, echo=False)


def ensembles(model: Path, tmp: Path, args: argparse.Namespace, sizes: list[int]) -> list[dict[str, Any]]:
    """Ensembles of 1, 3, 5 members, with and without mirroring, both ways of running the members; a row each."""
    mib = 1 / 2**20
    print(f"ensembles at {args.ensemble_size}^3, batch {args.fixed_batch}")
    print(f"{'members':>7} {'TTA':>4} {'strategy':>10} {'seconds':>8} {'Mvoxel/s':>9} {'peak MiB':>9}")
    results = {}
    for members in sizes:
        directory = tmp / f"ensemble{members}"
        write_ensemble(directory, model, members)
        for tta in (False, True):
            for strategy in ("loaded", "sequential"):
                r = run(directory, args.ensemble_size, args.patch, args.overlap, args.fixed_batch, tta, strategy)
                results[(members, tta, strategy)] = r
                print(
                    f"{members:>7} {'on' if tta else 'off':>4} {strategy:>10} {r['seconds']:>8.1f} "
                    f"{r['voxels_per_s'] / 1e6:>9.3f} {r['peak_added'] * mib:>9.0f}"
                )
    largest = max(sizes)
    for tta in (False, True):
        a, b = results[(largest, tta, "loaded")], results[(largest, tta, "sequential")]
        print(
            f"{largest} members, TTA {'on' if tta else 'off'}: loaded / sequential time "
            f"{a['seconds'] / b['seconds']:.2f}, peak {a['peak_added'] * mib:.0f} vs {b['peak_added'] * mib:.0f} MiB"
        )
    print()
    return [{"members": m, "tta": tta, "strategy": strategy, **r} for (m, tta, strategy), r in results.items()]


if __name__ == "__main__":
    main()
