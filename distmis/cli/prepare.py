"""Preprocess an MSD dataset (driven by its dataset.json) into one chunked, compressed array per case and an info.json record.

Per-channel z-score over non-zero voxels, crop/pad or trilinear resize to --shape, binary or
multi-class labels, a deterministic train/val/test split. Written to a temporary directory
and renamed into place, so a failed or interrupted run leaves no OUT behind.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from distmis.cli._common import (
    fractions3,
    nonnegative_int,
    normalization_option,
    positive_int,
    regions_option,
    shape3,
)
from distmis.config import PrepareConfig
from distmis.console import progress_bar as progress
from distmis.exitcodes import KEYBOARD_INTERRUPT

if TYPE_CHECKING:
    from distmis.data import PreparedInfo

#: the options that are ``data.prepare``'s fields (the others say where and how to run)
_OPTION_FIELDS = ("shape", "resize", "label_mode", "split", "seed", "normalization")


def _default(field: str, sep: str | None = None) -> str:
    """A ``data.prepare`` default as the option is written."""
    value = PrepareConfig.model_fields[field].default
    return sep.join(str(v) for v in value) if sep else str(value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="MSD dataset directory (holding dataset.json)")
    p.add_argument("out", help="output directory for the prepared dataset")
    p.add_argument(
        "--shape", type=shape3, default=None, help=f"output volume shape X,Y,Z (default {_default('shape', ',')})"
    )
    p.add_argument(
        "--resize",
        choices=["crop_pad", "resample"],
        default=None,
        help=f"how to reach --shape (default {_default('resize')})",
    )
    p.add_argument(
        "--label-mode",
        choices=["binary", "multiclass", "regions"],
        default=None,
        help="binary (any label > 0), multiclass (one class per label value) or regions (one per --regions); "
        f"default {_default('label_mode')}",
    )
    p.add_argument(
        "--regions",
        type=regions_option,
        default=None,
        help="regions to train (--label-mode regions) or report: msd_task01 (WT, TC, ET), brats21 (the same on labels 1, 2, 4) or 'WT=1,2,3;TC=2,3;ET=3'",
    )
    p.add_argument(
        "--split", type=fractions3, default=None, help=f"train,val,test fractions (default {_default('split', ',')})"
    )
    p.add_argument("--seed", type=nonnegative_int, default=None, help=f"split seed (default {_default('seed')})")
    p.add_argument("--processes", type=positive_int, default=None, help="parallel processes (default: all cores)")
    p.add_argument(
        "--normalization",
        type=normalization_option,
        default=None,
        help="per channel: auto (default: CT clipped to the training foreground's 0.5-99.5 percentiles and "
        "z-scored with its mean and std, every other modality z-scored per case), zscore, ct or none; "
        "one for all channels or a comma-separated list, one per channel",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT (only one distmis wrote)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted prepare with the same options, keeping the cases it completed",
    )


def run(args: argparse.Namespace) -> int:
    try:
        with progress("preparing cases") as update:
            info = _prepare(args, update)
    except KeyboardInterrupt:
        import shlex
        import sys

        again = shlex.join(["distmis", "prepare", *sys.argv[2:]] + ([] if args.resume else ["--resume"]))
        print(f"distmis: interrupted; the finished cases are kept: {again} prepares the rest", file=sys.stderr)
        return KEYBOARD_INTERRUPT
    from distmis.data import describe_normalisation

    counts = ", ".join(f"{name} {split.num_cases}" for name, split in info.splits.items())
    print(f"prepared {info.source.name} -> {args.out} ({counts}; shape {list(info.shape)})")
    for line in describe_normalisation(info.preprocessing.normalisation_spec, info.modalities):
        print(f"  normalisation {line}")
    return 0


def prepare_options(args: argparse.Namespace) -> PrepareConfig:
    """``data.prepare`` from the options given: the search file's model validates them, and its
    defaults fill the others, so the command line and the file cannot disagree."""
    from pydantic import ValidationError

    from distmis.documents import validation_problems
    from distmis.exceptions import ConfigError

    given = {name: getattr(args, name) for name in _OPTION_FIELDS if getattr(args, name) is not None}
    try:
        return PrepareConfig(**given)
    except ValidationError as exc:
        loc, msg = validation_problems(exc)[0]
        raise ConfigError(f"--{str(loc[0]).replace('_', '-') if loc else 'prepare'}: {msg}") from None


def _prepare(args: argparse.Namespace, update: Any) -> PreparedInfo:
    from distmis.data import prepare_dataset

    return prepare_dataset(
        args.src,
        args.out,
        prepare_options(args),
        regions=args.regions,
        workers=args.processes,
        overwrite=args.overwrite,
        resume=args.resume,
        progress=update,
    )
