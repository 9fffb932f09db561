"""Is data preparation and loading fast enough?

Prints, measured side by side in one run:
  * prepare MB/s vs a nibabel read-only pass over the same NIfTI files (ratio: how close
    `distmis prepare` gets to just reading the data; it also normalises, resizes, writes);
  * loader samples/s (patches + augmentation) vs the model's training consumption in
    samples/s on the same batch (ratio > 1: the input pipeline is not the bottleneck).

    python benchmarks/data_pipeline.py [--size 64] [--cases 24] [--patch 32]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchlib import add_out_option, write_report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--patch", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    add_out_option(ap, "data_pipeline")
    args = ap.parse_args()

    import nibabel as nib
    import numpy as np

    from distmis.config import AugmentConfig, ExperimentConfig, PrepareConfig
    from distmis.data import load_manifest, make_dataset, prepare_dataset, write_synthetic_msd
    from distmis.training import Trainer

    work = Path(tempfile.mkdtemp(prefix="data-bench-"))
    shape = (args.size,) * 3
    write_synthetic_msd(work / "msd", cases=args.cases, shape=shape, test_cases=0)
    meta = json.loads((work / "msd" / "dataset.json").read_text())
    files = [work / "msd" / e[k] for e in meta["training"] for k in ("image", "label")]

    start = time.perf_counter()
    nbytes = sum(np.asarray(nib.load(f).dataobj).nbytes for f in files)
    t_read = time.perf_counter() - start
    mb = nbytes / 1e6

    start = time.perf_counter()
    prepare_dataset(work / "msd", work / "prep", PrepareConfig(shape=shape, split=(0.8, 0.2, 0.0)))
    t_cold = time.perf_counter() - start  # as the CLI pays it: TensorFlow import included
    start = time.perf_counter()
    prepare_dataset(work / "msd", work / "prep2", PrepareConfig(shape=shape, split=(0.8, 0.2, 0.0)))
    t_prep = time.perf_counter() - start  # TensorFlow already imported; worker start-up included

    manifest = load_manifest(work / "prep")
    patch = (args.patch,) * 3
    ds = make_dataset(
        manifest,
        "train",
        batch_size=args.batch,
        training=True,
        patch=patch,
        augment_config=AugmentConfig(noise=0.05),
        seed=0,
    )
    it = iter(ds)
    for _ in range(5):
        next(it)  # warm-up (cache fill, tracing)
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        next(it)
    loader_sps = n * args.batch / (time.perf_counter() - start)

    cfg = ExperimentConfig.model_validate(
        {
            "train": {"batch_size_per_replica": args.batch, "patch": list(patch), "steps_per_epoch": 20, "epochs": 2},
            "data": {"prepare": {"shape": list(shape)}},
        }
    )
    trainer = Trainer(cfg, manifest)
    trainer.train_epoch()  # tracing
    _, _, seconds = trainer.train_epoch()
    model_sps = 20 * args.batch / seconds

    print(
        f"{args.cases} cases of {args.size}^3 x 4 channels + labels ({mb:.0f} MB uncompressed), {os.cpu_count()} cores"
    )
    print(f"nibabel read-only pass   {mb / t_read:8.1f} MB/s  ({t_read:.2f} s)")
    print(f"distmis prepare (cold)   {mb / t_cold:8.1f} MB/s  ({t_cold:.2f} s, TensorFlow import included)")
    print(f"distmis prepare (warm)   {mb / t_prep:8.1f} MB/s  ({t_prep:.2f} s)")
    print(f"ratio prepare(warm)/read {t_read / t_prep:8.2f}  (prepare also normalises, resizes, serialises, hashes)")
    print(f"loader ({args.patch}^3 patches, aug)  {loader_sps:8.1f} samples/s")
    print(f"model training           {model_sps:8.1f} samples/s")
    print(f"ratio loader / model     {loader_sps / model_sps:8.2f}  (> 1: input is not the bottleneck)")
    rows = [
        {"measure": "nibabel read-only pass, MB/s", "value": mb / t_read},
        {"measure": "distmis prepare (cold, TensorFlow import included), MB/s", "value": mb / t_cold},
        {"measure": "distmis prepare (warm), MB/s", "value": mb / t_prep},
        {"measure": "ratio prepare (warm) / read", "value": t_read / t_prep},
        {"measure": f"loader ({args.patch}^3 patches, augmented), samples/s", "value": loader_sps},
        {"measure": "model training, samples/s", "value": model_sps},
        {"measure": "ratio loader / model (> 1: input is not the bottleneck)", "value": loader_sps / model_sps},
    ]
    title = f"{args.cases} cases of {args.size}^3 x 4 channels + labels ({mb:.0f} MB), {os.cpu_count()} cores"
    write_report(args.out, "data_pipeline", title=title, rows=rows, echo=False)


if __name__ == "__main__":
    main()
