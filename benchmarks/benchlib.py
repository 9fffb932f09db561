"""What the search and recipe benchmarks share: the tasks, their data, running ``distmis tune``, quartiles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from distmis.simulate.study import fmt_stat, quartiles  # the figures every benchmark reports, one definition

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process prepares data with TensorFlow

#: task -> its base search-space file (data, train, model, search)
TASK_FILES = {
    "quickstart": REPO / "search_spaces" / "quickstart.yaml",
    "mni152": REPO / "search_spaces" / "anatomy_quickstart.yaml",
    "anatomy32": REPO / "benchmarks" / "curves" / "anatomy32.yaml",
}

#: task -> the real-anatomy data it is written as by ``tests/_support/anatomy.py``: (directory name, shape, voxel mm)
ANATOMY_DATA = {"mni152": ("mni152", 64, 2.0), "anatomy32": ("mni152_32", 32, 4.0)}


def prepare_task(task: str, base: dict[str, Any], base_dir: Path, root: Path) -> Path:
    """The task's data, prepared once into the benchmark's own cache (``root/data``).

    The anatomy tasks are written from nilearn's MNI152 template by ``tests/_support/anatomy.py`` (20 subjects;
    ``mni152`` 64^3 at 2 mm, ``anatomy32`` 32^3 at 4 mm) whatever the file's ``data.source`` says.
    """
    os.environ.setdefault("DISTMIS_DATA_HOME", str(root / "data"))
    from distmis.config import DataConfig
    from distmis.data import resolve_prepared

    data = dict(base.get("data", {}))
    if task in ANATOMY_DATA:
        data["source"] = str(anatomy_data(task, root))
    return resolve_prepared(DataConfig.model_validate(data), base_dir=base_dir)


def anatomy_data(task: str, root: Path) -> Path:
    """The raw MSD-style directory of an anatomy task under ``root/data``, written once."""
    sys.path.insert(0, str(REPO / "tests"))
    from _support.anatomy import write_mni152_task

    name, side, voxel_mm = ANATOMY_DATA[task]
    raw = root / "data" / name
    if not (raw / "dataset.json").is_file():
        write_mni152_task(raw, shape=(side, side, side), voxel_mm=voxel_mm)
    return raw


def run_tune(doc: dict[str, Any], root: Path, out: Path) -> float:
    """Run ``distmis tune`` on ``doc`` (a search-space document) into ``out``; returns its wall time.

    Each search is its own process with its own local Ray, as a user runs it; MLflow goes to one
    SQLite store under ``root``. An ``out`` left by an interrupted earlier call is removed first.
    """
    cfg = root / "configs" / f"{doc['name']}.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    if out.exists():
        shutil.rmtree(out)
    log = root / "logs" / f"{doc['name']}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    start = time.time()
    with open(log, "w") as fh:
        rc = subprocess.call(
            [sys.executable, "-m", "distmis", "tune", str(cfg), "--out", str(out)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wall = time.time() - start
    print(f"  {doc['name']}: exit {rc}, {wall:.0f} s ({log})", flush=True)
    if rc != 0 or not (out / "results.csv").is_file():
        raise SystemExit(f"{doc['name']} failed; see {log}")
    return wall


__all__ = ["ANATOMY_DATA", "REPO", "TASK_FILES", "anatomy_data", "fmt_stat", "prepare_task", "quartiles", "run_tune"]
