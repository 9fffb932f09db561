"""Does the default search find a good model sooner than the DistMIS prototype's grid? Over seeds.

Every method searches the same prepared data with the same model, epochs and training recipe,
2 trials at a time, each as a real ``distmis tune`` process (its own local Ray), once per seed:

  grid          the prototype's 32-point grid (lr x norm x beta_2 x amsgrad), its order shuffled
                per seed, no scheduler; on anatomy32 a 24-point grid (lr x norm x loss, the other
                six parameters at the task file's model)
  random        Optuna's RandomSampler over the same space with lr log-uniform over the grid's
                range, no scheduler; on anatomy32 over the task file's 9-dimensional space
  tpe           Optuna TPE over that space, no scheduler
  random+sched  random search with the scheduler defaults (separates the scheduler's gain from TPE's)
  default       what the task's search-space file runs (quickstart.yaml: TPE + the scheduler defaults)
  tpe+asha-g2   TPE with the scheduler the quickstart shipped before (ASHA, grace 2, factor 2)

Time is measured from the start of the first trial of each search: what comes before it (Ray and
MLflow start-up, the data check) is the same for every method and is reported apart. A seed sets
the sampler's seed, the grid's order and the training seed (the same for every method in a seed).

Per method, as the median and the interquartile range over seeds:
  time to target          seconds until some trial's validation metric reached --target
  compute to target       trial-seconds spent by all trials until then (what a cluster bills)
  best at 25/50/100 %     the best value seen by 25 %, 50 % and 100 % of the grid's median wall time
  AUC                     the mean of the best-so-far curve over the grid's median wall time
  epochs, trials, wall    work done and the trial phase's length

Writes ``search_efficiency.json`` (every seed's figures and curves), ``.md`` (the table) and ``.png``
(median best-so-far against time, IQR band) and prints the table. Finished runs are kept: a second call with the same
``--out`` only runs what is missing.

    python benchmarks/search_efficiency.py --seeds 5                  # quickstart data, target 0.93
    python benchmarks/search_efficiency.py --task mni152 --seeds 3    # real anatomy (needs nilearn)
    python benchmarks/search_efficiency.py --task anatomy32 --seeds 3 --samples 24 --methods grid,random,default
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from pathlib import Path
from typing import Any

import yaml
from benchlib import REPO, TASK_FILES, prepare_task, run_tune, write_report

from distmis.schema import RunFile
from distmis.simulate import analyse
from distmis.simulate.study import plot, table_text

#: the default target of the search metric per task
TARGETS = {"quickstart": 0.93, "mni152": 0.85, "anatomy32": 0.80}
GRID_FILE = REPO / "search_spaces" / "distmis_grid.yaml"
ALL_METHODS = ("grid", "random", "tpe", "random+sched", "default", "tpe+asha-g2")


def grid_space() -> dict[str, Any]:
    """The prototype's grid, as ``distmis_grid.yaml`` writes it."""
    return yaml.safe_load(GRID_FILE.read_text())["space"]


def continuous_space(grid: dict[str, Any]) -> dict[str, Any]:
    """The same space with lr log-uniform over the grid's range (what a sampler can exploit)."""
    space = dict(grid)
    lrs = [float(v) for v in grid["lr"]["choice"]]
    space["lr"] = {"loguniform": [min(lrs), max(lrs)]}
    return space


#: the anatomy32 task's grid: the knobs a user grids first (lr x norm x loss), every other parameter of
#: its space held at one value, so that the grid and the samplers search the same parameters
ANATOMY32_GRID: dict[str, Any] = {
    "lr": {"choice": [1.0e-3, 3.0e-3, 1.0e-2, 3.0e-2]},
    "norm": {"choice": ["batch", "group", "instance"]},
    "filters": {"choice": [8]},
    "depth": {"choice": [3]},
    "loss": {"choice": ["dice", "dice_ce"]},
    "batch_size_per_replica": {"choice": [2]},
    "dropout": {"choice": [0.0]},
    "lr_schedule": {"choice": ["constant"]},
    "foreground_oversampling": {"choice": [0.33]},
}


