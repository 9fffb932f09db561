"""Train one configuration (no search): per-epoch metrics printed and written to metrics.csv,
a checkpoint every epoch, the best weights kept; --resume continues from the last checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from distmis.cli._common import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    from distmis.cli._common import ConfigKeysHelp

    p.formatter_class = ConfigKeysHelp
    p.add_argument("config", help="configuration YAML (sections name, data, train, model, optimizer)")
    p.add_argument("--out", default=None, help="run directory (default runs/<name>-train)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    p.add_argument("--epochs", type=positive_int, default=None, help="override train.epochs")


def run(args: argparse.Namespace) -> int:
    from distmis import exitcodes
    from distmis.config import load_config
    from distmis.exceptions import TrainingError
    from distmis.files import OutputClaim, check_output
    from distmis.locks import reader_lock
    from distmis.metrics import divergence
    from distmis.preflight import preflight
    from distmis.training import CHECKPOINT_DIR, configure_tensorflow

    config = load_config(args.config)
    if args.epochs is not None:
        config.train.epochs = args.epochs
    base_dir = Path(args.config).resolve().parent
    preflight(config, path=args.config, base_dir=base_dir)
    out = Path(args.out or f"runs/{config.name}-train")
    source = None if config.data.source == "synthetic" else base_dir / Path(config.data.source).expanduser()
    check_output(out, option="--out", inputs={"data source": source, "configuration file": args.config})
    checkpoint = out / CHECKPOINT_DIR
    if checkpoint.exists() and not args.resume:
        raise TrainingError(
            f"{out}: already holds a training run; pass --resume to continue it or choose another --out"
        )
    if args.resume and not checkpoint.exists():
        # e.g. the disk filled before the first epoch's checkpoint was written: start again
        raise TrainingError(f"{out}: no checkpoint to resume from; run it again without --resume to start over")

    configure_tensorflow(config.train.threads)
    from distmis.data import resolve_prepared, verify_cases
    from distmis.training import RunSession, format_epoch

    with (
        contextlib.ExitStack() as claim_stack,
        OutputClaim(out, command="train", option="--out", new=not args.resume) as claim,
    ):
        with claim.setting_up():  # bad data found while preparing it, or a checkpoint that does not fit
            prepared = resolve_prepared(config.data, base_dir=base_dir)
            claim_stack.enter_context(reader_lock(prepared, option="data.source"))  # no prepare replaces it meanwhile
            print(f"data: {prepared}")
            session = RunSession(
                config,
                prepared,
                out,
                resume_from=checkpoint if args.resume else None,
                metric=config.search.metric,
                mode=config.search.mode,
            )
            if session.manifest.cases("val"):  # a damaged validation case named now, not after an epoch
                verify_cases(session.manifest, "val")
            session.write_history()
        while not session.done:
            metrics = session.step()
            print(format_epoch(metrics, config.train.epochs), flush=True)
            diverged = divergence(metrics.as_dict(), config.search.metric)
            if diverged is not None:
                print(f"distmis: error: {out}: training {diverged}", file=sys.stderr)
                return exitcodes.FAILED
    if session.best:
        print(
            f"best epoch {int(session.best['epoch'])}: {config.search.metric} {session.best[config.search.metric]:.4f}"
        )
    print(f"run directory: {out} (metrics.csv, checkpoint/, best/)")
    return 0
