"""Does the simulator reproduce real searches? Real ``search_efficiency.py`` runs beside their simulation.

The real runs are those ``benchmarks/search_efficiency.py`` left in its ``--out`` (2 trials at a
time, one ``distmis tune`` per method and seed). The simulation replays the very search documents
those runs were given (same sampler seeds, same grid order; ``search_doc``), on 2 workers, over
curves recorded on the same task by ``record_curves.py``, for ``--sim-seeds`` seeds. Both are read
by the same analysis (``distmis.simulate.analyse``) with the same target and horizon (the real
grid's median wall time), so the figures compare one to one.

Agreement asked of the simulator: median time to target within +-25 % of the real one for each
method, and the methods in the same order. Where about half the seeds never reach the target, the
median is "never" on one side and a time on the other by chance; how often each side reaches it is
then compared instead (``reach_p``).

    python benchmarks/search_efficiency.py --task quickstart --seeds 3 --methods grid,random,default
    python benchmarks/record_curves.py --task quickstart --table benchmarks/curves/quickstart.csv.gz
    python benchmarks/simulator_fidelity.py --task quickstart --curves benchmarks/curves/quickstart.csv.gz

    # the anatomy task: its grid's points are not in the table (the surrogate answers them) ...
    python benchmarks/search_efficiency.py --task anatomy32 --seeds 3 --samples 24 --methods grid,random,default
    python benchmarks/simulator_fidelity.py --task anatomy32 --samples 24 --curves benchmarks/curves/anatomy32.csv.gz
    # the engine alone: each real run (that trained every trial to the end) replayed on its own curves and seconds
    python benchmarks/simulator_fidelity.py --task anatomy32 --samples 24 --own-curves \
        --curves benchmarks/curves/anatomy32.csv.gz benchmarks/curves/anatomy32-grid.csv.gz
    # ... and with the real grid runs' own curves added (the engine's timing without the surrogate's error)
    python benchmarks/simulator_fidelity.py --task anatomy32 --samples 24 --name fidelity-with-grid-curves \
        --curves benchmarks/curves/anatomy32.csv.gz runs/bench-search-anatomy32/runs/grid-s*
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from benchlib import REPO, TASK_FILES, write_report
from scipy.stats import binomtest
from search_efficiency import TARGETS, read_search, run_dir, run_dirs, search_doc

from distmis.config import ExperimentConfig
from distmis.simulate import CurveError, CurveTable, StartupCosts, analyse, read_curves, simulate_search
from distmis.simulate.study import NearestCurves, fmt_stat, on_clock, read_tables, time_to, typed_for

METHODS = ("grid", "random", "default")


def real_runs(root: Path, methods: list[str], metric: str, mode: str) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for method in methods:
        runs[method] = {seed: read_search(d, metric, mode) for seed, d in run_dirs(root, method, finished=True).items()}
        if not runs[method]:
            raise SystemExit(f"{root}: no finished real run of {method}; run search_efficiency.py first")
    return runs


def simulated_runs(
    base: dict[str, Any], table: CurveTable, methods: list[str], seeds: int, samples: int, task: str
) -> tuple[dict[str, dict[int, dict]], dict[str, Any], dict[str, NearestCurves]]:
    """Every method's simulated runs, its notes, and its fitted surrogate (for :func:`surrogate_on_real_runs`)."""
    runs: dict[str, dict[int, dict]] = {m: {} for m in methods}
    notes: dict[str, Any] = {}
    surrogates: dict[str, NearestCurves] = {}
    for method in methods:
        first = ExperimentConfig.model_validate(search_doc(method, 0, base, "synthetic", samples, None, task))
        typed = typed_for(table, first.space, metric=first.search.metric, epochs=first.train.epochs)
        surrogate = NearestCurves(typed, first.space, metric=first.search.metric, mode=first.search.mode)
        loo = surrogate.choose_weights()  # the space is the method's, whatever the seed
        surrogates[method] = surrogate
        costs = StartupCosts.of_curves(typed.curves)
        notes[method] = {
            "costs": costs.__dict__,
            "leave_one_out": loo.__dict__,
            "loo_line": loo.line(first.search.metric),
        }
        for seed in range(seeds):
            config = ExperimentConfig.model_validate(search_doc(method, seed, base, "synthetic", samples, None, task))
            # a real run trains every trial with train.seed = its seed: replay that seed's curves where recorded
            run = simulate_search(config, surrogate, workers=2, costs=costs, seed=seed, match_training_seed=True)
            runs[method][seed] = run.as_dict()
        print(f"  simulated {method}: {seeds} seeds", flush=True)
    return runs, notes, surrogates


