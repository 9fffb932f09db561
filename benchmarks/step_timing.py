"""How far ``distmis init --budget``'s timed step is from the step a trial then takes, before and now.

init sizes a search from the seconds of one step, timed here. Each repeat below steps the planned
network (distmis's recipe) in as many processes at once as the search runs trials, for ``--window``
seconds, and reads three figures from the same steps, side by side:

- **before**: the median of the first 3 steps (init's timing until it changed);
- **now**: the lower quartile of the first :data:`distmis.training.TIMED_SECONDS` seconds of steps
  (:func:`distmis.training.steady_step_seconds`, init's timing now);
- **steady**: the median of the window's second half, the speed a trial runs at once any spell at the
  start is over.

Each figure is the median over the processes, as init takes it. ``--spell S`` runs a busy process
for the first S seconds of each timed window: a slow spell of the machine (another tenant, the
search that just ended) of a known length, where a repeat without it meets only the machine's own.

    python benchmarks/step_timing.py [--repeats 6] [--spell 0] [--window 30] [--patch 48 56 48] [--channels 2] [--classes 3] [--processes 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchlib import add_out_option, write_report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BURN = "import time\nend = time.perf_counter() + {seconds}\nwhile time.perf_counter() < end:\n    pass\n"


def _stepping(threads: int, kwargs: dict[str, Any], ready: Any, results: Any) -> None:
    """One trial's process (spawned: TensorFlow fresh in each): its step seconds over the window."""
    from distmis.training import configure_tensorflow, measure_step_samples

    configure_tensorflow(threads)
    results.put(measure_step_samples(**kwargs, ready=ready))


def one_repeat(kwargs: dict[str, Any], processes: int, threads: int, spell: float) -> list[list[float]]:
    """Every process's step seconds for one window, with a busy process over its first ``spell`` s."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(processes + 1), ctx.Queue()  # this process starts the spell on it
    children = [ctx.Process(target=_stepping, args=(threads, kwargs, ready, results)) for _ in range(processes)]
    for child in children:
        child.start()
    ready.wait(timeout=900)
    burner = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=spell)]) if spell > 0 else None
    samples = [results.get(timeout=900) for _ in children]
    for child in children:
        child.join(timeout=60)
    if burner is not None:
        burner.wait()
    return samples


def figures(samples: list[float], timed_seconds: float) -> dict[str, float]:
    """before, now and steady, from one process's steps (see the module's docstring)."""
    from distmis.training import MIN_TIMED_STEPS, steady_step_seconds

    elapsed, first = 0.0, 0
    while first < len(samples) and (first < MIN_TIMED_STEPS or elapsed < timed_seconds):
        elapsed += samples[first]
        first += 1
    return {
        "before": statistics.median(samples[:3]),
        "now": steady_step_seconds(samples[:first]),
        "steady": statistics.median(samples[len(samples) // 2 :]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=6, help="windows timed, one after another")
    p.add_argument("--spell", type=float, default=0.0, help="seconds of a busy process at each window's start")
    p.add_argument("--window", type=float, default=30.0, help="seconds each process steps for")
    p.add_argument("--patch", type=int, nargs=3, default=[48, 56, 48])
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--classes", type=int, default=3, help="softmax outputs, background included")
    p.add_argument("--processes", type=int, default=2, help="trials stepping at once")
    add_out_option(p, "step_timing")
    a = p.parse_args()
    from distmis.config import ModelConfig, OptimizerConfig
    from distmis.recipes import DISTMIS
    from distmis.training import TIMED_SECONDS

    cores = os.cpu_count() or 1
    depth = DISTMIS.depth(min(a.patch))
    kwargs = {
        "model_config": ModelConfig(**{**DISTMIS.model, "depth": depth}),
        "optimizer_config": OptimizerConfig(**DISTMIS.optimizer),
        "patch": tuple(a.patch),
        "channels": a.channels,
        "classes": a.classes,
        "batch": 2,
        "seconds": a.window,
    }
    threads = max(1, cores // a.processes)
    rows = []
    for repeat in range(a.repeats):
        started = time.time()
        per_process = [figures(s, TIMED_SECONDS) for s in one_repeat(kwargs, a.processes, threads, a.spell)]
        row: dict[str, Any] = {"repeat": repeat}
        for name in ("before", "now", "steady"):
            row[f"{name} s"] = round(statistics.median(f[name] for f in per_process), 3)
        row["before / steady"] = round(row["before s"] / row["steady s"], 3)
        row["now / steady"] = round(row["now s"] / row["steady s"], 3)
        print(f"  repeat {repeat}: {row} ({time.time() - started:.0f} s)", flush=True)
        rows.append(row)
    summary = {
        name: {
            "median": statistics.median(r[name] for r in rows),
            "min": min(r[name] for r in rows),
            "max": max(r[name] for r in rows),
        }
        for name in ("before / steady", "now / steady")
    }
    title = (
        f"init's timed step against the steady one: distmis's recipe, depth {depth}, patch {a.patch}, "
        f"{a.processes} process(es) at once on {cores} cores, a busy spell of {a.spell:g} s, {a.repeats} repeats"
    )
    write_report(a.out, "step_timing", title=title, rows=rows, data={"summary": summary})
    for name, s in summary.items():
        print(f"{name}: median {s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]")


if __name__ == "__main__":  # the stepping processes are spawned: they import this file again
    main()
