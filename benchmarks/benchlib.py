"""What the search and recipe benchmarks share: the tasks, their data, running ``distmis tune``, quartiles."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process prepares data with TensorFlow

#: task -> its base search-space file (data, train, model, search)
TASK_FILES = {
    "quickstart": REPO / "search_spaces" / "quickstart.yaml",
    "mni152": REPO / "search_spaces" / "anatomy_quickstart.yaml",
}


def prepare_task(task: str, base: dict[str, Any], base_dir: Path, root: Path) -> Path:
    """The task's data, prepared once into the benchmark's own cache (``root/data``).

    ``mni152`` is written from nilearn's MNI152 template by ``tests/anatomy.py`` (20 subjects,
    64^3 at 2 mm) whatever the file's ``data.source`` says.
    """
    os.environ.setdefault("DISTMIS_DATA_HOME", str(root / "data"))
    from distmis.config import DataConfig
    from distmis.data import resolve_prepared

    data = dict(base.get("data", {}))
    if task == "mni152":
        sys.path.insert(0, str(REPO / "tests"))
        from anatomy import write_mni152_task

        raw = root / "data" / "mni152"
        if not (raw / "dataset.json").is_file():
            write_mni152_task(raw)
        data["source"] = str(raw)
    return resolve_prepared(DataConfig.model_validate(data), base_dir=base_dir)


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


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """Median and interquartile range (linear interpolation; an infinite value stays infinite)."""
    xs = sorted(values)
    if not xs:
        return math.nan, math.nan, math.nan

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        if xs[lo] == xs[hi]:
            return xs[lo]
        if math.isinf(xs[hi]):
            return math.inf if pos > lo else xs[lo]
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return q(0.5), q(0.25), q(0.75)


def fmt_stat(median: float, q1: float, q3: float, digits: int) -> str:
    def f(x: float) -> str:
        return "inf" if math.isinf(x) else "-" if math.isnan(x) else f"{x:.{digits}f}"

    return f"{f(median)} [{f(q1)}-{f(q3)}]"