def surrogate_on_real_runs(
    surrogates: dict[str, NearestCurves], root: Path, metric: str, mode: str, target: float
) -> dict[str, dict[str, float]]:
    """Each method's surrogate on the configurations its real runs trained, over the epochs each
    trained: held out from the table unless a curve source is those runs themselves. Per method:
    trials, mean absolute error of the best value, mean real and predicted best, Spearman rank
    correlation, and what a search keeps of them: how many trials reach ``target``, and the median
    over runs of the best trial, real and predicted (a surrogate can be right on average and still
    be optimistic in the best of many). The counts are also split by whether the replayed curve
    has the run's training seed: one seed moves every configuration of a search together, and a
    seed the table lacks is answered with another seed's curve."""
    from scipy.stats import spearmanr

    from distmis.simulate import curves_of_search

    found: dict[str, dict[str, float]] = {}
    for method, surrogate in surrogates.items():
        best = max if mode == "max" else min
        sign = 1.0 if mode == "max" else -1.0
        pairs, per_run = [], []
        reached = {"own": [0, 0], "other": [0, 0]}  # [real, predicted], by whether the run's seed is replayed
        for seed, run in run_dirs(root, method, finished=True).items():
            pairs_of_run = []
            for c in curves_of_search(run)[0].curves:
                predicted = surrogate.curve(c.params, np.random.default_rng(seed), training_seed=seed)
                trained = len(c.values[metric])  # a trial ASHA stopped is compared over the epochs it trained
                pair = (best(c.values[metric]), best(predicted.values[metric][:trained]))
                pairs_of_run.append(pair)
                group = reached["own" if predicted.training_seed == seed else "other"]
                for i, value in enumerate(pair):
                    group[i] += int(sign * value >= sign * target)
            pairs += pairs_of_run
            per_run.append([best(column) for column in zip(*pairs_of_run, strict=True)])
        real, pred = np.array(pairs).T
        found[method] = {
            "trials": len(pairs),
            "mae": float(np.mean(np.abs(real - pred))),
            "mean_real": float(real.mean()),
            "mean_predicted": float(pred.mean()),
            "spearman": float(spearmanr(real, pred).statistic),
            "reached_real": reached["own"][0] + reached["other"][0],
            "reached_predicted": reached["own"][1] + reached["other"][1],
            "best_of_run_real": float(np.median([r for r, _ in per_run])),
            "best_of_run_predicted": float(np.median([p for _, p in per_run])),
            "reached_real_own_seed": reached["own"][0],
            "reached_predicted_own_seed": reached["own"][1],
            "reached_real_other_seed": reached["other"][0],
            "reached_predicted_other_seed": reached["other"][1],
        }
    return found


def own_replays(
    base: dict[str, Any], real: dict[str, Any], root: Path, methods: list[str], samples: int, task: str, sign: float
) -> dict[str, list[dict[str, float]]]:
    """The engine alone: each real run replayed on its own curves and seconds, with its own search
    document and training seed, so that no other day's clock and no surrogate enters. Per run:
    simulated / real time to target and wall. Runs whose scheduler stopped trials are left out:
    a truncated curve cannot go on."""
    found: dict[str, list[dict[str, float]]] = {}
    for method in methods:
        found[method] = []
        for seed, measured in real["methods"][method]["seeds"].items():
            config = ExperimentConfig.model_validate(search_doc(method, seed, base, "synthetic", samples, None, task))
            try:
                typed = typed_for(
                    read_curves([run_dir(root, method, seed)]),
                    config.space,
                    metric=config.search.metric,
                    epochs=config.train.epochs,
                )
            except CurveError:
                continue
            surrogate = NearestCurves(typed, config.space, metric=config.search.metric, mode=config.search.mode)
            costs = StartupCosts.of_curves(typed.curves)
            run = simulate_search(
                config,
                surrogate,
                workers=2,
                costs=costs,
                seed=seed,
                match_training_seed=True,
            )
            found[method].append(
                {
                    "seed": seed,
                    "time_to_target_ratio": _ratio(
                        measured["time_to_target"], time_to(run.events, sign * real["target"])
                    ),
                    "wall_ratio": _ratio(measured["wall"], run.wall),
                    "report_seconds": costs.report,
                }
            )
    return found


