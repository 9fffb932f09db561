"""Check a configuration / search-space file without running it: the YAML, every value the
search space can sample, the search settings, and the data it would train on (shape, splits)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML file")
    p.add_argument("--train-only", action="store_true", help="a `distmis train` config: an empty space is fine")
    p.add_argument("--no-data", action="store_true", help="do not read the data source (shape, split sizes)")


def run(args: argparse.Namespace) -> int:
    from distmis.config import load_config
    from distmis.preflight import preflight

    cfg = load_config(args.config, require_space=not args.train_only)
    facts = preflight(cfg, path=args.config, base_dir=Path(args.config).resolve().parent, check_data=not args.no_data)
    if cfg.space:
        from distmis.tuning.space import describe_space

        print(describe_space(cfg))
    if facts is not None:
        print(
            f"  data: {facts.source}: volumes {list(facts.shape)}, {facts.train} training / {facts.val} validation cases"
        )
    print(f"{args.config}: valid")
    return 0
