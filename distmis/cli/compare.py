"""Compare experiment, data and hybrid parallelism on your search space and resources: the same
configurations (fixed in advance) run under each mode on the same k worker slots, plus a
sequential 1-worker baseline on the first few to anchor speed-ups. Reports wall time,
speed-up and efficiency, trials/h, samples/s, time to a target metric and the best metric
reached per mode (report.md/html, PNGs, comparison.json), all under one MLflow run."""

from __future__ import annotations

import argparse

from distmis.cli._common import (
    finite_float,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)
from distmis.exitcodes import FAILED


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="search-space YAML (as for distmis tune)")
    p.add_argument(
        "--modes",
        default=None,
        help="comma-separated subset of experiment,data,hybrid (default all three)",
    )
    p.add_argument(
        "--budget", type=positive_int, default=None, help="configurations per mode (default search.num_samples)"
    )
    p.add_argument(
        "--slots",
        type=positive_int,
        default=None,
        help="k worker slots every mode gets (default: CPUs of the cluster or machine / --cpus-per-worker)",
    )
    p.add_argument(
        "--cpus-per-worker",
        type=positive_float,
        default=None,
        help="CPUs per slot (default parallelism.cpus_per_worker)",
    )
    p.add_argument(
        "--gpus-per-worker",
        type=nonnegative_float,
        default=None,
        help="GPUs per slot (default parallelism.gpus_per_worker)",
    )
    p.add_argument(
        "--hybrid-workers", type=positive_int, default=None, help="n workers per hybrid trial (default 2; k/n at once)"
    )
    p.add_argument(
        "--baseline-trials",
        type=nonnegative_int,
        default=None,
        help="configurations run sequentially on 1 worker to anchor speed-ups (default 2; 0: none)",
    )
    p.add_argument(
        "--lr-scaling",
        choices=("none", "linear"),
        default=None,
        help="linear: data and hybrid also run with the learning rate x workers per trial, reported "
        "next to the unscaled run (default none)",
    )
    p.add_argument(
        "--target",
        type=finite_float,
        default=None,
        help="metric value for time-to-target (default: the baseline's best)",
    )
    p.add_argument("--out", default=None, help="comparison directory (default runs/compare-<name>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted comparison in --out with its recorded options (another value is refused; "
        "--target may change)",
    )
    p.add_argument(
        "--address", default=None, help="Ray cluster address (default: $RAY_ADDRESS, else local Ray per mode)"
    )
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default as for distmis tune)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from distmis.compare import COLUMNS, run_compare, table_rows

    result = run_compare(
        args.space,
        modes=None if args.modes is None else [m.strip() for m in args.modes.split(",") if m.strip()],
        budget=args.budget,
        slots=args.slots,
        cpus_per_worker=args.cpus_per_worker,
        gpus_per_worker=args.gpus_per_worker,
        hybrid_workers=args.hybrid_workers,
        baseline_trials=args.baseline_trials,
        target=args.target,
        out=args.out,
        resume=args.resume,
        address=args.address,
        tracking_uri=args.tracking_uri,
        lr_scaling=args.lr_scaling,
    )
    table = Table(
        title=f"distmis compare (target {result.target if result.target is None else round(result.target, 4)})"
    )
    for c in COLUMNS:
        table.add_column(c, justify="right")
    for row in table_rows(result.stats):
        table.add_row(*row)
    Console().print(table)
    print(
        f"report: {result.out / 'report.html'} (also report.md, plots/, comparison.json; MLflow run "
        f"{result.mlflow_run_id})"
    )
    if not result.same_configurations:
        print("distmis: warning: the modes did not run identical configurations (see comparison.json)")
    if result.failed_modes:
        print(
            f"distmis: error: mode(s) {result.failed_modes} did not finish; see logs/ in {result.out}; "
            "rerun with --resume"
        )
        return FAILED
    return 0
