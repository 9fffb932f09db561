"""Run a hyperparameter search described by one search-space YAML file on Ray Tune."""

from __future__ import annotations

import argparse

from distmis.cli._common import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    from distmis.cli._common import ConfigKeysHelp

    p.formatter_class = ConfigKeysHelp
    p.add_argument("space", help="search-space YAML")
    p.add_argument("--out", default=None, help="experiment directory (default runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted search in --out")
    p.add_argument("--address", default=None, help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="Ray Tune's own per-trial tables and every process's output on the console (by default "
        "they go to <out>/tune.log and the console shows one live view)",
    )
    p.add_argument("--num-samples", type=positive_int, default=None, help="override search.num_samples")
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: tracking.uri, $MLFLOW_TRACKING_URI, else sqlite:///<out>/../mlflow.db)",
    )


def run(args: argparse.Namespace) -> int:
    from distmis.config import load_config
    from distmis.tuning import run_search, stop_on_walltime_warning

    stop_on_walltime_warning()
    config = load_config(args.space, require_space=True)
    if args.num_samples is not None:
        config.search.num_samples = args.num_samples
    summary = run_search(
        config,
        space_file=args.space,
        out=args.out,
        resume=args.resume,
        address=args.address,
        tracking_uri=args.tracking_uri,
        verbose=1 if args.verbose else 0,
    )
    from distmis import exitcodes

    if summary.interrupted:
        return exitcodes.INTERRUPTED
    if summary.ok and config.finalize.described():
        print(f"next, as the file plans: distmis finalize {summary.out} ({config.finalize.described()})", flush=True)
    return exitcodes.OK if summary.ok else exitcodes.FAILED
