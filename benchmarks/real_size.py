"""Data at the size users have: BraTS-shaped cases of 240 x 240 x 155 x 4, prepared and read on demand.

For each case count N it prints, measured side by side in one run on the same files:
  * prepare throughput (cases/s, all cores) against a plain nibabel read of the same inputs;
  * the prepared size against the ``.nii.gz`` inputs;
  * the training loader (128³ patches, batch 2, ``--augment``'s augmentation) in a fresh process
    per setting: peak RSS, time to the first batch, patches/s at 1 and 2 threads;
  * the raw read-and-copy rate of random 128³ patches from the format (one thread): the ceiling;
  * the checksum pass `distmis tune` makes once per search before its trials (not in the loader's
    start-up: the trials find it recorded).
With --train it also runs one `distmis train` epoch of 96³ patches on 4 cases with validation and a
`distmis predict` of one whole case, each with its wall time and peak RSS.

Writes a table, real_size.json and real_size.png (RSS and patches/s against N) into --out.

    python benchmarks/real_size.py --cases 8,32,64 [--unique 8] [--train] [--out DIR]

Synthesising a real-size case takes ~7 s, so --unique distinct cases are made and the others are
hard links to them under their own names: every case is still read, prepared and stored on its own.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import add_out_option, write_report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
SHAPE = (240, 240, 155)
PREPARED = (240, 240, 160)  # crop_pad to a shape a 4-level U-Net divides evenly
PATCH = (128, 128, 128)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_inputs(root: Path, cases: int, unique: int) -> Path:
    """An MSD directory of ``cases`` real-size cases (``unique`` distinct ones, the rest hard links)."""
    from distmis.data import write_synthetic_msd

    src = root / f"synth-{unique}"
    if not (src / "dataset.json").is_file():
        write_synthetic_msd(src, cases=unique, shape=SHAPE, test_cases=0, seed=0)
    out = root / f"msd-{cases}"
    if (out / "dataset.json").is_file():
        return out
    meta = json.loads((src / "dataset.json").read_text())
    for sub in ("imagesTr", "labelsTr", "imagesTs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    training = []
    for i in range(cases):
        base = meta["training"][i % unique]
        cid = f"CASE_{i:03d}"
        for key, sub in (("image", "imagesTr"), ("label", "labelsTr")):
            target = out / sub / f"{cid}.nii.gz"
            if not target.exists():
                os.link(src / base[key], target)
        training.append({"image": f"./imagesTr/{cid}.nii.gz", "label": f"./labelsTr/{cid}.nii.gz"})
    meta.update(training=training, numTraining=cases, test=[], numTest=0)
    (out / "dataset.json").write_text(json.dumps(meta))
    return out


def measure_prepare(src: Path, out: Path) -> dict[str, Any]:
    import nibabel as nib
    import numpy as np

    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset

    inputs = sorted(src.glob("*Tr/*.nii.gz"))
    start = time.perf_counter()
    for f in inputs:
        np.asarray(nib.load(f).dataobj)
    t_read = time.perf_counter() - start
    cases = len(inputs) // 2
    start = time.perf_counter()
    prepare_dataset(src, out, PrepareConfig(shape=PREPARED, split=(0.85, 0.15, 0.0)), overwrite=True)
    t_prep = time.perf_counter() - start
    nii = sum(f.stat().st_size for f in inputs)
    return {
        "cases": cases,
        "nibabel_read_cases_per_s": cases / t_read,
        "prepare_cases_per_s": cases / t_prep,
        "prepare_vs_read": t_read / t_prep,
        "nii_gz_mb": nii / 1e6,
        "prepared_mb": _dir_bytes(out) / 1e6,
        "disk_ratio": _dir_bytes(out) / nii,
    }


#: ``--augment``: the loader's augmentation (default: ``train.augment`` as shipped; nnunet: nnU-Net's
#: transforms at a 3D patch's settings, as ``train.augment`` asks for them)
AUGMENTATIONS = {
    "default": {},
    "nnunet": {"rotation": 30.0, "scale": (0.7, 1.4), "nnunet_intensity": 1.0},
}


def probe_loader(prepared: str, threads: int, batches: int, augmentation: str = "default") -> dict[str, Any]:
    """In this (fresh) process: time to the first batch, patches/s, peak RSS of the training loader."""
    from distmis.config import AugmentConfig
    from distmis.data import make_dataset
    from distmis.training import configure_tensorflow

    configure_tensorflow(threads)
    start = time.perf_counter()
    ds = make_dataset(
        prepared,
        "train",
        batch_size=2,
        training=True,
        patch=PATCH,
        augment_config=AugmentConfig(**AUGMENTATIONS[augmentation]),
        seed=0,
        threads=threads,
        foreground_oversampling=0.33,
    )
    it = iter(ds)
    next(it)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches * 2 / (time.perf_counter() - start)
    del it  # its memory goes now (an iterator alive at exit is released then too)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "threads": threads,
        "first_batch_s": first,
        "patches_per_s": rate,
        "peak_rss_mb": rss,
        "rss_now_mb": _current_rss_mb(),  # after the timed batches: what the running loader holds
    }


def _current_rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def raw_ceiling(prepared: Path, reads: int) -> float:
    """Random 128³ patch reads (decompress and copy into a new array), one thread: patches/s."""
    import blosc2
    import numpy as np

    from distmis.data import CaseReader, load_manifest

    blosc2.set_nthreads(1)
    manifest = load_manifest(prepared)
    reader = CaseReader(manifest.root, manifest.case_files())
    cases = manifest.cases("train")
    rng = np.random.default_rng(0)
    limit = np.asarray(manifest.info.shape) - np.asarray(PATCH)
    start = time.perf_counter()
    for i in range(reads):
        image, label = reader.read(cases[i % len(cases)], tuple(rng.integers(0, limit + 1)), PATCH)
        np.array(image, copy=True)
    return reads / (time.perf_counter() - start)


def run_measured(command: list[str], cwd: Path) -> dict[str, Any]:
    """Wall time and peak RSS of a child process (its own rusage, read through /proc-free wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    output = proc.stdout.read() if proc.stdout else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}):\n{output[-3000:]}")
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": usage.ru_maxrss / 1024}


