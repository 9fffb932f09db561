"""How much does Ray Tune cost, and does concurrency pay?

Runs the same 4 configurations (a 4-point grid, so every run trains identical configs) three
ways, each as a fresh process so TensorFlow/Ray start-up is counted as a user pays it:

  plain   one Python process training the 4 configs back to back, with a trial's TensorFlow settings
          (distmis's environment: oneDNN kernels; the trial's thread count)
  tune-1  `distmis tune`, one trial at a time (max_concurrent_trials: 1)
  tune-2  `distmis tune`, two 1-CPU trials at a time on 2 cores
  plain-2 two plain processes at once, 2 configs each: this host's own ceiling for 2-way concurrency

and prints  ratio = tune-1 / plain  (target <= 1.10)  and  speed-up = tune-1 / tune-2  (target >= 1.85),
end to end (what a user waits for: Ray start-up, MLflow, plots included) and for the trial
phase alone (first trial start to last trial report, against the plain loop's training time),
which separates fixed start-up costs from per-trial overhead and parallel efficiency.
The MLflow store is created before timing (a user's searches share one store).

    python benchmarks/tune_overhead.py [--size 48] [--epochs 6] [--cases 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import add_out_option, write_report

from distmis.exceptions import TuningError
from distmis.search_summary import read_search_summary

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # this process prepares the data with TensorFlow


def space(prepared: Path, size: int, epochs: int, concurrency: int) -> dict:
    return {
        "name": f"bench-c{concurrency}",
        "data": {"source": str(prepared)},
        "train": {"epochs": epochs, "batch_size_per_replica": 2, "patch": [size] * 3, "threads": 1},
        "model": {"depth": 3, "filters": 8},
        "search": {"algorithm": "grid", "max_concurrent_trials": concurrency, "scheduler": {"type": "none"}},
        "space": {"lr": {"choice": [1.0e-3, 3.0e-3]}, "amsgrad": {"choice": [True, False]}},
        "parallelism": {"mode": "experiment", "cpus_per_worker": 1},
    }


def plain_loop(space_file: str, part: int = 0, parts: int = 1) -> None:
    """The baseline: the same grid trained in one process, no Ray (or its ``part``-th share).

    With the TensorFlow settings of a trial: distmis's environment (oneDNN kernels, quiet logs)
    set before TensorFlow is imported, and the trial's thread count (``train.threads``).
    """
    from distmis.tensorflow_env import apply_tensorflow_env

    apply_tensorflow_env()
    from distmis.config import load_config
    from distmis.training import configure_tensorflow

    configure_tensorflow(load_config(space_file, require_space=True).train.threads)
    from distmis.config import apply_params, load_config
    from distmis.space import grid_points
    from distmis.training import fit

    cfg = load_config(space_file, require_space=True)
    out = Path(tempfile.mkdtemp(prefix="plain-"))
    start = time.perf_counter()
    for i, point in enumerate(grid_points(cfg.space)):
        if i % parts == part:
            fit(apply_params(cfg, point), cfg.data.source, out / str(i))
    print(f"TRAINING_SECONDS {time.perf_counter() - start}")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done.stdout


def trials_detail(out: Path) -> list[dict]:
    """The search's per-trial record (``summary.json``)."""
    return [t.model_dump() for t in read_search_summary(out, error=TuningError).trials_detail]


def trial_phase(detail: list[dict]) -> float:
    """Seconds from the first trial's start to the last trial's last report."""
    return max(t["finished_at"] for t in detail) - min(t["started_at"] for t in detail)


def first_trial_startup(detail: list[dict]) -> float | None:
    """The first trial's cold start: from its process's spawn to the start of its training
    (Ray's worker, ``ray.tune``, TensorFlow's import), as the trial itself recorded it."""
    return min(detail, key=lambda t: t["started_at"]).get("group_startup_seconds")


