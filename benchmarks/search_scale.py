"""Which searcher and scheduler at which scale: simulated searches on the shipped curves, K workers, over seeds.

Every method is a search file over the table's space (``record_curves.py``'s anatomy32 space, 16
epochs) run by ``distmis simulate``'s engine, that is by the searcher and scheduler ``distmis tune``
builds. For each number of workers K and budget of trials, per method, as median [IQR] over seeds:

  time to R       virtual seconds until the best so far reaches random search's final best R (the
                  median over seeds of random's final best at that K and budget)
  best @25/50/100 the best value at 25, 50 and 100 % of random's median wall time
  compute         trial-seconds spent by the whole search (what a cluster bills)

Methods:
  grid            a 32-point grid: lr x norm x filters x loss, the rest at the task's defaults
  random          Optuna's RandomSampler, no scheduler;   random+asha: with ASHA (grace 1, factor 2)
  tpe             Optuna 5 TPE, multivariate, grouped, constant liar (distmis's), no scheduler
  tpe+asha        TPE with ASHA (grace 1, factor 2): distmis's default
  tpe+hyperband   TPE with asynchronous Hyperband (ASHA over 3 brackets)
  tpe+asha-s10    TPE + ASHA with 10 random start-up trials whatever K (the default starts with 2 x K)
  tpe+asha-quarter  TPE + ASHA with 2 x K random start-up trials, but at least 10 and at most a quarter
                  of the budget
  gp              Optuna 5's GPSampler (it conditions on the running trials), no scheduler; needs PyTorch
  gp+asha         the same with ASHA: GP models only trials that trained every epoch
  cmaes           Optuna's CMA-ES, no scheduler: it moves lr, dropout and foreground oversampling, the
                  six categorical parameters are drawn at random; needs the cmaes package
  default         what a search file with distmis's defaults runs at that K and budget (TPE + ASHA,
                  or random + ASHA at 16 or more trials at once for 8 rounds or fewer)

The TPE, GP and CMA-ES methods keep the start-up at max(2 x K, min(10, budget/4)) random trials, the rule the
study measured; ``default`` follows distmis's current rule.

    python benchmarks/search_scale.py --seeds 10        # K x budget: 1x64 4x64 8x64 8x128 32x128 32x256 128x256
    python benchmarks/search_scale.py --speed        # one 128-trial search on 32 workers, timed
    python benchmarks/search_scale.py --speedup      # grid and default search, 1 worker against 32
    python benchmarks/search_scale.py --grid-efficiency  # what the grid's efficiency at 32 workers depends on
    python benchmarks/search_scale.py --ceiling      # how much sooner than random any searcher can reach R
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import yaml
from benchlib import REPO, TASK_FILES, write_report
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from record_curves import ANATOMY32_SPACE
from search_efficiency import search_doc

from distmis.config import ExperimentConfig
from distmis.files import write_text_atomic
from distmis.schema import RunFile
from distmis.simulate import Curve, CurveTable, SearchRun, StartupCosts, analyse, read_table, simulate_search
from distmis.simulate.study import (
    DRIVER_SECONDS_PER_RESULT,
    DRIVER_SECONDS_PER_TRIAL,
    LeaveOneOut,
    NearestCurves,
    architecture,
    finite_json,
    fmt_stat,
    plot,
    quartiles,
    time_to,
    typed_for,
)

CURVES = REPO / "benchmarks" / "curves" / "anatomy32.csv.gz"
SCENARIOS = "1x64,4x64,8x64,8x128,32x128,32x256,128x256"
CEILING = "32x128,32x256"
QUICKSTART_CURVES = REPO / "benchmarks" / "curves" / "quickstart.csv.gz"
EPOCHS = 16
ASHA = {"type": "asha", "grace_period": 1, "reduction_factor": 2}
GRID_SPACE: dict[str, Any] = {
    "lr": {"choice": [5.0e-4, 2.0e-3, 8.0e-3, 3.0e-2]},
    "norm": {"choice": ["batch", "group"]},
    "filters": {"choice": [8, 16]},
    "loss": {"choice": ["dice", "dice_ce"]},
    "depth": {"choice": [3]},
    "batch_size_per_replica": {"choice": [2]},
    "dropout": {"choice": [0.0]},
    "lr_schedule": {"choice": ["constant"]},
    "foreground_oversampling": {"choice": [0.33]},
}
METHODS: dict[str, dict[str, Any]] = {
    "grid": {"algorithm": "grid", "scheduler": {"type": "none"}},
    "random": {"algorithm": "random", "scheduler": {"type": "none"}},
    "random+asha": {"algorithm": "random", "scheduler": ASHA},
    "tpe": {"algorithm": "optuna", "scheduler": {"type": "none"}},
    "tpe+asha": {"algorithm": "optuna", "scheduler": ASHA},
    "tpe+hyperband": {"algorithm": "optuna", "scheduler": {**ASHA, "brackets": 3}},
    "tpe+asha-s10": {"algorithm": "optuna", "scheduler": ASHA, "startup_trials": 10},
    "tpe+asha-quarter": {"algorithm": "optuna", "scheduler": ASHA},  # start-up trials set per scale below
    "gp": {"algorithm": "gp", "scheduler": {"type": "none"}},
    "gp+asha": {"algorithm": "gp", "scheduler": ASHA},
    "cmaes": {"algorithm": "cmaes", "scheduler": {"type": "none"}},
    "default": {"algorithm": "optuna"},  # distmis's defaults at this scale, whatever they are
}
#: TPE's start-up as the study measured it, 2 x K (before the defaults followed the scale)
TWICE_K = ("tpe", "tpe+asha", "tpe+hyperband", "gp", "gp+asha", "cmaes")


def method_config(
    method: str, *, budget: int, workers: int, seed: int, points: list[dict[str, Any]] | None = None
) -> ExperimentConfig:
    """``method``'s search file; ``points`` are tried first (or, for ``points``, are the whole search)."""
    search = dict(METHODS[method]) if method != "points" else {"algorithm": "points", "scheduler": {"type": "none"}}
    if points is not None:
        search["points"] = points
    if method == "tpe+asha-quarter":
        search["startup_trials"] = max(1, min(max(2 * workers, 10), budget // 4))
    if method in TWICE_K:
        search["startup_trials"] = max(2 * workers, min(10, budget // 4))
    doc = {
        "name": f"scale-{method.replace('+', '_')}",
        "data": {"source": "synthetic"},
        "train": {"epochs": EPOCHS},
        "search": {
            **search,
            "metric": "val_dice",
            "mode": "max",
            "num_samples": budget,
            "max_concurrent_trials": workers,
            "seed": seed,
        },
        "space": GRID_SPACE if method == "grid" else ANATOMY32_SPACE,
    }
    return ExperimentConfig.model_validate(doc)


class Curves:
    """The shipped table, typed once per space (the grid's and the sampled one's)."""

    def __init__(self, path: Path, driver: tuple[float, float]) -> None:
        self.table = read_table(path)
        self.driver = driver
        self._cache: dict[str, tuple[NearestCurves, StartupCosts]] = {}
        self.loo: dict[str, LeaveOneOut] = {}

    def for_config(self, config: ExperimentConfig) -> tuple[NearestCurves, StartupCosts]:
        key = json.dumps({k: v.model_dump() for k, v in config.space.items()}, sort_keys=True)
        if key not in self._cache:
            typed = typed_for(self.table, config.space, metric="val_dice", epochs=EPOCHS)
            surrogate = NearestCurves(typed, config.space, metric="val_dice", mode="max")
            self.loo[config.name] = surrogate.choose_weights()
            self._cache[key] = (surrogate, costs_of(typed, self.driver))
        return self._cache[key]


def costs_of(typed: CurveTable, driver: tuple[float, float]) -> StartupCosts:
    """The recorded start-ups, and the Tune driver's own work per result and per trial."""
    return StartupCosts.of_curves(typed.curves, driver_per_result=driver[0], driver_per_trial=driver[1])


def one(curves: Curves, method: str, *, workers: int, budget: int, seed: int) -> SearchRun:
    config = method_config(method, budget=budget, workers=workers, seed=seed)
    surrogate, costs = curves.for_config(config)
    return simulate_search(config, surrogate, workers=workers, costs=costs, seed=seed)


def speed(curves: Curves) -> None:
    """The must-show figure: one 128-trial default search on 32 workers, wall and virtual time."""
    for method in ("random", "tpe+asha", "tpe"):
        start = time.perf_counter()
        run = one(curves, method, workers=32, budget=128, seed=0)
        took = time.perf_counter() - start
        print(
            f"{method}: 128 trials on 32 workers simulated in {took:.1f} s (decisions {run.decision_seconds:.1f} s), "
            f"covering {run.wall:.0f} virtual seconds ({run.wall / 3600:.2f} h), {run.epochs} epochs",
            flush=True,
        )


def method_file(method: str, budget: int) -> Callable[[int, int], ExperimentConfig]:
    """``method``'s search file with ``budget`` trials, as a function of (seed, workers)."""
    return lambda seed, workers: method_config(method, budget=budget, workers=workers, seed=seed)


def one_and_32(
    config_of: Callable[[int, int], ExperimentConfig], surrogate: NearestCurves, costs: StartupCosts, seeds: int
) -> dict[int, list[dict[str, Any]]]:
    """The same search on 1 worker and on 32, over seeds: each run's ``as_dict`` per worker count.
    ``config_of(seed, workers)`` gives the search file."""
    return {
        k: [simulate_search(config_of(s, k), surrogate, workers=k, costs=costs, seed=s).as_dict() for s in range(seeds)]
        for k in (1, 32)
    }


def speedup(curves: Curves, seeds: int) -> str:
    """Experiment parallelism at 32 workers: the 32-point grid and a 128-trial default search, 1 worker against 32.

    Speed-up is the median wall time on 1 worker over the median on 32, of the trials alone and
    end to end (the search's fixed cost before its first trial, as recorded, added to both);
    efficiency is the end-to-end speed-up over 32. A search whose scheduler stops more trials at
    32 workers does less work there, so "workers busy" (trial-seconds over 32 x wall) says how
    much of the 32 workers the search used. The simulation charges each slot its measured cold
    start and each trial its measured start-up.
    """
    lines = [
        "| search | wall, 1 worker (s) | wall, 32 workers (s) | speed-up, trials | speed-up, end to end | efficiency "
        "| compute, 1 / 32 (trial-s) | workers busy at 32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, method, budget in (("32-point grid", "grid", 32), ("128-trial default search", "default", 128)):
        surrogate, costs = curves.for_config(method_config(method, budget=budget, workers=1, seed=0))
        fixed = costs.search
        runs = one_and_32(method_file(method, budget), surrogate, costs, seeds)
        walls = {k: quartiles([r["wall"] for r in runs[k]])[0] for k in runs}
        computes = {k: quartiles([sum(b - a for a, b in r["intervals"]) for r in runs[k]])[0] for k in runs}
        end_to_end = (fixed + walls[1]) / (fixed + walls[32])
        lines.append(
            f"| {label} | {walls[1]:.0f} | {walls[32]:.0f} | x{walls[1] / walls[32]:.1f} | x{end_to_end:.1f} | "
            f"{end_to_end / 32:.0%} | {computes[1]:.0f} / {computes[32]:.0f} | {computes[32] / (walls[32] * 32):.0%} |"
        )
    lines.append(f"(fixed cost before the first trial, as recorded: {fixed:.1f} s)")
    return "\n".join(lines)


def retimed(table: CurveTable, *, length: float, by_architecture: bool) -> CurveTable:
    """The table with every epoch's seconds x ``length``, and with ``by_architecture`` each epoch's
    seconds the median of its architecture's curves at that epoch.

    The median takes out what the recording machine added (two trials sharing 2 cores, a clock
    that drifted) and keeps what the configuration costs (filters, depth, batch size, normalisation).
    """
    epochs: dict[tuple[str, ...], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in table.curves:
        for i, s in enumerate(c.epoch_seconds):
            epochs[architecture(c)][i].append(s)

    def seconds(c: Curve) -> list[float]:
        own = (
            [statistics.median(epochs[architecture(c)][i]) for i in range(c.epochs)]
            if by_architecture
            else c.epoch_seconds
        )
        return [s * length for s in own]

    return dataclasses.replace(table, curves=[dataclasses.replace(c, epoch_seconds=seconds(c)) for c in table.curves])


@functools.cache
def _quickstart_file() -> dict[str, Any]:
    return yaml.safe_load(TASK_FILES["quickstart"].read_text())


def _prototype_grid(seed: int, workers: int) -> ExperimentConfig:
    """The DistMIS prototype's 32-point grid on the quickstart task, as search_efficiency.py runs it."""
    doc = search_doc("grid", seed, _quickstart_file(), "synthetic", 32, None, "quickstart")
    doc["search"]["max_concurrent_trials"] = workers
    return ExperimentConfig.model_validate(doc)


def grid_efficiency(seeds: int, driver: tuple[float, float]) -> str:
    """A 32-point grid on 32 workers: its efficiency against the trials' length and their spread.

    With one trial per worker, the grid's wall time is its slowest trial's plus the start-up, so its
    efficiency is bounded by how long the trials are against the fixed costs (a search's 4-5 s
    before its first trial, a slot's cold start) and by how much the slowest trial exceeds the
    mean. Both grids are replayed with their epochs as recorded and with each epoch the median of
    its architecture, at the recorded length and with every epoch 10 and 100 times as long (a
    larger volume or more steps per epoch); start-up and fixed costs stay as recorded here.
    """
    grids: list[tuple[str, Path, Callable[[int, int], ExperimentConfig]]] = [
        ("the prototype's (lr, norm, beta_2, amsgrad; quickstart table)", QUICKSTART_CURVES, _prototype_grid),
        (
            "lr x norm x filters x loss (anatomy32 table)",
            CURVES,
            method_file("grid", 32),
        ),
    ]
    lines = [
        "| grid | epochs | epoch seconds | trial, median / slowest (s) | wall, 1 worker (s) | wall, 32 workers (s) "
        "| speed-up, end to end | efficiency | workers busy at 32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, path, config_of in grids:
        first = config_of(0, 1)
        typed = typed_for(read_table(path), first.space, metric=first.search.metric, epochs=first.train.epochs)
        costs = costs_of(typed, driver)
        fitted = NearestCurves(typed, first.space, metric=first.search.metric, mode=first.search.mode)
        fitted.choose_weights()
        for by_architecture in (False, True):
            for length in (1, 10, 100):
                table = retimed(typed, length=length, by_architecture=by_architecture)
                surrogate = NearestCurves(table, first.space, metric=first.search.metric, mode=first.search.mode)
                # retiming leaves every value as recorded, so the weights fitted on them hold for each variant
                surrogate.neighbours, surrogate.weights = fitted.neighbours, fitted.weights
                runs = one_and_32(config_of, surrogate, costs, seeds)
                walls = {k: quartiles([r["wall"] for r in runs[k]])[0] for k in runs}
                spent = [[b - a for a, b in r["intervals"]] for r in runs[32]]
                busy = [sum(t) / (32 * r["wall"]) for t, r in zip(spent, runs[32], strict=True)]
                trials = [(statistics.median(t), max(t)) for t in spent]
                end_to_end = (costs.search + walls[1]) / (costs.search + walls[32])
                lines.append(
                    f"| {label} | x{length} | {'architecture median' if by_architecture else 'as recorded'} | "
                    f"{statistics.median(t[0] for t in trials):.0f} / {statistics.median(t[1] for t in trials):.0f} | "
                    f"{walls[1]:.0f} | {walls[32]:.0f} | x{end_to_end:.1f} | {end_to_end / 32:.0%} | "
                    f"{statistics.median(busy):.0%} |"
                )
                print(lines[-1], flush=True)
        lines.append(
            f"({label}: {len(typed.curves)} curves; start-up as recorded: search {costs.search:.1f} s, slot "
            f"{costs.slot:.1f} s, a trial's cold {costs.cold:.1f} s and warm {costs.warm:.1f} s)"
        )
    return "\n".join(lines)


def _time_to(curve: Curve, target: float) -> float:
    """Seconds of ``curve``'s epochs until it first reports ``target`` or more (inf: never)."""
    return time_to(list(zip(itertools.accumulate(curve.epoch_seconds), curve.values["val_dice"], strict=True)), target)


def random_final_best(runs: dict[str, dict[int, dict]]) -> float:
    """R: the median over seeds of random search's final best, the target every method is timed to."""
    return quartiles([max(v for _, v in r["events"]) for r in runs["random"].values()])[0]


def scenario_pairs(text: str) -> list[tuple[int, int]]:
    """``"32x128,8x64"`` as (workers, trials) pairs."""
    return [(int(w), int(n)) for w, n in (pair.lower().split("x") for pair in text.split(","))]


def fastest_first(curves: Curves, target: float, workers: int) -> list[dict[str, Any]]:
    """The ``workers`` recorded configurations that reach ``target`` soonest, surest first.

    A configuration's curves over its training seeds are ranked by how many of them never reach the
    target, then by their mean time to it: the surrogate replays one of its seeds at random.
    """
    config = method_config("random", budget=1, workers=workers, seed=0)
    surrogate, _ = curves.for_config(config)
    ranked = []
    for options in surrogate.curves:
        times = [_time_to(c, target) for c in options]
        reached = [t for t in times if math.isfinite(t)]
        ranked.append((len(times) - len(reached), statistics.mean(reached) if reached else math.inf, options[0].params))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [dict(params) for _, _, params in ranked[:workers]]


def paired_speedups(runs: dict[str, dict[int, dict]]) -> dict[str, list[float]]:
    """Per method and seed: the time random search of that seed took to its own final best, over
    the time the method of that seed took to the same value (0 where it never got there).

    Random's median final best R sits where half of random's seeds end below it, so with an even
    number of seeds its median time to R can be "never" by a single seed; this ratio asks the same
    question of every seed and has no such edge.
    """
    speedups: dict[str, list[float]] = {m: [] for m in runs}
    for seed, r in runs["random"].items():
        final = max(v for _, v in r["events"])
        own = time_to(r["events"], final)
        for method, seeds in runs.items():
            theirs = time_to(seeds[seed]["events"], final)
            speedups[method].append(own / theirs if math.isfinite(theirs) else 0.0)
    return speedups


#: the two ways an earlier search of the same size (another seed) can start a new one
WARM = ("earlier best first", "earlier trials to TPE")


def warm_starts(curves: Curves, *, workers: int, budget: int, seed: int) -> dict[str, SearchRun]:
    """The default search started from an earlier default search of the same size (seed + 1000).

    earlier best first     ``search.points`` holds the earlier search's best configuration: what a
                           user can do today
    earlier trials to TPE  the new study starts with every finished trial of the earlier one
                           (``optuna.copy_study``), so TPE models them from its first proposal: with
                           that many trials its random start-up is already over
    """
    config = method_config("default", budget=budget, workers=workers, seed=seed)
    surrogate, costs = curves.for_config(config)
    with tempfile.TemporaryDirectory(prefix="distmis-warm-") as tmp:
        before, after = Path(tmp) / "earlier", Path(tmp) / "new"
        before.mkdir()
        after.mkdir()
        earlier_config = method_config("default", budget=budget, workers=workers, seed=seed + 1000)
        earlier = simulate_search(
            earlier_config, surrogate, workers=workers, costs=costs, seed=seed + 1000, work=before
        )
        best_first = method_config("default", budget=budget, workers=workers, seed=seed, points=[earlier.best_params])
        optuna.copy_study(
            from_study_name=earlier_config.name,
            from_storage=JournalStorage(JournalFileBackend(str(before / RunFile.JOURNAL))),
            to_storage=JournalStorage(JournalFileBackend(str(after / RunFile.JOURNAL))),
            to_study_name=config.name,
        )
        return {
            WARM[0]: simulate_search(best_first, surrogate, workers=workers, costs=costs, seed=seed),
            WARM[1]: simulate_search(config, surrogate, workers=workers, costs=costs, seed=seed, work=after),
        }


def ceiling(curves: Curves, scenarios: list[tuple[int, int]], seeds: int, out: Path) -> str:
    """How much sooner than random search any searcher can reach R at K workers, and what gets closer.

    At K workers and N trials there are N / K rounds. Random search reaches its own median final
    best R at some round; a searcher can only beat it by putting an R-reaching configuration into an
    earlier round, and the first round is sampled before anything is known. Per scenario, over seeds:

      random, default   as in the study (R is random's median final best over these seeds)
      earlier ...       the default search started from an earlier one of the same size (another
                        seed): its best configuration first, or all its trials given to TPE
                        (:func:`warm_starts`)
      best first round  the K recorded configurations that reach R soonest, all in the first round
                        (``algorithm: points``): no searcher that starts with the same start-up can
                        reach R sooner with the table's recorded configurations, so random's time
                        over it bounds the speed-up (the surrogate's moved curve for a configuration
                        the table does not hold is not bounded by it)
    """
    lines = [
        "| K workers, trials | rounds | R | method | reached R | time to R (s) | random's / method's median "
        "| paired: random's time to its own final best / method's, same seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    results: dict[str, Any] = {}
    for workers, budget in scenarios:
        runs: dict[str, dict[int, dict]] = {m: {} for m in ("random", "default", *WARM, "best first round")}
        for seed in range(seeds):
            runs["random"][seed] = one(curves, "random", workers=workers, budget=budget, seed=seed).as_dict()
            runs["default"][seed] = one(curves, "default", workers=workers, budget=budget, seed=seed).as_dict()
        target = random_final_best(runs)
        first = fastest_first(curves, target, workers)
        for seed in range(seeds):
            for name, run in warm_starts(curves, workers=workers, budget=budget, seed=seed).items():
                runs[name][seed] = run.as_dict()
            oracle = method_config("points", budget=workers, workers=workers, seed=seed, points=first)
            surrogate, costs = curves.for_config(oracle)
            runs["best first round"][seed] = simulate_search(
                oracle, surrogate, workers=workers, costs=costs, seed=seed
            ).as_dict()
            print(f"  K={workers} budget={budget}: seed {seed + 1} of {seeds}", flush=True)
        table = analyse(runs, target, 1.0, horizon_from="random")
        table["paired"] = paired_speedups(runs)
        results[f"K{workers}-N{budget}"] = {"table": table, "best_first_round": first}
        random_median = table["methods"]["random"]["summary"]["time_to_target"]["median"]
        for method, m in table["methods"].items():
            s = m["summary"]
            t = s["time_to_target"]
            ratio = random_median / t["median"] if math.isfinite(t["median"]) else 0.0
            lines.append(
                f"| {workers}, {budget} | {budget / workers:g} | {target:.4f} | {method} | {s['reached']}/{seeds} | "
                f"{fmt_stat(t['median'], t['q1'], t['q3'], 0)} | "
                f"{f'x{ratio:.2f}' if math.isfinite(random_median) else 'random: never'} | "
                f"x{fmt_stat(*quartiles(table['paired'][method]), 2)} |"
            )
        print("\n".join(lines[-len(runs) :]), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "ceiling.json", json.dumps(finite_json(results), indent=1) + "\n")
        plot(
            runs,
            table,
            out / f"ceiling-K{workers}-N{budget}.png",
            "val_dice",
            title=f"{budget} trials on {workers} workers, {seeds} seeds: best so far, median and IQR",
        )
    return "\n".join(lines)


def scenario(curves: Curves, methods: list[str], *, workers: int, budget: int, seeds: int) -> dict[str, Any]:
    runs: dict[str, dict[int, dict]] = {}
    for method in methods:
        runs[method] = {}
        for seed in range(seeds):
            runs[method][seed] = one(curves, method, workers=workers, budget=budget, seed=seed).as_dict()
        print(f"  K={workers} budget={budget} {method}: {seeds} seeds", flush=True)
    return analyse(runs, random_final_best(runs), 1.0, horizon_from="random")


def _row(method: str, m: dict[str, Any]) -> str:
    s = m["summary"]

    def f(key: str, digits: int) -> str:
        return fmt_stat(s[key]["median"], s[key]["q1"], s[key]["q3"], digits)

    return (
        f"| {method} | {s['reached']}/{len(m['seeds'])} | {f('time_to_target', 0)} | {f('best_at_25', 4)} | "
        f"{f('best_at_50', 4)} | {f('best_at_100', 4)} | {f('compute', 0)} | {f('epochs', 0)} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--curves", default=str(CURVES))
    p.add_argument(
        "--scenarios",
        help=f"K x budget pairs: workers and trials per search (the study: {SCENARIOS}; --ceiling: {CEILING})",
    )
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--speed", action="store_true", help="only time one 128-trial search on 32 workers")
    p.add_argument("--speedup", action="store_true", help="only the 1-against-32-workers speed-up")
    p.add_argument(
        "--grid-efficiency", action="store_true", help="only the grid's efficiency at 32 workers against trial length"
    )
    p.add_argument(
        "--ceiling",
        action="store_true",
        help="only how much sooner than random any searcher can reach R",
    )
    p.add_argument(
        "--driver-seconds",
        nargs=2,
        type=float,
        default=[DRIVER_SECONDS_PER_RESULT, DRIVER_SECONDS_PER_TRIAL],
        metavar=("PER_RESULT", "PER_TRIAL"),
        help="the Tune driver's own work per result and per trial (default: distmis simulate's; 0 0 leaves it out)",
    )
    p.add_argument("--out", default=str(REPO / "runs" / "bench-search-scale"))
    a = p.parse_args()
    driver = (a.driver_seconds[0], a.driver_seconds[1])

    if a.grid_efficiency:
        print(grid_efficiency(a.seeds, driver))
        return
    curves = Curves(Path(a.curves), driver)
    if a.speed:
        speed(curves)
        return
    if a.speedup:
        print(speedup(curves, a.seeds))
        return
    if a.ceiling:
        print(ceiling(curves, scenario_pairs(a.scenarios or CEILING), a.seeds, Path(a.out)))
        return
    out = Path(a.out)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    if "random" not in methods:
        raise SystemExit("--methods must include random: its final best is the target")
    results: dict[str, Any] = {}
    lines = [
        f"simulated on {a.curves}; {a.seeds} seeds; median [IQR]; target R = random's median final best at that "
        "K and budget; fractions of random's median wall time",
    ]
    for workers, budget in scenario_pairs(a.scenarios or SCENARIOS):
        start = time.perf_counter()
        table = scenario(curves, methods, workers=workers, budget=budget, seeds=a.seeds)
        results[f"K{workers}-N{budget}"] = table
        lines += [
            "",
            f"K = {workers} workers, {budget} trials: R = {table['target']:.4f}, random's wall "
            f"{table['horizon_seconds']:.0f} s (simulated in {time.perf_counter() - start:.0f} s)",
            "",
            "| method | reached R | time to R (s) | best @25% | best @50% | best @100% | compute (trial-s) | epochs |",
            "|---|---|---|---|---|---|---|---|",
            *(_row(m, table["methods"][m]) for m in methods),
        ]
        print("\n".join(lines[-(len(methods) + 4) :]), flush=True)
    title, *table = lines

    def draw(fig: Any) -> None:
        axes = fig.add_subplot()
        for i, method in enumerate(methods):
            points = [
                (key, scenario_table["methods"][method]["summary"]["time_to_target"]["median"])
                for key, scenario_table in results.items()
            ]
            medians = [v if math.isfinite(v) else math.nan for _, v in points]
            axes.plot([k for k, _ in points], medians, marker="o", color=f"C{i}", label=method)
        axes.set_ylabel("median time to R, simulated seconds (gaps: never)")
        axes.tick_params(axis="x", labelrotation=45)
        axes.legend(fontsize=7)

    write_report(out, "search_scale", title=title, rows=[], data=results, markdown="\n".join(table).strip(), figure=draw,
                 echo=False)  # fmt: skip
    write_text_atomic(out / "methods.yaml", yaml.safe_dump({"methods": METHODS, "grid_space": GRID_SPACE}))


if __name__ == "__main__":
    main()
