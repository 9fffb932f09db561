"""What Ray Tune's driver spends per result and per trial of a distmis search, and when it queues.

Every result of every trial goes through one driver process: Ray Tune's bookkeeping and checkpoint
registration, then distmis's callbacks (the MLflow child runs, the live progress view). A trial
waits in ``report`` until the driver has dealt with it, so at many trials with short epochs the
results queue. ``distmis simulate`` charges this work to its virtual driver
(``distmis.simulate.study.DRIVER_SECONDS_PER_RESULT`` and ``..._PER_TRIAL``); this script measures it.

Each run is K trials at once of N trials in all, E epochs each of S seconds that only sleep, then
checkpoint and report as a distmis trial does, through distmis's Tune settings
(``tune_environment``), storage (``tune_storage``), checkpoint settings and driver callbacks
(``MlflowTrialCallback`` on an SQLite store, ``LiveProgress``). Trials that sleep leave the
driver's work as the only load. Per run it prints the results per second, the driver's CPU
seconds per result, and the gap a trial waits from an epoch's end until ``report`` returns.

Two figures come out, and ``distmis simulate`` uses both:
  serial seconds per result   the seconds one result holds the driver: each run's K trials report
                              once per (mean epoch + mean gap), so the driver serves a result in
                              at most (epoch + gap) / K, and the smallest over the runs (the most
                              saturated) is the estimate. Less than its CPU per result: part of
                              that CPU (MLflow's sender, Ray's I/O threads) runs beside the loop.
  serial seconds per trial    the seconds a trial's start and end hold it: the value with which the
                              engine replays the run that starts the most trials per result (short
                              trials that keep the driver starting them) with its real mean gap,
                              found by bisection. It is far below the driver's CPU per trial:
                              most of that (the MLflow run it opens, Ray's actor calls) runs beside
                              the loop.
The driver's CPU is also fitted over the runs, as a fixed cost, seconds per result and seconds
per trial (least squares), for comparison.
Each run is then replayed by the simulator's engine on its own measured epochs, with the least
loaded run's median gap as the recorded report seconds, with these driver costs and without them,
against the real gaps. One run sets each serial cost: the others test them. The trials' and Ray's
output is appended to ``$TMPDIR/tune-driver-load.log`` (the system's temporary directory).

    python benchmarks/tune_driver_load.py                              # the default runs, about 7 minutes
    python benchmarks/tune_driver_load.py --runs 2x2x40x0.2,8x8x40x0.03   # KxNxExS each
    python benchmarks/tune_driver_load.py --runs 2x2x40x0.2 --spin 2 --out runs/spin.json   # cores taken

Each run also prints the machine's cores busy over it (Linux's ``/proc/stat``). Where the gaps
grow before the driver is saturated, that and ``--spin`` tell whether the driver or the cores it
shares hold the results back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import REPO, add_out_option, write_report

DEFAULT_RUNS = "2x2x40x0.2,8x8x40x0.2,8x64x5x0.2,8x8x40x0.03,32x32x20x1.0,32x32x20x0.25,2x40x2x0.01,8x160x2x0.01"


@dataclass
class Measured:
    """One run: its shape, the driver's CPU and every epoch's times (start, end, report back)."""

    workers: int
    trials: int
    epochs: int
    sleep: float
    driver_cpu: float
    entries: dict[str, float]  # each trial's function start
    rows: list[dict[str, Any]]  # one per epoch: trial, epoch, start, end, back
    #: the whole machine's cores busy, on average over the search (None: not measured, not Linux)
    cores_busy: float | None = None

    @property
    def results(self) -> int:
        return len(self.rows)

    @property
    def gaps(self) -> list[float]:
        return [r["back"] - r["end"] for r in self.rows if r["epoch"] < self.epochs]

    @property
    def phase(self) -> float:
        return max(r["end"] for r in self.rows) - min(r["start"] for r in self.rows)

    @property
    def epoch_seconds(self) -> float:
        return statistics.mean(r["end"] - r["start"] for r in self.rows)

    @property
    def startup(self) -> float:
        """A trial's median seconds from its function's start to its first epoch."""
        return statistics.median(r["start"] - self.entries[str(r["trial"])] for r in self.rows if r["epoch"] == 1)


def sleeping_trial(config: dict[str, Any]) -> None:
    """``_epochs`` epochs of ``_sleep`` seconds (the workload, not a wait on anything), each followed
    by a checkpoint and a report as a distmis trial makes them; each epoch's times are written to a
    file in ``_log``, where given. ``benchmarks/tune_sync_rate.py`` runs it too."""
    import logging

    from ray import tune

    logging.getLogger("ray").setLevel(logging.WARNING)  # a line per checkpoint would bury the table
    entry = time.time()
    log = Path(config["_log"]) / f"{os.getpid()}-{time.time_ns()}.json" if config.get("_log") else None
    rows = []
    for epoch in range(1, config["_epochs"] + 1):
        start = time.time()
        time.sleep(config["_sleep"])
        end = time.time()
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "state.txt").write_text(str(epoch))
            tune.report(
                {"epoch": epoch, "val_dice": epoch / 100, "epoch_seconds": end - start, "finished_at": end},
                checkpoint=tune.Checkpoint.from_directory(d),
            )
        if log is not None:
            rows.append({"trial": log.stem, "epoch": epoch, "start": start, "end": end, "back": time.time()})
            log.write_text(json.dumps({"entry": entry, "rows": rows}))


def cpu_ticks() -> tuple[int, int] | None:
    """The machine's (busy, all) CPU ticks so far, from Linux's ``/proc/stat``; None elsewhere.

    Trials that only sleep leave the driver, Ray's own processes and the trials' reporting as the
    machine's load, so this tells whether they compete for the cores (a 2-core machine running 32
    trial processes) or the driver alone holds the results back.
    """
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def spinning(processes: int) -> Iterator[None]:
    """``processes`` processes that only spin while the block runs: cores taken from the search, as
    a 2-core machine's 8-32 trial processes and Ray's own take them from the driver."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def measure(workers: int, trials: int, epochs: int, sleep: float) -> Measured:
    import yaml
    from ray import tune

    from distmis.config import ExperimentConfig
    from distmis.console import quiet_output
    from distmis.raysession import init_ray, shutdown_ray
    from distmis.tracking import MlflowTrialCallback, SearchTracker
    from distmis.tuning import LiveProgress, tune_environment, tune_storage

    tune_environment()
    out = Path(tempfile.mkdtemp(prefix="tune-driver-load-"))
    logs = out / "trials-log"
    logs.mkdir()
    base = ExperimentConfig.model_validate(yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text()))
    tracker = SearchTracker(f"sqlite:///{out / 'mlflow.db'}", "driver-load", out)
    tracker.start(params={"trials": str(trials)}, tags={}, artifacts=[])
    callbacks = [
        MlflowTrialCallback(tracker, base_config=base.to_yaml_dict(), epochs=epochs),
        LiveProgress(
            name="driver-load", metric="val_dice", mode="max", epochs=epochs, trials=trials, concurrency=workers
        ),
    ]
    init_ray(None, num_cpus=workers)
    log = Path(tempfile.gettempdir()) / "tune-driver-load.log"
    try:
        tuner = tune.Tuner(
            tune.with_resources(sleeping_trial, {"cpu": 1}),
            param_space={"_epochs": epochs, "_sleep": sleep, "_log": str(logs), "lr": tune.loguniform(1e-4, 1e-2)},
            tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=workers, reuse_actors=True),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str(out),
                storage_filesystem=tune_storage(out),
                callbacks=callbacks,
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                verbose=0,
            ),
        )
        with quiet_output(log, verbose=False):
            before, ticks_before = resource.getrusage(resource.RUSAGE_SELF), cpu_ticks()
            tuner.fit()
            after, ticks_after = resource.getrusage(resource.RUSAGE_SELF), cpu_ticks()
    finally:
        shutdown_ray()
    logged = {f.stem: json.loads(f.read_text()) for f in sorted(logs.iterdir())}
    shutil.rmtree(out, ignore_errors=True)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rows = sorted((r for t in logged.values() for r in t["rows"]), key=lambda r: (r["trial"], r["epoch"]))
    busy = None
    if ticks_before and ticks_after and ticks_after[1] > ticks_before[1]:
        share = (ticks_after[0] - ticks_before[0]) / (ticks_after[1] - ticks_before[1])
        busy = share * (os.cpu_count() or 1)
    return Measured(workers, trials, epochs, sleep, cpu, {t: v["entry"] for t, v in logged.items()}, rows, busy)


