"""Turn a finished search into a model to trust: train its --top K configurations on --folds F
cross-validation folds of the training and validation cases (the test split is never used), as
trials on one Ray with the search's own parallelism; choose the configuration (or pair) with the
best cross-validated Dice, and the post-processing that helps it; report each configuration's
value in the search next to its cross-validated mean (the selection bias); and write RUN/final/,
an ensemble of the chosen fold models that predict and evaluate take wherever they take best/.
Resumable (--resume; SIGUSR1 under SLURM checkpoints and exits 75). Then:
distmis evaluate RUN/final --split test gives the one honest test score."""

from __future__ import annotations

import argparse
from pathlib import Path

from distmis.cli._common import nonnegative_int, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a finished search directory (distmis tune's --out), or a comparison's mode directory")
    p.add_argument(
        "--top",
        type=positive_int,
        default=None,
        help="configurations to cross-validate, best first (default: the search file's finalize.top, else 2)",
    )
    p.add_argument(
        "--folds",
        type=positive_int,
        default=None,
        help="cross-validation folds (default: the search file's finalize.folds, else 5, as nnU-Net)",
    )
    p.add_argument(
        "--seed",
        type=nonnegative_int,
        default=None,
        help="how cases are dealt into folds (default: the search file's finalize.seed, else 0)",
    )
    p.add_argument(
        "--out", default=None, help="the finalize's directory (default RUN/finalize; the model goes to RUN/final)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted finalize with its recorded choices (finished folds are kept; a different --top, --folds, --seed or --no-* is refused)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace RUN/final when an earlier finalize wrote it (checked before any fold trains)",
    )
    p.add_argument("--address", default=None, help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the search's own store)")
    p.add_argument(
        "--no-tta", action="store_true", help="no test-time mirroring in the out-of-fold predictions and final/"
    )
    p.add_argument(
        "--no-pairs",
        action="store_true",
        help="do not consider ensembles of two configurations (also the search file's finalize.pairs: false)",
    )
    p.add_argument(
        "--no-postprocess", action="store_true", help="do not consider keeping the largest connected component"
    )
    p.add_argument("--verbose", action="store_true", help="Ray Tune's own output on the console")


def run(args: argparse.Namespace) -> int:
    from distmis import exitcodes
    from distmis.finalize import FinalizeOptions, run_finalize
    from distmis.tuning import stop_on_walltime_warning

    stop_on_walltime_warning()
    options = FinalizeOptions(
        run=Path(args.run),
        top=args.top,
        folds=args.folds,
        seed=args.seed,
        out=Path(args.out) if args.out else None,
        resume=args.resume,
        overwrite=args.overwrite,
        # None: not given (the default, or on --resume the recorded finalize's choice)
        tta=False if args.no_tta else None,
        pairs=False if args.no_pairs else None,
        postprocess=False if args.no_postprocess else None,
    )
    result = run_finalize(
        options, address=args.address, tracking_uri=args.tracking_uri, verbose=1 if args.verbose else 0
    )
    if result.interrupted:
        return exitcodes.INTERRUPTED
    if result.failed_folds:
        import sys

        print("distmis: error: fold trainings failed; nothing was chosen:", file=sys.stderr, flush=True)
        for fold in result.failed_folds:
            print(f"  {fold}", file=sys.stderr, flush=True)
        print(f"continue with: distmis finalize {args.run} --resume", file=sys.stderr, flush=True)
        return exitcodes.FAILED
    assert result.selection is not None
    print(f"report: {result.out / 'report.html'} (also report.md, cv.csv, plots/)")
    print(
        f"model: {result.final} ({' + '.join(result.selection.members)}; test it: distmis evaluate {result.final} --split test)"
    )
    return exitcodes.OK
