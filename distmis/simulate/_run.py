"""``distmis simulate``: one or more search files replayed on recorded curves, over seeds, with a table, a PNG and JSON.

Every search file is one method. Each runs once per seed (the seed is the sampler's, ASHA's
bracket draw and the draw among a configuration's recorded seeds), on ``workers`` concurrent
trials. The figures are those of ``benchmarks/search_efficiency.py`` for real searches
(:mod:`distmis.simulate._report`), so the two can be laid side by side.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmis.config import ExperimentConfig, load_config
from distmis.exceptions import OutputError
from distmis.files import OutputClaim, check_output, marker_info, write_text_atomic
from distmis.schema import RunFile
from distmis.simulate._clock import on_clock
from distmis.simulate._curves import CurveError, CurveTable, typed_for
from distmis.simulate._engine import (
    DRIVER_SECONDS_PER_RESULT,
    DRIVER_SECONDS_PER_TRIAL,
    SearchRun,
    StartupCosts,
    simulate_search,
)
from distmis.simulate._from_search import read_tables
from distmis.simulate._report import analyse, finite_json, plot, quartiles, table_text
from distmis.simulate._surrogate import LeaveOneOut, NearestCurves


@dataclass
class Method:
    """One search file, ready to simulate: its configuration and the curves that stand for it."""

    name: str
    path: Path
    config: ExperimentConfig
    surrogate: NearestCurves
    costs: StartupCosts
    loo: LeaveOneOut


def method_of(
    path: Path,
    table: CurveTable,
    *,
    workers: int,
    samples: int | None,
    driver_seconds: tuple[float, float],
) -> Method:
    """A search file checked against the curves (its space, metric and epochs); ``driver_seconds``:
    the Tune driver's own work per result and per trial (:class:`StartupCosts`).

    Raises:
        ConfigError: the file. CurveError: the curves do not stand for this search.
    """
    config = load_config(path, require_space=True)
    s = config.search
    changes: dict[str, Any] = {"max_concurrent_trials": workers}
    if samples is not None:
        changes["num_samples"] = samples
    config = config.model_copy(update={"search": s.model_copy(update=changes)})
    typed = typed_for(table, config.space, metric=s.metric, epochs=config.train.epochs)
    surrogate = NearestCurves(typed, config.space, metric=s.metric, mode=s.mode)
    loo = surrogate.choose_weights()
    per_result, per_trial = driver_seconds
    costs = StartupCosts.of_curves(typed.curves, driver_per_result=per_result, driver_per_trial=per_trial)
    return Method(config.name, path, config, surrogate, costs, loo)


def _labelled(what: str, paths: list[Path]) -> dict[str, Path]:
    return {what if len(paths) == 1 else f"{what} {i + 1}": p for i, p in enumerate(paths)}


def with_seed(config: ExperimentConfig, seed: int) -> ExperimentConfig:
    return config.model_copy(update={"search": config.search.model_copy(update={"seed": seed})})


def _checked_numbers(
    workers: int, seeds: int, samples: int | None, target: float | None, given: tuple[float, float] | None
) -> tuple[float, float]:
    """The options' numbers checked; returns the driver's own work per result and per trial, as
    given, else as measured."""
    for option, count in (("--workers", workers), ("--seeds", seeds), ("--samples", samples)):
        if count is not None and count < 1:
            raise CurveError(f"{option}: expected a whole number, 1 or more; got {count}")
    if target is not None and not math.isfinite(target):
        # a target no value can reach (or that NaN compares false with) makes every time "never"
        raise CurveError(f"--target: expected a finite value of the search metric; got {target}")
    driver = given or (DRIVER_SECONDS_PER_RESULT, DRIVER_SECONDS_PER_TRIAL)
    if not all(math.isfinite(x) and x >= 0 for x in driver):
        raise CurveError(
            f"--driver-seconds: expected two numbers of seconds, 0 or more; got {' '.join(map(str, driver))}"
        )
    return driver


#: the longest a simulation may be estimated to run before it is refused (``--max-hours``)
MAX_HOURS = 1.0


def estimated_seconds(samples: list[int], seeds: int) -> float:
    """Roughly how long simulating searches of ``samples`` trials each, over ``seeds`` seeds, takes.

    The searcher's suggestions cost more as its history grows (TPE is linear in it), so a search of
    n trials costs about a*n + b*n^2; a and b were fitted to simulate's own runs of 64 and 512 trials
    on a 2-core machine. An order of magnitude is all a bound needs.
    """
    return seeds * sum(0.0105 * n + 2.0e-5 * n * n for n in samples)


def _check_before_work(
    methods: list[Any], out: Path, *, samples: int | None, seeds: int, max_hours: float, overwrite: bool
) -> None:
    """What must hold before a simulation starts: a name per method, a bounded cost, an ``--out``
    that is new or replaced on purpose."""
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise CurveError(f"two search files share a name ({names}); each method needs its own `name`")
    _check_cost([samples or m.config.search.num_samples for m in methods], seeds, max_hours)
    _check_replaceable(out, overwrite)


def _check_cost(samples: list[int], seeds: int, max_hours: float) -> None:
    if not (math.isfinite(max_hours) and max_hours > 0):
        raise CurveError(f"--max-hours: expected a positive number of hours; got {max_hours}")
    estimate = estimated_seconds(samples, seeds)
    if estimate > max_hours * 3600:
        raise CurveError(
            f"--samples {max(samples)} x --seeds {seeds}: about {estimate / 3600:.3g} hours to simulate on this "
            f"machine, more than --max-hours {max_hours:g}; give fewer samples or seeds, or a larger --max-hours"
        )


def _check_replaceable(out: Path, overwrite: bool) -> None:
    """An earlier simulation's ``--out`` is replaced only with ``--overwrite``, as every command's output."""
    if overwrite or not out.is_dir() or marker_info(out) is None:
        return  # new, empty, or not distmis's (the claim refuses the last, naming it)
    if any((out / name).exists() for name in (RunFile.SUMMARY, "summary.md", "best_so_far.png")):
        raise OutputError(f"--out {out}: holds an earlier simulation; give --overwrite to replace it, or another --out")


def run_simulation(
    search_files: list[Path],
    curves: list[Path],
    *,
    workers: int,
    seeds: int,
    samples: int | None,
    target: float | None,
    out: Path,
    match_training_seed: bool = False,
    clock_of: list[Path] | None = None,
    driver_seconds: tuple[float, float] | None = None,
    overwrite: bool = False,
    max_hours: float = MAX_HOURS,
) -> dict[str, Any]:
    """Simulate every search file over ``seeds`` seeds; writes ``summary.json``, ``summary.md`` and
    ``best_so_far.png`` into ``out`` and returns the summary.

    ``clock_of``: finished searches (or curve tables) whose clock the curves are replayed on
    (:class:`~distmis.simulate._clock.Clock`); by default the curves' own seconds.
    ``driver_seconds``: the Tune driver's own work per result and per trial (default: as measured).

    Raises:
        ConfigError / CurveError: a bad search file or curve table (before anything is written).
        OutputError: an ``--out`` that is an input or another command's directory.
    """
    driver = _checked_numbers(workers, seeds, samples, target, driver_seconds)
    inputs = _labelled("search file", search_files) | _labelled("curves", curves) | _labelled("clock", clock_of or [])
    out = check_output(out, option="--out", inputs=inputs)
    table, clocks = on_clock(read_tables(list(curves)), clock_of)
    methods = [method_of(p, table, workers=workers, samples=samples, driver_seconds=driver) for p in search_files]
    _check_before_work(methods, out, samples=samples, seeds=seeds, max_hours=max_hours, overwrite=overwrite)
    with OutputClaim(out, command="simulate", option="--out"):
        runs, seconds = _simulate_all(methods, workers=workers, seeds=seeds, match_training_seed=match_training_seed)
        first = methods[0]
        sign = 1.0 if first.config.search.mode == "max" else -1.0
        if target is None:
            # the first search's median final best: when do the others reach what it ends with?
            target = quartiles([sign * max(v for _, v in r.events) for r in runs[first.name].values()])[0]
        as_dicts = {m: {s: r.as_dict() for s, r in by_seed.items()} for m, by_seed in runs.items()}
        analysis = analyse(as_dicts, target, sign, horizon_from=None)
        metric = first.config.search.metric
        text = (
            _header(methods, table, workers, seeds, seconds)
            + "".join(f"\n{clock.line()}" for clock in clocks)
            + "\n\n"
            + table_text(analysis, metric, baseline=first.name)
        )
        summary = {
            "workers": workers,
            "seeds": seeds,
            "curves": [str(c) for c in curves],
            "metric": metric,
            "clock": [clock.as_dict() for clock in clocks],
            "simulation_seconds": seconds,
            "methods_detail": {
                m.name: {
                    "search_file": str(m.path),
                    "startup_costs": m.costs.__dict__,
                    "surrogate_leave_one_out": m.loo.__dict__,
                    "decision_seconds": [r.decision_seconds for r in runs[m.name].values()],
                    "stopped_early": [r.stopped_early for r in runs[m.name].values()],
                }
                for m in methods
            },
            **analysis,
            "curves_by_seed": {m: {s: r.events for s, r in by_seed.items()} for m, by_seed in runs.items()},
        }
        write_text_atomic(out / RunFile.SUMMARY, json.dumps(finite_json(summary), indent=1) + "\n")
        write_text_atomic(out / "summary.md", text + "\n")
        plot(
            as_dicts,
            analysis,
            out / "best_so_far.png",
            metric,
            title=f"Simulated, {workers} workers: median, IQR shaded",
        )
    print(text)
    print(f"\n{out / 'summary.md'}, {out / RunFile.SUMMARY}, {out / 'best_so_far.png'}", flush=True)
    return summary


def _simulate_all(
    methods: list[Method], *, workers: int, seeds: int, match_training_seed: bool
) -> tuple[dict[str, dict[int, SearchRun]], float]:
    from distmis.console import progress_bar

    runs: dict[str, dict[int, SearchRun]] = {m.name: {} for m in methods}
    start = time.perf_counter()
    total = len(methods) * seeds
    with progress_bar(f"simulating {len(methods)} search(es) x {seeds} seed(s)") as update:
        for m in methods:
            for seed in range(seeds):
                update(sum(map(len, runs.values())), total, description=f"{m.name} seed {seed}")
                runs[m.name][seed] = simulate_search(
                    with_seed(m.config, seed),
                    m.surrogate,
                    workers=workers,
                    costs=m.costs,
                    seed=seed,
                    match_training_seed=match_training_seed,
                )
        update(total, total)
    return runs, time.perf_counter() - start


def _header(methods: list[Method], table: CurveTable, workers: int, seeds: int, seconds: float) -> str:
    m = methods[0]
    c = m.costs
    lines = [
        f"simulated {len(methods)} search(es) x {seeds} seed(s) on {workers} worker(s) in {seconds:.1f} s, "
        f"curves: {table.source} ({len(table.curves)} curves, {len(m.surrogate.keys)} configurations, "
        f"recorded with {_recipe_words(table.recipe)})",
        f"start-up (medians of the recorded trials): slot cold start {c.slot:.2f} s, first trial to its first epoch "
        f"{c.cold:.2f} s, a trial on a warm slot {c.warm:.2f} s, a fresh slot's first epoch "
        f"{c.cold_first_epoch:.2f} s longer than a warm one's; the search's fixed cost before its first trial "
        f"{c.search:.1f} s (not in the times below); between two epochs of a trial {c.report:.2f} s"
        + ("" if c.report_recorded else " (the curves did not record it: distmis's measured default)")
        + f"; the Tune driver's own work {c.driver_per_result * 1000:.0f} ms per result, "
        f"{c.driver_per_trial * 1000:.0f} ms per trial",
        m.loo.line(m.config.search.metric),
    ]
    mismatch = recipe_mismatch(table, m.config)
    if mismatch:
        lines.append(f"warning: {mismatch}")
    return "\n".join(lines)


def _recipe_words(recipe: str | None) -> str:
    return f"the {recipe} recipe" if recipe else "a recipe the table does not name"


def recipe_mismatch(table: CurveTable, config: ExperimentConfig) -> str | None:
    """Why the table's curves may not be this search's: they were recorded with another recipe's
    network (its figures then say how a search of *that* recipe would go); ``None`` when they match
    or either is unknown."""
    from distmis.recipes import recipe_of

    searched = recipe_of(config.model)
    if table.recipe is None or searched is None or searched == table.recipe:
        return None
    return (
        f"the curves were recorded with the {table.recipe} recipe, and this search trains the {searched} recipe's "
        f"network (model.activation {config.model.activation}, model.downsample {config.model.downsample}): "
        f"the times and values above are those of a {table.recipe} search; give curves recorded with this "
        "recipe (a finished search directory of your own) to simulate this one"
    )


__all__ = ["Method", "method_of", "run_simulation", "with_seed"]
