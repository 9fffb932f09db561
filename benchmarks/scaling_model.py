"""A documented model of experiment vs data parallelism at 4-32 GPUs, fed by measured costs.

This is a MODEL, not a measurement: it extrapolates a few costs measured on this host (or on
yours) to cluster sizes we cannot run here, and says which assumptions it makes. The DistMIS
paper's measured x12-14 speed-up of experiment parallelism on 32 GPUs is drawn as the
reference line.

Measured inputs (``--from-compare DIR`` reads them from a ``distmis compare`` directory; the
defaults are this host's figures from ``benchmarks/tune_overhead.py``/``data_parallel.py``):

  s_trial   start-up of a single-worker trial (process, TF import, model build), s
  e         one epoch of one trial on one worker, s
  steps     optimizer steps in that epoch (1 worker)
  s_dp      start-up of a data-parallel trial (Ray Train worker group), s
  c_sync    synchronisation cost per step with 2 workers (all-reduce of the gradients), s
  F         fixed cost per search (Ray start, tracking, summary), s

Model, for T trials of E epochs on N workers:

  sequential     T_seq  = F + sum of the T trial lengths (mean s_trial + E e, spread by --cv)
  experiment     T_exp  = F + makespan of T trials (s_trial + E e, spread by --cv) list-scheduled on N
                 (load imbalance from unequal trials is the only loss: trials share nothing)
  data           T_data = F + T (s_dp + E (e / N + steps / N * c(N)))         strong scaling
                 c(N)   = c_sync * (2 (N-1) / N) / 1  [ring all-reduce: bandwidth term]
                          * inter   when N > gpus_per_node (crossing nodes: slower links)
                          + alpha * log2(N)             [latency term]

Assumptions: perfect strong scaling of the compute (e / N: no smaller-batch inefficiency), no
accuracy change from the larger global batch, one trial at a time in data mode, identical
nodes. Every one is optimistic for data parallelism except the all-reduce model.

    python benchmarks/scaling_model.py [--from-compare runs/compare-quickstart] [--trials 32] [--epochs 20]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
from pathlib import Path
from typing import Any

from benchlib import add_out_option, write_report

from distmis.exceptions import TuningError
from distmis.search_summary import read_search_summary


def list_schedule(durations: list[float], workers: int) -> float:
    """Makespan of greedy list scheduling (each trial to the first free worker, in order)."""
    free = [0.0] * workers
    for d in durations:
        i = min(range(workers), key=free.__getitem__)
        free[i] += d
    return max(free)


def trial_durations(trials: int, mean: float, cv: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    if cv <= 0:
        return [mean] * trials
    sigma = math.sqrt(math.log(1 + cv**2))
    mu = math.log(mean) - sigma**2 / 2  # lognormal with the given mean and coefficient of variation
    return [rng.lognormvariate(mu, sigma) for _ in range(trials)]


def sync_cost(n: int, c2: float, *, alpha: float, inter: float, gpus_per_node: int) -> float:
    if n <= 1:
        return 0.0
    bandwidth = c2 * (2 * (n - 1) / n)  # ring all-reduce moves 2(N-1)/N of the gradient bytes; N=2 -> c2
    if n > gpus_per_node:
        bandwidth *= inter
    return bandwidth + alpha * math.log2(n)


def model(
    p: dict[str, float], n: int, trials: int, epochs: int, cv: float, alpha: float, inter: float, gpus_per_node: int
) -> dict[str, float]:
    per_trial = p["s_trial"] + epochs * p["e"]
    durations = trial_durations(trials, per_trial, cv)
    t_seq = p["F"] + sum(durations)
    t_exp = p["F"] + list_schedule(durations, n)
    c = sync_cost(n, p["c_sync"], alpha=alpha, inter=inter, gpus_per_node=gpus_per_node)
    # the same trials (their spread scaled to the data-parallel trial length)
    t_data = p["F"] + sum(d / per_trial for d in durations) * (p["s_dp"] + epochs * (p["e"] / n + p["steps"] / n * c))
    return {
        "n": n,
        "t_seq": t_seq,
        "exp_speedup": t_seq / t_exp,
        "data_speedup": t_seq / t_data,
        "exp_eff": t_seq / t_exp / n,
        "data_eff": t_seq / t_data / n,
        "sync_per_step_ms": c * 1e3,
    }


def from_compare(directory: Path) -> dict[str, float]:
    """Measured costs from a comparison: the baseline (1 worker) and the data mode (k workers)."""
    comp = json.loads((directory / "comparison.json").read_text())
    stats = {m["mode"]: m for m in comp["modes"]}
    k = stats["data"]["workers_per_trial"]

    def epochs_of(mode: str) -> list[tuple[dict, list[dict]]]:
        summary = read_search_summary(directory / mode, error=TuningError)
        out = []
        for t in (trial.model_dump() for trial in summary.trials_detail):
            with open(directory / mode / "trials" / t["trial_id"] / "metrics.csv") as fh:
                out.append((t, list(csv.DictReader(fh))))
        return out

    base, data = epochs_of("baseline"), epochs_of("data")
    later = [r for _, rows in base for r in rows[1:]] or [
        r for _, rows in base for r in rows
    ]  # epoch 1 includes tracing
    e = sum(float(r["epoch_seconds"]) for r in later) / len(later)
    startup = [(t["finished_at"] - t["started_at"]) - sum(float(r["epoch_seconds"]) for r in rows) for t, rows in base]
    startup_dp = [
        (t["finished_at"] - t["started_at"]) - sum(float(r["epoch_seconds"]) for r in rows) for t, rows in data
    ]

    # per-step times: samples/s * train_seconds / global batch = steps; same per-replica batch in both
    def per_step(rows: list[dict], batch: int) -> float:
        steps = sum(float(r["samples_per_second"]) * float(r["train_seconds"]) / batch for r in rows)
        return sum(float(r["train_seconds"]) for r in rows) / max(steps, 1e-9)

    b = stats["baseline"]["global_batch"]
    t1 = per_step(later, b)
    data_later = [r for _, rows in data for r in rows[1:]] or [r for _, rows in data for r in rows]
    tk = per_step(data_later, stats["data"]["global_batch"])
    # k workers each compute a batch-b step; what a k-worker step costs beyond one batch-b step is synchronisation
    c_k = max(tk - t1, 0.0)
    c2 = c_k / (2 * (k - 1) / k) if k > 1 else c_k
    steps = float(later[0]["samples_per_second"]) * float(later[0]["train_seconds"]) / b
    return {
        "s_trial": max(sum(startup) / len(startup), 0.0),
        "e": e,
        "steps": steps,
        "s_dp": max(sum(startup_dp) / len(startup_dp), 0.0),
        "c_sync": c2,
        "F": stats["baseline"]["wall_seconds"] - stats["baseline"]["trial_phase_seconds"],
    }


# This host's measured figures (README / session notes): quickstart 32^3 trial start-up ~2.5 s,
# 0.67 s per epoch with 6 steps, Train worker group start ~25 s, 14.8 ms sync per step at 2 workers.
DEFAULTS = {"s_trial": 2.5, "e": 0.67, "steps": 6.0, "s_dp": 25.0, "c_sync": 0.0148, "F": 8.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-compare", type=Path, default=None, help="a distmis compare directory to take costs from")
    ap.add_argument("--trials", type=int, default=32, help="trials in the search (DistMIS: a 32-point grid)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--cv", type=float, default=0.25, help="spread of trial durations (coefficient of variation)")
    ap.add_argument("--alpha-ms", type=float, default=0.05, help="all-reduce latency per log2(N) step, ms")
    ap.add_argument("--inter", type=float, default=4.0, help="slow-down of all-reduce across nodes")
    ap.add_argument("--gpus-per-node", type=int, default=4)
    add_out_option(ap, "scaling_model")
    for key in DEFAULTS:
        ap.add_argument(f"--{key.replace('_', '-')}", type=float, default=None, help=f"override {key}")
    args = ap.parse_args()
    params = from_compare(args.from_compare) if args.from_compare else dict(DEFAULTS)
    for key in DEFAULTS:
        value = getattr(args, key)
        if value is not None:
            params[key] = value
    print(
        "MODEL (not a measurement). Inputs"
        + (f" measured in {args.from_compare}" if args.from_compare else " measured on this host earlier")
        + ":"
    )
    for k, v in params.items():
        print(f"  {k:<8} {v:.4g}")
    print(
        f"  {args.trials} trials x {args.epochs} epochs, trial-length cv {args.cv}, {args.gpus_per_node} GPUs/node, "
        f"inter-node all-reduce x{args.inter}, latency {args.alpha_ms} ms/log2 N\n"
    )
    rows = [
        model(params, n, args.trials, args.epochs, args.cv, args.alpha_ms / 1e3, args.inter, args.gpus_per_node)
        for n in (1, 2, 4, 8, 16, 32)
    ]
    print(f"{'GPUs':>5} {'experiment speed-up':>20} {'eff.':>5} {'data speed-up':>14} {'eff.':>5} {'sync/step ms':>13}")
    for r in rows:
        print(
            f"{r['n']:>5} {r['exp_speedup']:>19.2f}x {r['exp_eff']:>5.2f} {r['data_speedup']:>13.2f}x "
            f"{r['data_eff']:>5.2f} {r['sync_per_step_ms']:>13.2f}"
        )

    def draw(fig: Any) -> None:
        plot_speedups(fig.add_subplot(), rows)

    title = "MODEL of search speed-up from measured per-trial, per-epoch and sync costs"
    write_report(args.out, "scaling_model", title=title, rows=rows, data={"inputs": params}, figure=draw, echo=False)


def plot_speedups(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Both modes' modelled speed-up against the number of GPUs, with the DistMIS paper's measurement."""
    ns = [r["n"] for r in rows]
    ax.plot(ns, ns, ":", color="black", label="ideal")
    ax.plot(ns, [r["exp_speedup"] for r in rows], "o-", label="experiment parallelism (model)")
    ax.plot(ns, [r["data_speedup"] for r in rows], "s-", color="#d62728", label="data parallelism (model)")
    ax.fill_between(
        [28, 32], 12, 14, color="#2ca02c", alpha=0.35, label="DistMIS paper: x12-14 at 32 GPUs (measured there)"
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("GPUs (workers)")
    ax.set_ylabel("speed-up of the whole search")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


if __name__ == "__main__":
    main()
