"""Record a learning-curve table for ``distmis simulate``: a space-filling design trained to the end.

A scrambled Sobol design over the task's space, each configuration one trial of a real
``distmis tune`` (algorithm ``points``, no scheduler, so every trial trains every epoch), and
further training seeds for the first ``--repeats`` configurations (seed noise). The search runs in
``OUT/search``; an interrupted recording goes on with ``distmis tune --resume`` where it stopped,
keeping every trial it finished. The table is then written from that search (``--table``). More
training seeds of a recorded design are a second recording (``--seeds 3,4,5``), its table given
to ``distmis simulate`` beside the first.

Tasks:
  anatomy32   grey and white matter of the MNI152 brain (tests/_support/anatomy.py), 20 subjects at 32^3,
              4 mm; 9 dimensions: lr, norm, filters, depth, loss, batch size, dropout, schedule,
              foreground oversampling; 16 epochs
  quickstart  the quickstart data and the prototype grid's space with lr log-uniform (the space
              benchmarks/search_efficiency.py searches), the grid's 32 points first; 6 epochs

    python benchmarks/record_curves.py --task anatomy32 --configs 256 --repeats 48 \
        --table benchmarks/curves/anatomy32.csv.gz
    python benchmarks/record_curves.py --task quickstart --configs 64 --repeats 96 --seeds 0,1,2 \
        --out runs/curves-quickstart-3seeds --table benchmarks/curves/quickstart.csv.gz
    python benchmarks/record_curves.py --task quickstart --configs 64 --repeats 96 --seeds 3,4,5 \
        --out runs/curves-quickstart-seeds3-5 --table benchmarks/curves/quickstart-seeds3-5.csv.gz
    python benchmarks/record_curves.py --task quickstart --configs 64 --repeats 96 --seeds 6,7,8 \
        --out runs/curves-quickstart-seeds6-8 --table benchmarks/curves/quickstart-seeds6-8.csv.gz
    python benchmarks/record_curves.py --task anatomy32 --with-grid --configs 0 --repeats 24 --seeds 0,1,2 \
        --out runs/curves-anatomy32-grid --table benchmarks/curves/anatomy32-grid.csv.gz
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from benchlib import REPO, TASK_FILES, anatomy_data, fmt_stat, prepare_task, quartiles, write_report

#: the space of the anatomy32 task, as its search file (the shipped table's companion) holds it
ANATOMY32_SPACE: dict[str, Any] = yaml.safe_load(TASK_FILES["anatomy32"].read_text())["space"]


def anatomy32_base(root: Path) -> dict[str, Any]:
    """The 32^3, 4 mm real-anatomy task (12 train, 4 validation, 4 test subjects)."""
    raw = anatomy_data("anatomy32", root)
    return {
        "name": "curves-anatomy32",
        "data": {
            "source": str(raw),
            "prepare": {"shape": [32, 32, 32], "label_mode": "multiclass", "split": [0.6, 0.2, 0.2]},
        },
        "train": {"epochs": 16, "batch_size_per_replica": 2, "patch": [32, 32, 32]},
        "model": {"depth": 3, "filters": 8, "norm": "group", "groups": 4},
        "optimizer": {"name": "adam"},
        "search": {"metric": "val_dice", "mode": "max"},
        "space": ANATOMY32_SPACE,
    }


def quickstart_base(root: Path) -> dict[str, Any]:
    """The quickstart file with the space search_efficiency.py searches (the grid's, lr continuous)."""
    from search_efficiency import continuous_space, grid_space

    base = yaml.safe_load(TASK_FILES["quickstart"].read_text())
    prepared = prepare_task("quickstart", base, TASK_FILES["quickstart"].parent, root)
    base["name"] = "curves-quickstart"
    base["data"] = {**base["data"], "source": str(prepared)}
    base["space"] = continuous_space(grid_space())
    return base


def sobol_points(space: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` configurations of a scrambled Sobol design, mapped onto each parameter's distribution."""
    from scipy.stats import qmc

    names = list(space)
    unit = qmc.Sobol(d=len(names), scramble=True, seed=seed).random(n)
    points = []
    for row in unit:
        point: dict[str, Any] = {}
        for name, u in zip(names, row, strict=True):
            spec = space[name]
            if "loguniform" in spec:
                lo, hi = spec["loguniform"]
                point[name] = float(f"{math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))):.4g}")
            elif "uniform" in spec:
                lo, hi = spec["uniform"]
                point[name] = float(f"{lo + u * (hi - lo):.4g}")
            else:
                options = spec["choice"]
                point[name] = options[min(int(u * len(options)), len(options) - 1)]
        points.append(point)
    return points


def design(
    task: str,
    space: dict[str, Any],
    configs: int,
    repeats: int,
    seed: int,
    seeds: tuple[int, ...] = (0, 1),
    *,
    with_grid: bool = False,
) -> list[dict[str, Any]]:
    """The trials to record, in order: every configuration with the first training seed of
    ``seeds``, then the first ``repeats`` again with each of the others. ``with_grid`` puts the grid
    ``search_efficiency.py`` runs on the task first (always on quickstart), so that a simulated
    grid replays its own points rather than their neighbours."""
    first: list[dict[str, Any]] = []
    if task == "quickstart" or with_grid:
        from search_efficiency import shuffled_grid, task_spaces

        first = shuffled_grid(task_spaces(task, {"space": space})[0], seed)
    points = first + (sobol_points(space, configs, seed) if configs else [])
    again = [{**p, "seed": s} for s in seeds[1:] for p in points[:repeats]]
    return [{**p, "seed": seeds[0]} for p in points] + again


def seed_list(text: str) -> tuple[int, ...]:
    """``--seeds``: distinct non-negative integers, comma-separated."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds >= 0, got {text!r}")
    return seeds


def record(doc: dict[str, Any], root: Path) -> Path:
    """Run (or resume) the recording search; returns its directory."""
    out = root / "search"
    cfg = root / "record.yaml"
    text = yaml.safe_dump(doc, sort_keys=False)
    if cfg.is_file() and cfg.read_text() != text and out.exists():
        raise SystemExit(f"{root}: holds a recording of another design; choose another --out")
    cfg.write_text(text)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    if (out / "summary.json").is_file():
        print(f"recording: {out} is finished", flush=True)
        return out
    resume = ["--resume"] if (out / "tune").exists() else []
    print(f"recording: {len(doc['search']['points'])} trials -> {out} {'(resumed)' if resume else ''}", flush=True)
    start = time.time()
    rc = subprocess.call([sys.executable, "-m", "distmis", "tune", str(cfg), "--out", str(out), *resume], env=env)
    print(f"recording: exit {rc} after {time.time() - start:.0f} s", flush=True)
    if rc != 0 or not (out / "summary.json").is_file():
        raise SystemExit(f"the recording stopped (exit {rc}); run this command again to go on from where it stopped")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="anatomy32", choices=["anatomy32", "quickstart"])
    p.add_argument("--configs", type=int, default=256, help="Sobol configurations (a power of 2 keeps its balance)")
    p.add_argument("--with-grid", action="store_true", help="record search_efficiency.py's grid of the task first")
    p.add_argument("--repeats", type=int, default=48, help="configurations trained again with other seeds")
    p.add_argument(
        "--seeds",
        type=seed_list,
        default=(0, 1),
        help="training seeds, comma-separated: every configuration with the first, the first --repeats with "
        "each of the others (default 0,1)",
    )
    p.add_argument("--epochs", type=int, default=None, help="train.epochs (default: the task's)")
    p.add_argument("--seed", type=int, default=0, help="the design's scrambling seed")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument(
        "--out", default=None, help="for the recording and record_curves.json, .md, .png (default runs/curves-<task>)"
    )
    p.add_argument("--table", default=None, help="write the curve table here (.csv or .csv.gz)")
    a = p.parse_args()

    root = Path(a.out or REPO / "runs" / f"curves-{a.task}").resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DISTMIS_DATA_HOME", str(root / "data"))
    base = anatomy32_base(root) if a.task == "anatomy32" else quickstart_base(root)
    space = dict(base["space"])
    points = design(a.task, space, a.configs, a.repeats, a.seed, a.seeds, with_grid=a.with_grid)
    doc = dict(base)
    if a.epochs:
        doc["train"] = {**doc["train"], "epochs": a.epochs}
    doc["search"] = {
        **base["search"],
        "algorithm": "points",
        "points": points,
        "scheduler": {"type": "none"},
        "max_concurrent_trials": a.concurrency,
        "max_failures": 0,
    }
    doc["space"] = {**space, "seed": {"choice": sorted(a.seeds)}}
    doc["parallelism"] = {"mode": "experiment", "workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0}
    search = record(doc, root)
    from distmis.simulate import curves_of_search, write_table

    table, left_out = curves_of_search(search)
    if a.table:
        path = write_table(table.curves, a.table, recipe=table.recipe)
        configs = len({tuple(sorted((k, str(v)) for k, v in c.params.items())) for c in table.curves})
        print(
            f"{path}: {len(table.curves)} curves of {configs} configurations, training seeds "
            f"{sorted({c.training_seed for c in table.curves})} ({left_out} failed or diverged, left out), "
            f"{path.stat().st_size / 1024:.0f} KiB",
            flush=True,
        )
    report(table.curves, doc["search"].get("metric", "val_dice"), left_out, root, a.task)


def report(curves: list[Any], metric: str, left_out: int, root: Path, task: str) -> None:
    """``root/record_curves.{json,md,png}``: per training seed, the curves recorded, their best value of
    ``metric`` and their epoch seconds (median [IQR]); the histogram of the best values."""
    rows = []
    for seed in sorted({c.training_seed for c in curves}):
        mine = [c for c in curves if c.training_seed == seed]
        best = [max(c.values[metric]) for c in mine]
        seconds = [s for c in mine for s in c.epoch_seconds[1:]]
        rows.append(
            {
                "training seed": seed,
                "curves": len(mine),
                f"best {metric}": fmt_stat(*quartiles(best), 4),
                "epoch seconds after the first": fmt_stat(*quartiles(seconds), 2) if seconds else "-",
            }
        )

    def draw(fig: Any) -> None:
        axes = fig.add_subplot()
        axes.hist([max(c.values[metric]) for c in curves], bins=30)
        axes.set_xlabel(f"best {metric} of a curve")
        axes.set_ylabel("curves")

    title = f"curves recorded on {task}: {len(curves)} ({left_out} failed or diverged, left out)"
    write_report(root, "record_curves", title=title, rows=rows, figure=draw)


if __name__ == "__main__":
    main()