def cpu_fit(runs: list[Measured]) -> tuple[float, float, float]:
    """The driver's CPU seconds as a fixed cost, per result and per trial (least squares over the runs)."""
    a = np.array([[1.0, r.results, r.trials] for r in runs], dtype=float)
    b = np.array([r.driver_cpu for r in runs])
    (fixed, per_result, per_trial), *_ = np.linalg.lstsq(a, b, rcond=None)
    return float(fixed), float(per_result), float(per_trial)


def serial_per_trial(run: Measured, report: float, per_result: float) -> float:
    """The driver's seconds per trial with which the engine gives ``run``'s real mean gap (bisection;
    the engine's gaps grow with it)."""
    real = statistics.mean(run.gaps)
    low, high = 0.0, 0.5
    for _ in range(12):
        middle = (low + high) / 2
        if statistics.mean(replay(run, report, per_result, middle)) < real:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def serial_per_result(run: Measured) -> float:
    """At most the seconds one result holds the driver (exactly, where ``run`` kept it busy): each
    of K trials reports once per (epoch + gap), and the driver serves them one after another."""
    return (run.epoch_seconds + statistics.mean(run.gaps)) / run.workers


def replay(run: Measured, report: float, per_result: float, per_trial: float) -> list[float]:
    """The engine's gaps from an epoch's end to the next epoch's start, for ``run``'s shape.

    Every trial reports ``trial index + epoch / 1000``, so each simulated event names its trial and
    epoch; with equal epochs, a gap is the next epoch's end less an epoch, less this one's end.
    """
    from distmis.config import ExperimentConfig
    from distmis.simulate import Curve, CurveTable, StartupCosts, simulate_search
    from distmis.simulate.study import NearestCurves, typed_for

    doc = {
        "name": "driver-load",
        "data": {"source": "synthetic"},
        "train": {"epochs": run.epochs},
        "search": {"algorithm": "grid", "metric": "val_dice", "scheduler": {"type": "none"}},
        "space": {"x": {"choice": list(range(run.trials))}},
    }
    config = ExperimentConfig.model_validate(doc)
    seconds = run.epoch_seconds
    curves = [
        Curve(
            trial=f"t{i}",
            training_seed=0,
            params={"x": i},
            warm=False,
            startup_seconds=run.startup,
            epoch_seconds=[seconds] * run.epochs,
            report_seconds=[report] * (run.epochs - 1) + [None],
            values={"val_dice": [i + e / 1000 for e in range(1, run.epochs + 1)]},
        )
        for i in range(run.trials)
    ]
    typed = typed_for(CurveTable(curves, "sleeping trials"), config.space, metric="val_dice", epochs=run.epochs)
    surrogate = NearestCurves(typed, config.space, metric="val_dice", mode="max")
    costs = StartupCosts(
        slot=0.0,
        cold=run.startup,
        warm=run.startup,
        report=report,
        driver_per_result=per_result,
        driver_per_trial=per_trial,
    )
    sim = simulate_search(config, surrogate, workers=run.workers, costs=costs, seed=0)
    ends: dict[tuple[int, int], float] = {}
    for at, value in sim.events:
        trial, epoch = divmod(round(value * 1000), 1000)
        ends[(trial, epoch)] = at
    return [
        ends[(t, e + 1)] - seconds - ends[(t, e)] for (t, e) in sorted(ends) if e < run.epochs and (t, e + 1) in ends
    ]