def _own_lines(own: dict[str, list[dict[str, float]]]) -> str:
    def span(values: list[float]) -> str:
        finite = [v for v in values if math.isfinite(v)]
        return f"{min(finite):.2f}–{max(finite):.2f}" if finite else "-"

    lines = ["the engine alone, each real run replayed on its own curves and seconds (simulated / real):"]
    for method, runs in own.items():
        if runs:
            lines.append(
                f"- {method}: {len(runs)} runs; time to target {span([r['time_to_target_ratio'] for r in runs])}, "
                f"wall {span([r['wall_ratio'] for r in runs])}; between two epochs "
                f"{span([r['report_seconds'] for r in runs])} s (each run's median)"
            )
        else:
            lines.append(f"- {method}: no run trained every trial to the end")
    return "\n".join(lines)


def _times(table: dict[str, Any], method: str, seeds: list[Any] | None = None) -> np.ndarray:
    """Each seed's time to target (of ``seeds``, where given), infinite where it never got there."""
    by_seed = table["methods"][method]["seeds"]
    return np.array([by_seed[s]["time_to_target"] for s in (by_seed if seeds is None else seeds)], dtype=float)


def _ratio(real: float, sim: float) -> float:
    """sim / real of two medians, NaN where either is "never" (or the real one is 0)."""
    return sim / real if math.isfinite(real) and math.isfinite(sim) and real > 0 else math.nan


def _agrees(r: float, s: float) -> bool:
    """The criterion on the real and simulated medians: within +-25 % of each other, or both "never"."""
    if math.isinf(r) or math.isinf(s):
        return math.isinf(r) and math.isinf(s)
    return 0.75 <= s / r <= 1.25


def criterion_noise(real: np.ndarray, sim: np.ndarray, draws: int = 4000) -> dict[str, float]:
    """How much of the +-25 % verdict is the seeds' luck, by resampling seeds with replacement.

    ``ratio_q05``/``ratio_q95``: the median ratio's 90 % bootstrap interval. ``agree``: how often
    resampled seeds agree. ``perfect``: how often a simulator that is exactly right would pass with
    these numbers of seeds (both sides drawn from the simulated runs); ``perfect_4x`` with four
    times the real seeds. A verdict is only informative where ``perfect`` is near 1."""
    rng = np.random.default_rng(0)

    def ratios_and_agreement(a: np.ndarray, n_a: int, b: np.ndarray, n_b: int) -> tuple[np.ndarray, float]:
        ratios, agreed = [], 0
        for _ in range(draws):
            mx, my = float(np.median(rng.choice(a, n_a))), float(np.median(rng.choice(b, n_b)))
            agreed += _agrees(mx, my)
            ratios.append(
                my / mx if math.isfinite(mx) and math.isfinite(my) else math.inf if math.isfinite(mx) else 0.0
            )
        return np.array(ratios), agreed / draws

    ratios, agree = ratios_and_agreement(real, len(real), sim, len(sim))
    _, perfect = ratios_and_agreement(sim, len(real), sim, len(sim))
    _, perfect_4x = ratios_and_agreement(sim, 4 * len(real), sim, len(sim))
    q05, q95 = np.percentile(ratios, [5, 95])
    return {
        "ratio_q05": float(q05),
        "ratio_q95": float(q95),
        "agree": agree,
        "perfect": perfect,
        "perfect_4x": perfect_4x,
    }


def reach_p(real: np.ndarray, sim: np.ndarray) -> float:
    """Two-sided exact binomial p-value of how many real seeds reached the target, at the rate the
    simulated seeds reached it: near 0 where the simulator reaches the target more or less often
    than the real runs do, whatever their times."""
    reached = int(np.isfinite(real).sum())
    return float(binomtest(reached, len(real), float(np.isfinite(sim).mean())).pvalue)