def task_spaces(task: str, base: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(grid, sampled space) of a task: anatomy32's own 9-dimensional space, else the prototype's grid."""
    if task == "anatomy32":
        return ANATOMY32_GRID, base["space"]
    grid = grid_space()
    return grid, continuous_space(grid)


def shuffled_grid(grid: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    from distmis.space import ParamSpec, grid_points

    points = grid_points({k: ParamSpec.model_validate(v) for k, v in grid.items()})
    random.Random(seed).shuffle(points)
    return points


def method_search(method: str, base: dict[str, Any], seed: int, samples: int, task: str) -> tuple[dict[str, Any], dict]:
    """(search section, space) of one method."""
    grid, space = task_spaces(task, base)
    common = {
        "metric": base["search"].get("metric", "val_dice"),
        "mode": base["search"].get("mode", "max"),
        "seed": seed,
        "max_concurrent_trials": 2,
        "num_samples": samples,
    }
    no_scheduler = {"type": "none"}
    if method == "grid":
        points = shuffled_grid(grid, seed)
        return {**common, "algorithm": "points", "points": points, "scheduler": no_scheduler}, grid
    if method == "random":
        return {**common, "algorithm": "random", "scheduler": no_scheduler}, space
    if method == "tpe":
        return {**common, "algorithm": "optuna", "scheduler": no_scheduler}, space
    if method == "random+sched":  # the scheduler defaults, whatever they are
        return {**common, "algorithm": "random"}, space
    if method == "tpe+asha-g2":
        return {
            **common,
            "algorithm": "optuna",
            "scheduler": {"type": "asha", "grace_period": 2, "reduction_factor": 2},
        }, space
    if method == "default":  # the task file's own search settings (sampler, scheduler), budget as above
        own = {k: v for k, v in base["search"].items() if k not in common and k != "points"}
        return {**own, **common}, space
    raise SystemExit(f"unknown method {method!r}; expected one of {ALL_METHODS}")


def search_doc(
    method: str, seed: int, base: dict[str, Any], source: str, samples: int, epochs: int | None, task: str
) -> dict[str, Any]:
    """The search-space document one method runs for one seed (also what the simulator replays)."""
    search, space = method_search(method, base, seed, samples, task)
    doc = dict(base)
    doc["name"] = f"bench-{method.replace('+', '_')}-s{seed}"
    doc["data"] = {**base.get("data", {}), "source": source}
    doc["train"] = {**base.get("train", {}), "seed": seed, **({"epochs": epochs} if epochs else {})}
    doc["search"] = search
    doc["space"] = space
    doc["parallelism"] = {"mode": "experiment", "workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0}
    doc.pop("tracking", None)
    return doc


def _run_prefix(method: str) -> str:
    return f"{method.replace('+', '_')}-s"


def run_dir(root: Path, method: str, seed: int) -> Path:
    """Where the real run of ``method`` with ``seed`` is kept under ``--out``: the one place that names it."""
    return root / "runs" / f"{_run_prefix(method)}{seed}"


def finished_run(out: Path) -> bool:
    """Whether the search in ``out`` finished: ``distmis tune`` writes its summary after its results."""
    return (out / RunFile.SUMMARY).is_file()


def run_dirs(root: Path, method: str, *, finished: bool = False) -> dict[int, Path]:
    """Every run of ``method`` kept under ``root`` by seed in seed order; with ``finished``, only
    those that :func:`finished_run` (a run still going, or killed, is not)."""
    prefix = _run_prefix(method)
    return dict(
        sorted(
            (int(d.name[len(prefix) :]), d)
            for d in (root / "runs").glob(f"{prefix}*")
            if not finished or finished_run(d)
        )
    )


def run_one(
    method: str,
    seed: int,
    base: dict[str, Any],
    prepared: Path,
    root: Path,
    samples: int,
    epochs: int | None,
    task: str,
) -> Path:
    out = run_dir(root, method, seed)
    if finished_run(out):
        return out
    run_tune(search_doc(method, seed, base, str(prepared), samples, epochs, task), root, out)
    return out


# --------------------------------------------------------------------------- what one search did
def read_search(out: Path, metric: str, mode: str) -> dict[str, Any]:
    """Every epoch of every trial, as (end time, value), and each trial's interval, from the run's files."""
    rows = list(csv.DictReader(open(out / RunFile.RESULTS)))
    trials = []
    for row in rows:
        path = out / RunFile.TRIALS_DIR / row["trial_id"] / RunFile.METRICS
        epochs = list(csv.DictReader(open(path))) if path.is_file() else []
        if not row.get("started_at") or not epochs:
            continue
        trials.append(
            {
                "start": float(row["started_at"]),
                "end": float(epochs[-1]["finished_at"]),
                "epochs": [(float(e["finished_at"]), float(e[metric])) for e in epochs],
            }
        )
    t0 = min(t["start"] for t in trials)
    sign = 1.0 if mode == "max" else -1.0
    events = sorted((at - t0, sign * value) for t in trials for at, value in t["epochs"] if math.isfinite(value))
    return {
        "t0": t0,
        "events": events,
        "intervals": [(t["start"] - t0, t["end"] - t0) for t in trials],
        "wall": max(t["end"] for t in trials) - t0,
        "epochs": sum(len(t["epochs"]) for t in trials),
        "trials": len(trials),
        "sign": sign,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="quickstart", choices=sorted(TASK_FILES))
    p.add_argument(
        "--space", default=None, help="base search-space file (data, train, model, search); default: the task's"
    )
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--methods", default="grid,random,tpe,default", help=f"comma-separated, of {', '.join(ALL_METHODS)}")
    p.add_argument("--samples", type=int, default=32, help="trials of the sampling methods (the grid has 32)")
    p.add_argument("--epochs", type=int, default=None, help="train.epochs (default: the task file's)")
    p.add_argument("--target", type=float, default=None, help="target value of the search metric")
    p.add_argument(
        "--out", default=None, help="for search_efficiency.json, .md and .png (default runs/bench-search-<task>)"
    )
    a = p.parse_args()

    space_file = Path(a.space) if a.space else TASK_FILES[a.task]
    base = yaml.safe_load(space_file.read_text())
    target = a.target if a.target is not None else TARGETS[a.task]
    root = Path(a.out or REPO / "runs" / f"bench-search-{a.task}").resolve()
    root.mkdir(parents=True, exist_ok=True)
    prepared = prepare_task(a.task, base, space_file.parent, root)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    metric, mode = base["search"].get("metric", "val_dice"), base["search"].get("mode", "max")
    print(f"search efficiency: {a.task} ({space_file.name}), methods {methods}, seeds {seeds}, -> {root}", flush=True)
    outs: dict[str, dict[int, Path]] = {m: {} for m in methods}
    for seed in seeds:  # seed by seed: an interrupted benchmark still has whole seeds to compare
        for method in methods:
            outs[method][seed] = run_one(method, seed, base, prepared, root, a.samples, a.epochs, a.task)
    runs = {m: {s: read_search(o, metric, mode) for s, o in by_seed.items()} for m, by_seed in outs.items()}
    sign = 1.0 if mode == "max" else -1.0
    table = analyse(runs, target, sign, horizon_from="grid")
    text = table_text(table, metric)
    document = {
        "task": a.task,
        "space_file": str(space_file),
        "metric": metric,
        "seeds": seeds,
        **table,
        "curves": {m: {s: r["events"] for s, r in by_seed.items()} for m, by_seed in runs.items()},
    }
    title = f"search efficiency on {a.task}: best so far, median over seeds, IQR shaded"
    write_report(
        root,
        "search_efficiency",
        title=title,
        rows=[],
        data=document,
        markdown=text,
        png=lambda path: plot(runs, table, path, metric, title="Best so far: median over seeds, IQR shaded"),
    )


if __name__ == "__main__":
    main()