def summary(gaps: list[float]) -> str:
    """Median and mean of gaps, in ms."""
    return f"{1000 * statistics.median(gaps):.0f} / {1000 * statistics.mean(gaps):.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default=DEFAULT_RUNS, help=f"KxNxExS runs, comma-separated (default {DEFAULT_RUNS})")
    add_out_option(p, "tune_driver_load")
    p.add_argument(
        "--replay", action="store_true", help="measure nothing: fit and replay the runs kept in --out's JSON"
    )
    p.add_argument(
        "--spin",
        type=int,
        default=0,
        metavar="N",
        help="N processes that spin through each run, taking cores from the search: how much the gaps owe to "
        "the machine's cores rather than the driver (default 0)",
    )
    a = p.parse_args()
    if a.spin < 0:
        p.error(f"--spin: expected 0 or more processes, got {a.spin}")
    specs = [] if a.replay else [s.split("x") for s in a.runs.split(",")]
    kept = a.out / "tune_driver_load.json"
    runs = [Measured(**r) for r in json.loads(kept.read_text())["data"]["runs"]] if a.replay else []
    print(
        "| K at once | trials | epochs | sleep (s) | results/s | driver CPU per result (ms) | gap median [p10-p90] (ms) "
        f"| gap mean (ms) | cores busy, of {os.cpu_count()} |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k, n, e, s in specs:
        with spinning(a.spin):
            r = measure(int(k), int(n), int(e), float(s))
        runs.append(r)
        g = r.gaps
        q = statistics.quantiles(g, n=10)
        print(
            f"| {r.workers} | {r.trials} | {r.epochs} | {r.sleep} | {r.results / r.phase:.0f} | "
            f"{1000 * r.driver_cpu / r.results:.1f} | {1000 * statistics.median(g):.0f} [{1000 * q[0]:.0f}-{1000 * q[8]:.0f}] | "
            f"{1000 * statistics.mean(g):.0f} | {'-' if r.cores_busy is None else f'{r.cores_busy:.2f}'} |",
            flush=True,
        )
    if len(runs) < 3:
        title = f"the Tune driver's work: {len(runs)} run(s) kept, too few to fit"
        write_report(a.out, "tune_driver_load", title=title, rows=[], data={"runs": [asdict(r) for r in runs]})
        raise SystemExit("the fit needs 3 runs or more (--runs)")
    fixed, cpu_per_result, cpu_per_trial = cpu_fit(runs)
    loaded = min(runs, key=serial_per_result)
    per_result = serial_per_result(loaded)
    quiet = min(runs, key=lambda r: r.workers / r.epoch_seconds)
    report = statistics.median(quiet.gaps)
    starts = max(runs, key=lambda r: (r.trials / r.results, r.workers))  # the busiest of the shortest trials
    per_trial = serial_per_trial(starts, report, per_result)
    print(
        f"\ndriver CPU fitted over {len(runs)} runs: {fixed:.1f} s fixed, {1000 * cpu_per_result:.1f} ms per result, "
        f"{1000 * cpu_per_trial:.0f} ms per trial"
    )
    print(
        f"serial seconds per result (the most saturated run, K={loaded.workers}, {loaded.sleep} s epochs): "
        f"{1000 * per_result:.1f} ms"
    )
    print(
        f"serial seconds per trial (the engine fitted to the run of the shortest trials, K={starts.workers}, "
        f"{starts.trials} trials of {starts.epochs} epochs): {1000 * per_trial:.0f} ms"
    )
    print(
        f"report seconds (median gap of the least loaded run, K={quiet.workers}, {quiet.sleep} s): {1000 * report:.0f} ms\n"
    )
    print("gaps, median / mean (ms):\n")
    print("| K at once | trials | sleep (s) | real | engine, driver charged | engine, driver free |")
    print("|---|---|---|---|---|---|")
    rows = []
    for r in runs:
        charged = replay(r, report, per_result, per_trial)
        free = replay(r, report, 0.0, 0.0)
        print(f"| {r.workers} | {r.trials} | {r.sleep} | {summary(r.gaps)} | {summary(charged)} | {summary(free)} |")
        rows.append(
            {
                "K at once": r.workers,
                "trials": r.trials,
                "sleep (s)": r.sleep,
                "real gaps, median / mean (ms)": summary(r.gaps),
                "engine, driver charged": summary(charged),
                "engine, driver free": summary(free),
            }
        )
    fit = {
        "fixed_cpu_seconds": fixed,
        "cpu_per_result_seconds": cpu_per_result,
        "cpu_per_trial_seconds": cpu_per_trial,
        "serial_per_result_seconds": per_result,
        "serial_per_trial_seconds": per_trial,
        "report_seconds": report,
    }

    def draw(fig: Any) -> None:
        axes = fig.add_subplot()
        axes.boxplot([[1000 * g for g in r.gaps] for r in runs], showfliers=False)
        axes.set_xticks(range(1, len(runs) + 1), [f"K{r.workers}, {r.sleep} s" for r in runs], rotation=45)
        axes.set_ylabel("gap between a trial's results (ms)")

    title = f"the Tune driver's work per result and per trial, {len(runs)} runs"
    data = {"runs": [asdict(r) for r in runs], "fit": fit}
    write_report(a.out, "tune_driver_load", title=title, rows=rows, data=data, figure=draw, echo=False)


if __name__ == "__main__":
    main()
