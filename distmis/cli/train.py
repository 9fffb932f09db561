"""Train one configuration (no search): per-epoch metrics printed and written to metrics.csv,
a checkpoint every epoch, the best weights kept; --resume continues from the last checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="configuration YAML (sections name, data, train, model, optimizer)")
    p.add_argument("--out", default=None, help="run directory (default runs/<name>-train)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    p.add_argument("--epochs", type=int, default=None, help="override train.epochs")


def run(args: argparse.Namespace) -> int:
    from distmis.config import load_config
    from distmis.exceptions import TrainingError
    from distmis.training import CHECKPOINT_DIR, configure_tensorflow

    config = load_config(args.config)
    if args.epochs is not None:
        config.train.epochs = args.epochs
    out = Path(args.out or f"runs/{config.name}-train")
    checkpoint = out / CHECKPOINT_DIR
    if checkpoint.exists() and not args.resume:
        raise TrainingError(f"{out}: already holds a training run; pass --resume to continue it or choose another --out")
    if args.resume and not checkpoint.exists():
        raise TrainingError(f"{out}: no checkpoint to resume from")

    configure_tensorflow(config.train.threads)
    from distmis.data import resolve_prepared
    from distmis.training import fit

    prepared = resolve_prepared(config.data, base_dir=Path(args.config).resolve().parent)
    print(f"data: {prepared}")
    result = fit(
        config,
        prepared,
        out,
        resume_from=checkpoint if args.resume else None,
        metric=config.search.metric,
        mode=config.search.mode,
        log=print,
    )
    if result.best:
        print(
            f"best epoch {int(result.best['epoch'])}: {config.search.metric} {result.best[config.search.metric]:.4f}"
        )
    print(f"run directory: {out} (metrics.csv, checkpoint/, best/)")
    return 0