def _rank(table: dict[str, Any]) -> list[str]:
    """Methods from fastest to slowest median time to target (ties: the better AUC first)."""
    methods = table["methods"]
    return sorted(
        methods,
        key=lambda m: (methods[m]["summary"]["time_to_target"]["median"], -methods[m]["summary"]["auc"]["median"]),
    )


def _interval(noise: dict[str, float]) -> str:
    def ratio(x: float) -> str:
        return "never" if math.isinf(x) else f"{x:.2f}"

    return f"{ratio(noise['ratio_q05'])}–{ratio(noise['ratio_q95'])}"


def paired_medians(real: dict[str, Any], sim: dict[str, Any], method: str) -> tuple[float, float]:
    """The median time to target of the real seeds and of the simulated seeds with the same numbers.

    Simulated seed s replays real run s's search document (its sampler seed, its grid order, its
    training seed), so this compares the simulator on the very configurations the real runs drew:
    what is left is the simulator's error, not which configurations a few seeds happened to draw."""
    seeds = [s for s in real["methods"][method]["seeds"] if s in sim["methods"][method]["seeds"]]
    if not seeds:
        return math.nan, math.nan
    return float(np.median(_times(real, method, seeds))), float(np.median(_times(sim, method, seeds)))


def compare(
    real: dict[str, Any], sim: dict[str, Any], noise: dict[str, dict[str, float]], reach: dict[str, float]
) -> str:
    def stat(table: dict[str, Any], method: str, key: str, digits: int) -> str:
        s = table["methods"][method]["summary"][key]
        return fmt_stat(s["median"], s["q1"], s["q3"], digits)

    lines = [
        f"target {real['target']}; horizon {real['horizon_seconds']:.0f} s (the real grid's median wall); "
        "median [IQR]; real: seeds of search_efficiency.py, simulated: seeds of the simulator on 2 workers",
        "",
        "| method | reached (real / sim) | reach p | time to target, real (s) | simulated (s) | sim / real | best @100%, real "
        "| simulated | epochs, real | simulated | ratio, 90 % bootstrap | a right simulator passes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in real["methods"]:
        r, s = real["methods"][m]["summary"], sim["methods"][m]["summary"]
        rt, st = r["time_to_target"]["median"], s["time_to_target"]["median"]
        ratio = _ratio(rt, st)
        lines.append(
            f"| {m} | {r['reached']}/{len(real['methods'][m]['seeds'])} / {s['reached']}/{len(sim['methods'][m]['seeds'])} "
            f"| {reach[m]:.2f} | {stat(real, m, 'time_to_target', 1)} | {stat(sim, m, 'time_to_target', 1)} | {ratio:.2f} "
            f"| {stat(real, m, 'best_at_100', 4)} | {stat(sim, m, 'best_at_100', 4)} "
            f"| {stat(real, m, 'epochs', 0)} | {stat(sim, m, 'epochs', 0)} "
            f"| {_interval(noise[m])} | {noise[m]['perfect']:.0%} ({noise[m]['perfect_4x']:.0%} with 4x the real seeds) |"
        )
    lines += [
        "",
        "the same search documents (the simulated seeds that replay the real runs' own; median time to target):",
    ]
    for m in real["methods"]:
        rt, st = paired_medians(real, sim, m)
        paired = _ratio(rt, st)
        lines.append(
            f"- {m}: simulated {st:.1f} s / real {rt:.1f} s = {'-' if math.isnan(paired) else f'{paired:.2f}'}"
        )
    lines += [
        "",
        f"ranking, real: {' < '.join(_rank(real))}; simulated: {' < '.join(_rank(sim))}",
        "",
        "reach p: two-sided binomial p-value of the real seeds' count reaching the target at the simulated "
        "seeds' rate (near 0: the simulator reaches it more or less often than the real runs); "
        "ratio, 90 % bootstrap: the sim / real median ratio over seeds resampled with replacement; a right "
        "simulator passes: how often +-25 % holds when both sides are drawn from the simulated runs with these "
        "numbers of seeds (a verdict says little where that is far from 100 %)",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="quickstart", choices=sorted(TASK_FILES))
    p.add_argument("--real", default=None, help="search_efficiency.py's --out (default runs/bench-search-<task>)")
    p.add_argument(
        "--curves",
        required=True,
        nargs="+",
        help="curve tables and/or finished search directories (as distmis simulate --curves takes them)",
    )
    p.add_argument(
        "--clock-of",
        nargs="+",
        default=None,
        help="replay the curves on these finished searches' clock (distmis simulate --clock-of): for a table "
        "recorded on another day of these shared cores; the real runs themselves measure the day's clock",
    )
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--sim-seeds", type=int, default=40)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--name", default="fidelity", help="the output files' name: NAME.json, NAME.md, NAME.png")
    p.add_argument("--out", type=Path, default=None, help="the directory for them (default: --real)")
    p.add_argument(
        "--own-curves",
        action="store_true",
        help="also replay each real run on its own curves and seconds: the engine's error alone",
    )
    a = p.parse_args()

    base = yaml.safe_load(TASK_FILES[a.task].read_text())
    metric, mode = base["search"].get("metric", "val_dice"), base["search"].get("mode", "max")
    sign = 1.0 if mode == "max" else -1.0
    target = a.target if a.target is not None else TARGETS[a.task]
    root = Path(a.real or REPO / "runs" / f"bench-search-{a.task}")
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    real = analyse(real_runs(root, methods, metric, mode), target, sign, horizon_from="grid")
    table, clocks = on_clock(read_tables(a.curves), a.clock_of)
    sim_runs, notes, surrogates = simulated_runs(base, table, methods, a.sim_seeds, a.samples, a.task)
    # the simulated runs read at the real runs' horizon: fractions of the real grid's wall time
    sim = analyse(sim_runs, target, sign, horizon=(real["horizon_seconds"], real["horizon"]))
    held_out = surrogate_on_real_runs(surrogates, root, metric, mode, target)
    noise = {m: criterion_noise(_times(real, m), _times(sim, m)) for m in methods}
    reach = {m: reach_p(_times(real, m), _times(sim, m)) for m in methods}
    own = own_replays(base, real, root, methods, a.samples, a.task, sign) if a.own_curves else None
    text = (
        compare(real, sim, noise, reach)
        + "".join(f"\n\n{clock.line()}" for clock in clocks)
        + (f"\n\n{_own_lines(own)}" if own is not None else "")
        + "\n\nthe surrogate on the real runs' own configurations (best value per trial):\n"
        + "\n".join(
            f"- {m}: {h['trials']} trials, mean absolute error {h['mae']:.4f}, mean real {h['mean_real']:.4f} / "
            f"predicted {h['mean_predicted']:.4f}, rank correlation {h['spearman']:.2f}; reach {target:g}: "
            f"{h['reached_real']} real / {h['reached_predicted']} predicted (trials replayed with their run's "
            f"training seed: {h['reached_real_own_seed']} / "
            f"{h['reached_predicted_own_seed']}; the others: {h['reached_real_other_seed']} / "
            f"{h['reached_predicted_other_seed']}); best of a run, median: "
            f"{h['best_of_run_real']:.4f} real / {h['best_of_run_predicted']:.4f} predicted"
            for m, h in held_out.items()
        )
    )
    data = {
        "real": real,
        "simulated": sim,
        "criterion_noise": noise,
        "reach_p": reach,
        "simulation": notes,
        "surrogate": held_out,
        "curves": a.curves,
        "clock": [clock.as_dict() for clock in clocks],
        "own_curves": own,
    }

    def draw(fig: Any) -> None:
        axes = fig.add_subplot()
        for i, m in enumerate(methods):
            for kind, table, dx in (("real", real, -0.15), ("simulated", sim, 0.15)):
                times = _times(table, m)
                reached = times[np.isfinite(times)]
                axes.scatter([i + dx] * len(reached), reached, color="C0" if kind == "real" else "C1",
                             label=kind if i == 0 else None)  # fmt: skip
        axes.set_xticks(range(len(methods)), methods)
        axes.set_ylabel(f"seconds to {target:g} (each seed that reached it)")
        axes.legend()

    title = f"the simulator against real searches on {a.task}: time to target {target:g}, real and simulated"
    write_report(a.out or root, a.name, title=title, rows=[], data=data, markdown=text, figure=draw)


if __name__ == "__main__":
    main()
