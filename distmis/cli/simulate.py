"""Simulate searches on recorded learning curves: the searcher and scheduler that `distmis tune` builds
from each file, driven on a virtual clock with K concurrent trials, over seeds.

The curves come from a curve table (CSV or CSV.gz, see docs) or straight from finished search
directories (a pilot search run without a scheduler). A configuration the curves do not hold is
answered by its nearest recorded neighbour. Writes summary.md, summary.json and best_so_far.png.

  distmis simulate random.yaml tpe.yaml --curves benchmarks/curves/anatomy32.csv.gz --workers 32 --samples 128
  # the same on the clock of a short pilot search run on the cluster to simulate
  distmis simulate random.yaml --curves benchmarks/curves/anatomy32.csv.gz --clock-of runs/pilot --workers 32
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("search", nargs="+", help="search-space file(s); each is one method")
    p.add_argument(
        "--curves", nargs="+", required=True, metavar="PATH", help="curve table(s) or finished search director(ies)"
    )
    p.add_argument("--workers", type=int, required=True, metavar="K", help="trials at once")
    p.add_argument("--samples", type=int, default=None, metavar="N", help="trials per search (default: the file's)")
    p.add_argument("--seeds", type=int, default=10, metavar="S", help="seeds per search (default 10)")
    p.add_argument(
        "--target", type=float, default=None, help="target of the search metric (default: the first file's median best)"
    )
    p.add_argument(
        "--match-training-seed",
        action="store_true",
        help="replay the curves recorded with each file's train.seed where held (else, and without it, "
        "every trial of one simulated search replays one recorded seed, drawn for that search)",
    )
    p.add_argument(
        "--clock-of",
        nargs="+",
        default=None,
        metavar="PATH",
        help="finished search director(ies) or curve table(s) on the hardware to simulate: the curves' first "
        "epochs, later epochs and start-ups are each divided by their median ratio to these (epochs matched "
        "by architecture: filters, depth, batch size, norm; each --curves by its own ratios), and the seconds a trial reports between two "
        "epochs are theirs; default: the curves' own seconds (where they recorded none between two epochs, "
        "distmis's measured default, printed in the output's header)",
    )
    p.add_argument(
        "--driver-seconds",
        nargs=2,
        type=float,
        default=None,
        metavar=("PER_RESULT", "PER_TRIAL"),
        help="the Tune driver's own work per result and per trial, which queues at many trials with short "
        "epochs (default: distmis's measured figures for a Tune driver, printed in the output's header; "
        "0 0 leaves it out)",
    )
    p.add_argument("--out", default=None, help="output directory (default runs/simulate-<first file's name>)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier simulation's --out")
    p.add_argument(
        "--max-hours",
        type=float,
        default=1.0,
        metavar="H",
        help="refuse a simulation estimated to run longer than this on this machine (default 1)",
    )


def run(args: argparse.Namespace) -> int:
    from distmis.simulate import run_simulation

    files = [Path(f) for f in args.search]
    out = Path(args.out) if args.out else Path("runs") / f"simulate-{files[0].stem}"
    run_simulation(
        files,
        [Path(c) for c in args.curves],
        workers=args.workers,
        seeds=args.seeds,
        samples=args.samples,
        target=args.target,
        match_training_seed=args.match_training_seed,
        clock_of=[Path(c) for c in args.clock_of] if args.clock_of else None,
        driver_seconds=tuple(args.driver_seconds) if args.driver_seconds else None,
        out=out.resolve(),
        overwrite=args.overwrite,
        max_hours=args.max_hours,
    )
    return 0