def train_and_predict(root: Path, msd: Path) -> dict[str, Any]:
    """One epoch of 96³ patches on 4 training cases with validation, then predict one whole case."""
    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset

    prepared = root / "prep-train"
    prepare_dataset(
        msd, prepared, PrepareConfig(shape=PREPARED, split=(0.67, 0.33, 0.0)), overwrite=True
    )  # 4 train, 2 val
    config = root / "train.yaml"
    config.write_text(
        f"name: real-size\ndata: {{source: {prepared}}}\n"
        "train: {epochs: 1, batch_size_per_replica: 1, patch: [96, 96, 96], steps_per_epoch: 4}\n"
        "model: {depth: 3, filters: 8}\n"
    )
    distmis = str(Path(sys.executable).with_name("distmis"))
    shutil.rmtree(root / "run", ignore_errors=True)  # this benchmark's own earlier run
    train = run_measured([distmis, "train", str(config), "--out", str(root / "run")], root)
    with open(root / "run" / "metrics.csv") as fh:  # the epoch's split: training steps, sliding-window validation
        epoch = list(csv.DictReader(fh))[-1]
    timings = {k: float(epoch[k]) for k in ("train_seconds", "val_seconds", "epoch_seconds", "val_dice")}
    image = sorted((msd / "imagesTr").glob("*.nii.gz"))[0]
    one = root / "one"
    one.mkdir(exist_ok=True)
    if not (one / image.name).exists():
        os.link(image, one / image.name)
    predict = run_measured(
        [distmis, "predict", str(root / "run" / "best"), str(one), "--out", str(root / "pred"), "--overwrite"], root
    )
    return {"train_epoch": train, "train_timings": timings, "predict_one_case": predict}


