"""Check a configuration / search-space YAML file without running anything."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML file")
    p.add_argument("--train-only", action="store_true", help="a `distmis train` config: an empty space is fine")


def run(args: argparse.Namespace) -> int:
    from distmis.config import load_config

    cfg = load_config(args.config, require_space=not args.train_only)
    if cfg.space:
        from distmis.tuning.space import describe_space

        print(describe_space(cfg))
    print(f"{args.config}: valid")
    return 0
