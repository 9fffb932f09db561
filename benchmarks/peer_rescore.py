"""The runs ``peer_nnunet.py`` kept, scored again on every labelled case of a second dataset.

A task's own split leaves few scans to test on (2 of the anatomy tasks' 16 cases), so a margin of a
few tenths of a point between two systems, or between a setting on and off, can be one scan's luck.
This scores each kept model, unchanged, on a second dataset of the same task: the same channels and
labels, and subjects none of the runs trained on (``tests/_support/anatomy.py --seed N`` writes more
subjects of the anatomy tasks; for your own task, scans you held back). Each distmis model is scored
by ``distmis evaluate MODEL DATA --split all --tta``, each nnU-Net model by ``nnUNetv2_predict`` (its
default mirroring) and distmis's own metrics, as ``peer_nnunet.py`` scores them.

Writes ``OUT/peer_rescore.{json,md,png}``: per system and budget, each class's Dice (median [range]
over seeds of the mean over the scans) and, seed by seed, the difference from the ``--against``
system of the same budget and seed, with the scans on which it is ahead; every scan's Dice in the
JSON. Each run's scores are kept under OUT, so a second call scores only what is new.

    python benchmarks/peer_rescore.py --runs runs/peer/wm --data FRESH --budgets 5m --seeds 0,1,2
    python benchmarks/peer_rescore.py --runs runs/peer/wm --data FRESH --against distmis
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import benchlib
import numpy as np
import yaml
from benchlib import write_report
from peer_nnunet import (
    NNUNET_TRAINERS,
    add_nnunet_options,
    case_scorer,
    class_dice,
    nnunet_dataset_id,
    nnunet_device,
    nnunet_predict_cmd,
    write_nnunet_images,
)

if TYPE_CHECKING:
    from distmis.data import MsdDataset

NAME = "peer_rescore"


def fail(message: str) -> NoReturn:
    """One error line and exit code 2, before anything is written."""
    benchlib.fail(NAME, message)


# --------------------------------------------------------------------------- the kept runs
def kept(runs: Path, budgets: list[str] | None, seeds: list[str] | None) -> list[Path]:
    """Every finished run folder (``BUDGET/seedN/SYSTEM/result.json``) under ``runs``, in order."""
    found = sorted(p.parent for p in runs.glob("*/seed*/*/result.json"))
    return [
        f
        for f in found
        if (budgets is None or f.parent.parent.name in budgets)
        and (seeds is None or f.parent.name.removeprefix("seed") in seeds)
    ]


def distmis_model(run: Path, result: dict[str, Any]) -> Path | None:
    """The model a distmis run was scored with (the ensemble after ``finalize``), or None for nnU-Net."""
    if not (run / "run" / "splits.json").is_file():
        return None
    return run / "run" / ("final" if "finalize" in result["system"] else "best")


def task_source(run: Path) -> Path:
    """The MSD dataset a distmis run trained on, from the file init wrote (``data.source``)."""
    doc = yaml.safe_load((run / "plan.yaml").read_text())
    return (run / doc["data"]["source"]).resolve()


def digests(paths: list[Path]) -> dict[str, Path]:
    """sha256 of each file -> the file: the same scan under another name is still the same scan."""
    return {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in paths}


def check_data(data: Path, runs: list[Path]) -> MsdDataset:
    """``data``'s record, read once for every run: it must be the same task as the kept runs (channels
    and labels) and hold no scan they trained or selected a model on: a trained-on scan would flatter
    every system alike."""
    from distmis.data import read_dataset_json
    from distmis.exceptions import DistmisError

    if not (data / "dataset.json").is_file():
        fail(f"--data {data}: expected an MSD-layout dataset folder holding dataset.json")
    try:
        meta = read_dataset_json(data)
    except DistmisError as exc:  # its message names the file and the field
        fail(f"--data {data}: {exc}")
    if not [c for c in meta.training if c.label is not None]:
        fail(f"--data {data}: no labelled case to score (dataset.json 'training' is empty)")
    seen: set[Path] = set()
    for run in runs:
        if not (run / "plan.yaml").is_file() or (source := task_source(run)) in seen:
            continue
        seen.add(source)
        try:
            task = read_dataset_json(source)
        except DistmisError as exc:
            fail(f"--runs: {run} trained on {source}, which is no longer a readable dataset: {exc}")
        if (task.labels, task.modalities) != (meta.labels, meta.modalities):
            fail(f"--data {data}: labels {meta.labels} and channels {meta.modalities} differ from the task the runs "
                 f"trained on ({source}: labels {task.labels}, channels {task.modalities})")  # fmt: skip
        splits = json.loads((run / "run" / "splits.json").read_text())
        trained = digests([c.image for c in task.training if c.case_id not in splits["test"]])
        for case in meta.training:
            digest = hashlib.sha256(case.image.read_bytes()).hexdigest()
            if digest in trained:
                fail(f"--data {data}: case {case.case_id}'s image is the task's training case {trained[digest].name} "
                     f"({source}): score on scans the runs never trained on")  # fmt: skip
    return meta


# --------------------------------------------------------------------------- scoring
def score_distmis(model: Path, meta: MsdDataset, out: Path, home: Path) -> dict[str, dict[str, float]]:
    """{case: {class: Dice}} of a distmis model on every case of ``meta``, by ``distmis evaluate``."""
    cmd = [sys.executable, "-m", "distmis", "evaluate", str(model), str(meta.root), "--split", "all", "--out", str(out),
           "--no-track", "--tta", "--overwrite"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "DISTMIS_DATA_HOME": str(home)})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    scores = {}
    with open(out / "metrics.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            dice = {k: float(v) if v else math.nan for k, v in row.items() if k == "dice" or k.startswith("dice_")}
            scores[row["case_id"]] = class_dice(dice, meta.labels)
    return scores


def score_nnunet(run: Path, python: str, device: str, meta: MsdDataset, images: Path, out: Path,
                 model: Path) -> dict[str, Any]:  # fmt: skip
    """{case: {class: Dice}} of a kept nnU-Net model on every case of ``meta`` (scored with the classes
    of the distmis ``model`` of its seed, as ``peer_nnunet.py`` scores it)."""
    results = run / "results"
    found = {p.name: nnunet_dataset_id(p.name) for p in results.iterdir() if p.is_dir()}
    ids = [i for i in found.values() if i is not None]
    if len(ids) != 1:
        raise RuntimeError(f"{results}: expected one nnU-Net dataset folder (DatasetXXX_NAME), found {sorted(found)}")
    dataset_id = ids[0]
    scratch = out / "nnunet-env"
    env = {
        **os.environ,
        "nnUNet_results": str(results),
        "nnUNet_raw": str(scratch),
        "nnUNet_preprocessed": str(scratch),
    }
    cmd = nnunet_predict_cmd(python, images, out / "predictions", dataset_id, NNUNET_TRAINERS[run.name], device)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "predict.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        raise RuntimeError(f"nnUNetv2_predict exited {rc}; see {out / 'predict.log'}")
    ids = [c.case_id for c in meta.training if c.label is not None]
    return case_scorer(model, meta.root, ids)(out / "predictions")


def nnunet_images(meta: MsdDataset, out: Path) -> Path:
    """``meta``'s images in nnU-Net's naming, written once for every nnU-Net run (a folder that is
    complete, or not there)."""
    folder = out / "nnunet-images"
    if folder.is_dir():
        return folder
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for case in meta.training:
        write_nnunet_images(case.image, case.case_id, tmp)
    tmp.rename(folder)
    return folder


def rescore(run: Path, meta: MsdDataset, out: Path, python: str, device: str | None) -> dict[str, Any]:
    """One kept run scored on ``meta``'s cases, kept at ``out/scores.json`` (written last: there or not);
    ``device`` is None only when no nnU-Net run is left to predict."""
    kept_scores = out / "scores.json"
    if kept_scores.is_file():
        return json.loads(kept_scores.read_text())
    result = json.loads((run / "result.json").read_text())
    model = distmis_model(run, result)
    if model is not None:
        scores = score_distmis(model, meta, out / "evaluate", out.parents[2] / "data-home")
    elif run.name in NNUNET_TRAINERS:
        distmis_runs = sorted(p.parent.parent for p in run.parent.glob("*/run/splits.json"))
        if not distmis_runs:
            raise RuntimeError(f"{run}: no distmis run of this seed kept beside it to take the classes from")
        model = distmis_model(distmis_runs[0], json.loads((distmis_runs[0] / "result.json").read_text()))
        assert model is not None and device is not None
        scores = score_nnunet(run, python, device, meta, nnunet_images(meta, out.parents[2]), out, model)
    else:
        raise RuntimeError(f"{run}: neither a distmis run nor an nnU-Net one")
    doc = {"system": result["system"], "budget": result["budget"], "seed": result["seed"], "folder": run.name,
           "scans": scores}  # fmt: skip
    kept_scores.write_text(json.dumps(doc, indent=1))
    print(f"{run}: {len(scores)} scans scored", flush=True)
    return doc


# --------------------------------------------------------------------------- report
def mean_by_class(doc: dict[str, Any]) -> dict[str, float]:
    scans = list(doc["scans"].values())
    return {c: float(np.nanmean([s[c] for s in scans])) for c in scans[0]}


def mean_dice(scan: dict[str, float]) -> float:
    return float(np.nanmean(list(scan.values())))


def report(docs: list[dict[str, Any]], against: str, out: Path, data: Path) -> None:
    """Per system and budget: each class's Dice (median [range] over seeds), and seed by seed the mean
    Dice's difference from ``against`` (the same budget and seed) with the scans on which it is ahead."""
    classes = sorted({c for d in docs for c in mean_by_class(d)})
    base = {(d["budget"], d["seed"]): d for d in docs if d["folder"] == against}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in docs:
        groups.setdefault((d["budget"], d["system"]), []).append(d)
    rows = []
    for (budget, system), ds in sorted(groups.items()):
        ds.sort(key=lambda d: d["seed"])
        row: dict[str, Any] = {"system": system, "budget": budget, "seeds": len(ds), "scans": len(ds[0]["scans"])}
        for c in classes:
            vals = [mean_by_class(d)[c] for d in ds if c in mean_by_class(d)]
            row[c] = f"{np.median(vals):.4f} [{min(vals):.4f}-{max(vals):.4f}]" if vals else "-"
        paired = []
        for d in ds:
            other = base.get((budget, d["seed"]))
            if other is None or other is d:
                continue
            common = sorted(set(d["scans"]) & set(other["scans"]))
            diff = [mean_dice(d["scans"][k]) - mean_dice(other["scans"][k]) for k in common]
            paired.append(
                f"seed {d['seed']}: {np.mean(diff):+.4f} ({sum(x > 0 for x in diff)}/{len(diff)} scans ahead)"
            )
        row[f"against {against}, mean Dice"] = "; ".join(paired) or "-"
        rows.append(row)

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        labels, values = [], []
        for (budget, system), ds in sorted(groups.items()):
            labels.append(f"{system}\n{budget}")
            values.append([mean_dice(s) for d in ds for s in d["scans"].values()])
        ax.boxplot(values)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
        ax.set_ylabel("Dice per scan (mean over classes), every seed")

    title = f"kept runs scored on every case of {data}: Dice [range over seeds], and paired with {against} by scan"
    write_report(out, NAME, title=title, rows=rows, data={"runs": docs}, figure=draw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, required=True,
                   help="a task's folder under peer_nnunet.py's --out (it holds BUDGET/seedN/SYSTEM)")  # fmt: skip
    p.add_argument("--data", type=Path, required=True,
                   help="an MSD-layout dataset of the same task, none of whose scans the runs trained on")  # fmt: skip
    p.add_argument("--budgets", default=None, help="comma-separated budgets to score (default: every one kept)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds to score (default: every one kept)")
    p.add_argument("--against", default="nnunet",
                   help="the system folder each run is paired with, scan by scan, at its budget and seed (default nnunet; "
                   "distmis for a --set run, distmis-finalize for a --set run of finalize)")  # fmt: skip
    add_nnunet_options(p)
    p.add_argument("--out", type=Path, default=None,
                   help=f"directory for {NAME}.json, {NAME}.md and {NAME}.png, and each run's scores "
                   "(default: RUNS/rescore-DATA, DATA the dataset folder's name)")  # fmt: skip
    a = p.parse_args()
    runs = kept(a.runs, a.budgets and a.budgets.split(","), a.seeds and a.seeds.split(","))
    if not runs:
        fail(f"--runs {a.runs}: no finished run of peer_nnunet.py (BUDGET/seedN/SYSTEM/result.json) for these "
             "budgets and seeds")  # fmt: skip
    data = a.data.resolve()
    meta = check_data(data, runs)
    out = (a.out or a.runs / f"rescore-{data.name}").resolve()
    scores = {run: out / run.parent.parent.name / run.parent.name / run.name for run in runs}
    # only a run not yet scored needs nnU-Net's torch: kept scores are reported without it
    device = None
    if any(run.name in NNUNET_TRAINERS and not (scores[run] / "scores.json").is_file() for run in runs):
        device = nnunet_device(a.nnunet_python, a.nnunet_device, NAME)
    docs = [rescore(run, meta, scores[run], a.nnunet_python, device) for run in runs]
    report(docs, a.against, out, data)


if __name__ == "__main__":
    main()