def plot(results: list[dict[str, Any]], fig: Any) -> None:
    """The loader's peak memory and its patches/s against the number of cases."""
    ax1, ax2 = fig.subplots(1, 2)
    for threads in (1, 2):
        rows = [(r["cases"], r[f"loader_{threads}"]) for r in results]
        ax1.plot([n for n, _ in rows], [p["peak_rss_mb"] for _, p in rows], "o-", label=f"{threads} thread(s)")
        ax2.plot([n for n, _ in rows], [p["patches_per_s"] for _, p in rows], "o-", label=f"{threads} thread(s)")
    ax2.plot([r["cases"] for r in results], [r["raw_ceiling_patches_per_s"] for r in results], "k--", label="raw read")
    ax1.set(xlabel="cases", ylabel="loader peak RSS (MB)", title="memory")
    ax2.set(xlabel="cases", ylabel="128³x4 patches/s", title="throughput")
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="8,32,64", help="comma-separated case counts")
    ap.add_argument("--unique", type=int, default=8, help="distinct synthetic cases (the rest are hard links)")
    ap.add_argument("--batches", type=int, default=15, help="batches timed per loader setting")
    ap.add_argument("--train", action="store_true", help="also one training epoch and one predict at real size")
    add_out_option(ap, "real_size")
    ap.add_argument("--augment", choices=sorted(AUGMENTATIONS), default="default", help="the loader's augmentation")
    ap.add_argument("--probe", nargs=2, metavar=("PREPARED", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe_loader(args.probe[0], int(args.probe[1]), args.batches, args.augment)))
        return
    root = args.out
    root.mkdir(parents=True, exist_ok=True)
    results = []
    for n in (int(c) for c in args.cases.split(",")):
        msd = make_inputs(root, n, args.unique)
        row = measure_prepare(msd, root / f"prep-{n}")
        # what `distmis tune` does once per search before any trial (the trials then find the stamps)
        from distmis.data import load_manifest, verify_cases

        start = time.perf_counter()
        verify_cases(load_manifest(root / f"prep-{n}"), "train")
        row["verify_checksums_s"] = time.perf_counter() - start
        for threads in (1, 2):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--batches",
                    str(args.batches),
                    "--augment",
                    args.augment,
                    "--probe",
                    str(root / f"prep-{n}"),
                    str(threads),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            row[f"loader_{threads}"] = json.loads(out.stdout.strip().splitlines()[-1])
        row["raw_ceiling_patches_per_s"] = raw_ceiling(root / f"prep-{n}", 30)
        row["loader_vs_ceiling"] = row["loader_2"]["patches_per_s"] / row["raw_ceiling_patches_per_s"]
        results.append(row)
        print(json.dumps(row), flush=True)
    report: dict[str, Any] = {"shape": SHAPE, "prepared_shape": PREPARED, "patch": PATCH, "cpus": os.cpu_count()}
    report["augment"] = args.augment
    report["by_cases"] = results
    if len(results) > 1:
        report["rss_growth_largest_vs_smallest"] = (
            results[-1]["loader_2"]["peak_rss_mb"] / results[0]["loader_2"]["peak_rss_mb"] - 1
        )
    if args.train:
        report["real_size_training"] = train_and_predict(root, make_inputs(root, 6, min(6, args.unique)))
    rows = [
        {
            "cases": r["cases"],
            "prepare cases/s": r["prepare_cases_per_s"],
            "nibabel read cases/s": r["nibabel_read_cases_per_s"],
            "disk ratio": r["disk_ratio"],
            "loader RSS MB, 1 thread": r["loader_1"]["peak_rss_mb"],
            "loader RSS MB, 2 threads": r["loader_2"]["peak_rss_mb"],
            "first batch s": r["loader_2"]["first_batch_s"],
            "patches/s, 1 thread": r["loader_1"]["patches_per_s"],
            "patches/s, 2 threads": r["loader_2"]["patches_per_s"],
            "raw read ceiling patches/s": r["raw_ceiling_patches_per_s"],
        }
        for r in results
    ]
    title = f"distmis loader at 240x240x155x4, 128^3 patches, augmentation: {args.augment}"
    write_report(
        root, "real_size", title=title, rows=rows, data=report, figure=lambda fig: plot(results, fig), echo=False
    )
    print(
        f"\n{'cases':>5} {'prep c/s':>8} {'read c/s':>8} {'disk x':>6} {'RSS1 MB':>8} {'RSS2 MB':>8} "
        f"{'1st s':>6} {'p/s 1t':>7} {'p/s 2t':>7} {'ceiling':>7}"
    )
    for r in results:
        print(
            f"{r['cases']:>5} {r['prepare_cases_per_s']:>8.2f} {r['nibabel_read_cases_per_s']:>8.2f} "
            f"{r['disk_ratio']:>6.2f} {r['loader_1']['peak_rss_mb']:>8.0f} {r['loader_2']['peak_rss_mb']:>8.0f} "
            f"{r['loader_2']['first_batch_s']:>6.2f} {r['loader_1']['patches_per_s']:>7.1f} "
            f"{r['loader_2']['patches_per_s']:>7.1f} {r['raw_ceiling_patches_per_s']:>7.1f}"
        )
    if "real_size_training" in report:
        t = report["real_size_training"]
        print(
            f"train 1 epoch (96³, 4 cases, val 2 whole cases): {t['train_epoch']['seconds']:.0f} s, "
            f"peak {t['train_epoch']['peak_rss_mb']:.0f} MB; predict 1 case: {t['predict_one_case']['seconds']:.0f} s, "
            f"peak {t['predict_one_case']['peak_rss_mb']:.0f} MB"
        )
    print(f"results: {root / 'real_size.json'}, {root / 'real_size.md'}, {root / 'real_size.png'}")


if __name__ == "__main__":
    main()
