"""What the benchmarks share: the tasks and their data, running ``distmis tune``, quartiles, and one
output convention (``--out DIR`` holding ``NAME.json``, ``NAME.md`` and ``NAME.png``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import yaml

from distmis.simulate.study import (  # the figures every benchmark reports, one definition
    finite_json,
    fmt_stat,
    quartiles,
)

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

#: ``train.augment`` keys that turn on nnU-Net's augmentation for a 3D patch: rotation 30, scale
#: [0.7, 1.4] and its intensity transforms at strength 1 (merged into a file's own keys, its flips kept)
NNUNET_AUGMENT: dict[str, Any] = {"rotation": 30.0, "scale": [0.7, 1.4], "nnunet_intensity": 1.0}


def fail(script: str, message: str) -> NoReturn:
    """A benchmark's bad input: one ``SCRIPT: error:`` line and exit code 2, as argparse and distmis
    answer one, before anything is built, trained or written."""
    print(f"{script}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


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


def add_out_option(parser: argparse.ArgumentParser, name: str, default: Path | None = None) -> None:
    """``--out DIR``: where :func:`write_report` writes the benchmark's figures (default ``runs/bench/NAME``)."""
    parser.add_argument(
        "--out",
        type=Path,
        default=default or REPO / "runs" / "bench" / name,
        help=f"directory for {name}.json, {name}.md and {name}.png (default: %(default)s)",
    )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.4g}"
    return "-" if value is None else str(value)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` (one dict per row, the first row's keys as columns) as a Markdown table."""
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_report(
    out: Path,
    name: str,
    *,
    title: str,
    rows: list[dict[str, Any]],
    data: dict[str, Any] | None = None,
    figure: Callable[[Any], None] | None = None,
    png: Callable[[Path], None] | None = None,
    markdown: str | None = None,
    echo: bool = True,
) -> Path:
    """Every benchmark's output, one convention: ``out/NAME.json`` (the rows, and ``data``: whatever
    else the run measured), ``out/NAME.md`` (the title and the rows as a table) and ``out/NAME.png``
    (``figure(fig)`` draws on the empty matplotlib figure; by default the rows' first numeric column
    as bars, by the first column; ``png(path)``: a plot that writes its own file, the simulator's).
    ``markdown``: the table as the script lays it out (several header rows, merged cells), else the rows'.
    Prints the table (``echo``: a script that printed its own already says False). Returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    table = markdown if markdown is not None else markdown_table(rows)
    if echo:
        print(f"\n{title}\n\n{table}", flush=True)
    document = {"title": title, "rows": rows, **({"data": data} if data else {})}
    (out / f"{name}.json").write_text(json.dumps(finite_json(document), indent=1, default=str) + "\n")
    (out / f"{name}.md").write_text(f"{title}\n\n{table}\n")
    if png is not None:
        png(out / f"{name}.png")
        return out
    fig = plt.figure(figsize=(8, 4.5))
    if figure is not None:
        figure(fig)
    elif rows:
        axes = fig.add_subplot()
        label, *rest = list(rows[0])
        numeric = next(
            (c for c in rest if isinstance(rows[0][c], (int, float)) and not isinstance(rows[0][c], bool)), None
        )
        if numeric is not None:
            values = [float(r[numeric]) if isinstance(r.get(numeric), (int, float)) else float("nan") for r in rows]
            axes.barh([str(r[label])[:60] for r in rows], values)
            axes.set_xlabel(numeric)
            axes.invert_yaxis()
    fig.suptitle(title[:110], fontsize=9)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=100)
    plt.close(fig)
    return out


__all__ = [
    "ANATOMY_DATA",
    "REPO",
    "TASK_FILES",
    "add_out_option",
    "anatomy_data",
    "fmt_stat",
    "markdown_table",
    "prepare_task",
    "quartiles",
    "run_tune",
    "write_report",
]
