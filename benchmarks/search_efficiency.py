"""Does the default search find a good model sooner than the DistMIS prototype's grid? Over seeds.

Every method searches the same prepared data with the same model, epochs and training recipe,
2 trials at a time, each as a real ``distmis tune`` process (its own local Ray), once per seed:

  grid          the prototype's 32-point grid (lr x norm x beta_2 x amsgrad), its order shuffled
                per seed, no scheduler
  random        Optuna's RandomSampler over the same space with lr log-uniform over the grid's
                range, no scheduler
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

Writes ``summary.json`` (every seed's figures and curves), ``best_so_far.png`` (median best-so-far
against time, IQR band) and prints the table. Finished runs are kept: a second call with the same
``--out`` only runs what is missing.

    python benchmarks/search_efficiency.py --seeds 5                  # quickstart data, target 0.93
    python benchmarks/search_efficiency.py --task mni152 --seeds 3    # real anatomy (needs nilearn)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
from pathlib import Path
from typing import Any

import yaml
from benchlib import REPO, TASK_FILES, fmt_stat, prepare_task, quartiles, run_tune

#: the default target of the search metric per task
TARGETS = {"quickstart": 0.93, "mni152": 0.85}
GRID_FILE = REPO / "search_spaces" / "distmis_grid.yaml"
FRACTIONS = (0.25, 0.5, 1.0)
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


def shuffled_grid(grid: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    from distmis.space import ParamSpec, grid_points

    points = grid_points({k: ParamSpec.model_validate(v) for k, v in grid.items()})
    random.Random(seed).shuffle(points)
    return points


def method_search(method: str, base: dict[str, Any], seed: int, samples: int) -> tuple[dict[str, Any], dict]:
    """(search section, space) of one method."""
    grid = grid_space()
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
    space = continuous_space(grid)
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


def run_one(
    method: str, seed: int, base: dict[str, Any], prepared: Path, root: Path, samples: int, epochs: int | None
) -> Path:
    out = root / "runs" / f"{method.replace('+', '_')}-s{seed}"
    if (out / "results.csv").is_file():
        return out
    search, space = method_search(method, base, seed, samples)
    doc = dict(base)
    doc["name"] = f"bench-{method.replace('+', '_')}-s{seed}"
    doc["data"] = {**base.get("data", {}), "source": str(prepared)}
    doc["train"] = {**base.get("train", {}), "seed": seed, **({"epochs": epochs} if epochs else {})}
    doc["search"] = search
    doc["space"] = space
    doc["parallelism"] = {"mode": "experiment", "workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0}
    doc.pop("tracking", None)
    run_tune(doc, root, out)
    return out


# --------------------------------------------------------------------------- what one search did
def read_search(out: Path, metric: str, mode: str) -> dict[str, Any]:
    """Every epoch of every trial, as (end time, value), and each trial's interval, from the run's files."""
    rows = list(csv.DictReader(open(out / "results.csv")))
    trials = []
    for row in rows:
        path = out / "trials" / row["trial_id"] / "metrics.csv"
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


def best_so_far(events: list[tuple[float, float]], at: float) -> float:
    best = -math.inf
    for t, v in events:
        if t > at:
            break
        best = max(best, v)
    return best


def time_to(events: list[tuple[float, float]], target: float) -> float:
    return next((t for t, v in events if v >= target), math.inf)


def compute_until(intervals: list[tuple[float, float]], at: float) -> float:
    return sum(max(0.0, min(end, at) - start) for start, end in intervals if start < at)


def auc(events: list[tuple[float, float]], horizon: float, floor: float) -> float:
    """Mean of the best-so-far curve over [0, horizon] (``floor`` before the first result)."""
    area, last_t, best = 0.0, 0.0, floor
    for t, v in events:
        if t > horizon:
            break
        area += (t - last_t) * best
        last_t, best = t, max(best, v)
    area += (horizon - last_t) * best
    return area / horizon


def analyse(runs: dict[str, dict[int, dict]], target: float, sign: float) -> dict[str, Any]:
    grid_walls = [r["wall"] for r in runs.get("grid", {}).values()]
    horizon = quartiles(grid_walls)[0] if grid_walls else max(r["wall"] for m in runs.values() for r in m.values())
    signed_target = sign * target
    floor = min(v for m in runs.values() for r in m.values() for _, v in r["events"][:1])
    table: dict[str, Any] = {"horizon_seconds": horizon, "target": target, "methods": {}}
    for method, seeds in runs.items():
        per_seed = {}
        for seed, r in seeds.items():
            ttt = time_to(r["events"], signed_target)
            per_seed[seed] = {
                "time_to_target": ttt,
                "compute_to_target": compute_until(r["intervals"], ttt) if math.isfinite(ttt) else math.inf,
                **{f"best_at_{int(f * 100)}": sign * best_so_far(r["events"], f * horizon) for f in FRACTIONS},
                "auc": sign * auc(r["events"], horizon, floor),
                "best": sign * max(v for _, v in r["events"]),
                "epochs": r["epochs"],
                "trials": r["trials"],
                "wall": r["wall"],
                "reached": math.isfinite(ttt),
            }
        summary = {}
        for key in next(iter(per_seed.values())):
            if key == "reached":
                summary[key] = sum(s[key] for s in per_seed.values())
                continue
            med, lo, hi = quartiles([s[key] for s in per_seed.values()])
            summary[key] = {"median": med, "q1": lo, "q3": hi}
        table["methods"][method] = {"seeds": per_seed, "summary": summary}
    return table


def _fmt(stat: dict[str, float], digits: int) -> str:
    return fmt_stat(stat["median"], stat["q1"], stat["q3"], digits)


def print_table(table: dict[str, Any], metric: str) -> str:
    h = table["horizon_seconds"]
    lines = [
        f"target {metric} {table['target']}; horizon = the grid's median wall time {h:.1f} s; "
        "median [IQR] over seeds; times from the first trial's start",
        "",
        "| method | reached | time to target (s) | compute to target (trial-s) | best @25% | best @50% | best @100% "
        "| AUC | epochs | trials | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    n = max(len(m["seeds"]) for m in table["methods"].values())
    for method, m in table["methods"].items():
        s = m["summary"]
        lines.append(
            f"| {method} | {s['reached']}/{len(m['seeds'])} | {_fmt(s['time_to_target'], 1)} | "
            f"{_fmt(s['compute_to_target'], 0)} | {_fmt(s['best_at_25'], 4)} | {_fmt(s['best_at_50'], 4)} | "
            f"{_fmt(s['best_at_100'], 4)} | {_fmt(s['auc'], 4)} | {_fmt(s['epochs'], 0)} | {_fmt(s['trials'], 0)} | "
            f"{_fmt(s['wall'], 1)} |"
        )
    methods = table["methods"]
    if "default" in methods:
        d = methods["default"]["summary"]["time_to_target"]["median"]
        lines.append("")
        for other in ("grid", "random"):
            if other in methods:
                o = methods[other]["summary"]["time_to_target"]["median"]
                ratio = d / o if o and math.isfinite(o) else math.nan
                lines.append(f"default / {other}: median time to target {d:.1f} / {o:.1f} s = {ratio:.2f}")
        if "grid" in methods:
            lines.append(
                f"median best at the grid's full wall time: default {methods['default']['summary']['best_at_100']['median']:.4f}, "
                f"grid {methods['grid']['summary']['best_at_100']['median']:.4f}"
            )
    del n
    text = "\n".join(lines)
    print(text)
    return text


def plot(runs: dict[str, dict[int, dict]], table: dict[str, Any], path: Path, metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    longest = max(r["wall"] for m in runs.values() for r in m.values())
    ts = np.linspace(0, longest, 300)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for method, seeds in runs.items():
        curves = []
        for r in seeds.values():
            sign = r["sign"]
            curves.append([sign * best_so_far(r["events"], t) if t <= r["wall"] else np.nan for t in ts])
        arr = np.array(curves, dtype=float)
        arr[~np.isfinite(arr)] = np.nan
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                med = np.nanmedian(arr, axis=0)
                lo, hi = np.nanpercentile(arr, 25, axis=0), np.nanpercentile(arr, 75, axis=0)
        (line,) = ax.plot(ts, med, label=f"{method} ({len(seeds)} seeds)")
        ax.fill_between(ts, lo, hi, color=line.get_color(), alpha=0.15)
    ax.axhline(table["target"], color="grey", ls="--", lw=1, label=f"target {table['target']}")
    ax.axvline(table["horizon_seconds"], color="grey", ls=":", lw=1, label="grid's median wall time")
    ax.set(
        xlabel="seconds since the first trial started",
        ylabel=f"best {metric} so far",
        title="Best so far: median over seeds, IQR shaded",
    )
    lows = [v for m in table["methods"].values() for s in m["seeds"].values() for v in [s["best_at_25"]]]
    finite = [v for v in lows if math.isfinite(v)]
    if finite:
        ax.set_ylim(max(0.0, min(finite) - 0.05), min(1.0, max(table["target"] + 0.03, ax.get_ylim()[1])))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": "distmis benchmarks/search_efficiency.py"})
    plt.close(fig)


def _finite(value: Any) -> Any:
    """JSON has no infinity: a target never reached is written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


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
    p.add_argument("--out", default=None, help="default runs/bench-search-<task>")
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
            outs[method][seed] = run_one(method, seed, base, prepared, root, a.samples, a.epochs)
    runs = {m: {s: read_search(o, metric, mode) for s, o in by_seed.items()} for m, by_seed in outs.items()}
    sign = 1.0 if mode == "max" else -1.0
    table = analyse(runs, target, sign)
    text = print_table(table, metric)
    plot(runs, table, root / "best_so_far.png", metric)
    (root / "summary.md").write_text(text + "\n")
    document = {
        "task": a.task,
        "space_file": str(space_file),
        "metric": metric,
        "seeds": seeds,
        **table,
        "curves": {m: {s: r["events"] for s, r in by_seed.items()} for m, by_seed in runs.items()},
    }
    (root / "summary.json").write_text(json.dumps(_finite(document), indent=1))
    print(f"\n{root / 'summary.json'}, {root / 'best_so_far.png'}")


if __name__ == "__main__":
    main()