def print_fixed_cost(
    phases: dict[str, float], tune1: float, phase1: float, plain: float, plain_train: float, startup: float | None
) -> None:
    """The fixed cost outside the trials, phase by phase (``timings.json`` of the search).

    The trials phase's share is split into the first trial's cold start (its process's spawn to
    its training, which includes the TensorFlow import that the plain loop pays among its own
    fixed cost) and the rest of Tune's time in ``fit()``; the rest is negative where the trial's
    process was spawned before ``fit()`` began.
    """
    phases = {k: v for k, v in phases.items() if not k.startswith("summed_")}  # trial totals, not phases
    accounted = sum(phases.values())
    rows = [("process start, imports, exit", tune1 - accounted)]
    for name, seconds in phases.items():
        if name == "trials":  # Tune's own time in fit(): actor start, TensorFlow import, shutdown
            rows.append(("trials phase outside the trials", seconds - phase1))
            if startup is not None:
                rows.append(("  first trial's process start-up", startup))
                rows.append(("  the rest of Tune's fit()", seconds - phase1 - startup))
        else:
            rows.append((name.replace("_", " "), seconds))
    print(
        f"fixed cost outside the trials: {tune1 - phase1:.1f} s (target <= 6 s; plain loop: {plain - plain_train:.1f} s)"
    )
    for name, seconds in rows:
        print(f"  {name:34s}{seconds:8.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--cases", type=int, default=16)
    ap.add_argument("--ratio-only", action="store_true", help="only plain vs tune-1 (skip the two concurrency runs)")
    ap.add_argument("--plain-loop", help=argparse.SUPPRESS)
    ap.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--parts", type=int, default=1, help=argparse.SUPPRESS)
    add_out_option(ap, "tune_overhead")
    args = ap.parse_args()
    if args.plain_loop:
        plain_loop(args.plain_loop, args.part, args.parts)
        return

    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset, write_synthetic_msd

    work = Path(tempfile.mkdtemp(prefix="tune-overhead-"))
    shape = (args.size,) * 3
    write_synthetic_msd(work / "msd", cases=args.cases, shape=shape, test_cases=0)
    prepare_dataset(work / "msd", work / "prep", PrepareConfig(shape=shape, split=(0.75, 0.25, 0.0)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    files = {}
    for c in (1, 2):
        files[c] = work / f"space{c}.yaml"
        files[c].write_text(yaml.safe_dump(space(work / "prep", args.size, args.epochs, c)))

    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}").search_experiments()  # create the store

    plain, stdout = timed([sys.executable, __file__, "--plain-loop", str(files[1])], env)
    plain_train = float(stdout.split("TRAINING_SECONDS")[1].split()[0])
    tune1, _ = timed([sys.executable, "-m", "distmis", "tune", str(files[1]), "--out", str(work / "t1")], env)
    detail1 = trials_detail(work / "t1")
    phase1 = trial_phase(detail1)
    print(f"4 trials x {args.epochs} epochs at {args.size}^3, {os.cpu_count()} cores")
    print(f"{'':36s}{'end to end':>12s}{'trial phase':>14s}")
    print(f"{'plain loop (1 process, 1 thread)':36s}{plain:10.1f} s{plain_train:12.1f} s")
    print(f"{'distmis tune, 1 trial at a time':36s}{tune1:10.1f} s{phase1:12.1f} s")
    print(f"{'ratio tune-1 / plain (<= 1.10)':36s}{tune1 / plain:12.2f}{phase1 / plain_train:14.2f}")
    timings = work / "t1" / "timings.json"
    if timings.is_file():  # where the search's own wall time went, phase by phase
        startup = first_trial_startup(detail1)
        print_fixed_cost(json.loads(timings.read_text()), tune1, phase1, plain, plain_train, startup)
    rows = [
        {"run": "plain loop (1 process, 1 thread)", "end to end (s)": plain, "trial phase (s)": plain_train},
        {"run": "distmis tune, 1 trial at a time", "end to end (s)": tune1, "trial phase (s)": phase1},
    ]
    title = f"4 trials x {args.epochs} epochs at {args.size}^3: distmis tune against a plain training loop"
    if args.ratio_only:
        write_report(args.out, "tune_overhead", title=title, rows=rows, echo=False)
        return
    # the host's own ceiling for 2-way concurrency: two plain processes, 2 configs each, at once
    start = time.perf_counter()
    halves = [
        subprocess.Popen(
            [sys.executable, __file__, "--plain-loop", str(files[1]), "--part", str(i), "--parts", "2"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in (0, 1)
    ]
    assert [h.wait() for h in halves] == [0, 0]
    plain2 = time.perf_counter() - start
    tune2, _ = timed([sys.executable, "-m", "distmis", "tune", str(files[2]), "--out", str(work / "t2")], env)
    phase2 = trial_phase(trials_detail(work / "t2"))
    print(f"{'distmis tune, 2 concurrent trials':36s}{tune2:10.1f} s{phase2:12.1f} s")
    print(f"{'speed-up tune-1 / tune-2 (>= 1.85)':36s}{tune1 / tune2:11.2f}x{phase1 / phase2:13.2f}x")
    print(
        f"{'host ceiling: 2 plain processes at once':36s}{plain2:10.1f} s  -> speed-up {plain / plain2:.2f}x without Ray"
    )
    rows += [
        {"run": "distmis tune, 2 concurrent trials", "end to end (s)": tune2, "trial phase (s)": phase2},
        {"run": "host ceiling: 2 plain processes at once", "end to end (s)": plain2, "trial phase (s)": None},
    ]
    write_report(args.out, "tune_overhead", title=title, rows=rows, echo=False)


if __name__ == "__main__":
    main()
