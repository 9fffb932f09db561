"""Preprocess an MSD dataset (driven by its dataset.json) into one chunked, compressed array per case and an info.json record.

Per-channel z-score over non-zero voxels, crop/pad or trilinear resize to --shape, binary or
multi-class labels, a deterministic train/val/test split. Written to a temporary directory
and renamed into place, so a failed or interrupted run leaves no OUT behind.
"""

from __future__ import annotations

import argparse
from typing import Any

from distmis.cli._common import (
    add_renamed_option,
    fractions3,
    nonnegative_int,
    normalization_option,
    positive_int,
    progress,
    regions_option,
    shape3,
)
from distmis.exitcodes import KEYBOARD_INTERRUPT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="MSD dataset directory (holding dataset.json)")
    p.add_argument("out", help="output directory for the prepared dataset")
    p.add_argument("--shape", type=shape3, default=(32, 32, 32), help="output volume shape X,Y,Z (default 32,32,32)")
    p.add_argument("--resize", choices=["crop_pad", "resample"], default="crop_pad", help="how to reach --shape")
    p.add_argument(
        "--label-mode",
        choices=["binary", "multiclass", "regions"],
        default="binary",
        help="binary (any label > 0), multiclass (one class per label value) or regions (one per --regions)",
    )
    p.add_argument(
        "--regions",
        type=regions_option,
        default=None,
        help="regions to train (--label-mode regions) or report: msd_task01 (WT, TC, ET) or 'WT=1,2,3;TC=2,3;ET=3'",
    )
    p.add_argument("--split", type=fractions3, default=(0.7, 0.15, 0.15), help="train,val,test fractions")
    # every case is its own file now; the option stays so that older scripts still run
    p.add_argument("--shards", type=positive_int, default=4, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=nonnegative_int, default=0, help="split seed")
    add_renamed_option(p, "--workers", "--processes", type=positive_int, help="parallel processes (default: all cores)")
    p.add_argument(
        "--normalization",
        type=normalization_option,
        default="auto",
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
            manifest = _prepare(args, update)
    except KeyboardInterrupt:
        import shlex
        import sys

        again = shlex.join(["distmis", "prepare", *sys.argv[2:]] + ([] if args.resume else ["--resume"]))
        print(f"distmis: interrupted; the finished cases are kept: {again} prepares the rest", file=sys.stderr)
        return KEYBOARD_INTERRUPT
    from distmis.data import describe_normalisation

    counts = ", ".join(f"{k} {v['num_cases']}" for k, v in manifest["splits"].items())
    print(f"prepared {manifest['source']['name']} -> {args.out} ({counts}; shape {manifest['shape']})")
    for line in describe_normalisation(manifest["preprocessing"]["channel_normalisation"], manifest["modalities"]):
        print(f"  normalisation {line}")
    return 0


def _prepare(args: argparse.Namespace, update: Any) -> dict[str, Any]:
    from distmis.data import prepare_dataset

    return prepare_dataset(
        args.src,
        args.out,
        shape=args.shape,
        resize=args.resize,
        label_mode=args.label_mode,
        split=args.split,
        resume=args.resume,
        seed=args.seed,
        workers=args.processes,
        overwrite=args.overwrite,
        progress=update,
        regions=args.regions,
        normalization=args.normalization,
    )
