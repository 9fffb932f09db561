"""Write a synthetic MSD Task01_BrainTumour-style dataset (dataset.json, imagesTr, labelsTr, imagesTs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from distmis.cli._common import at_least_two, nonnegative_int, positive_int, shape3
from distmis.console import progress_bar as progress
from distmis.exceptions import DataError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="output directory (must not exist unless --overwrite)")
    p.add_argument("--cases", type=at_least_two, default=24, help="training cases (default 24)")
    p.add_argument("--test-cases", type=nonnegative_int, default=2, help="unlabelled test cases (default 2)")
    p.add_argument("--shape", type=shape3, default=(32, 32, 32), help="volume shape X,Y,Z (default 32,32,32)")
    p.add_argument("--modalities", type=positive_int, default=4, help="channels (default 4: FLAIR,T1w,t1gd,T2w)")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT (only one distmis wrote)")


MAX_SIDE = 1024  # a synthetic volume beyond this would only exhaust memory


def run(args: argparse.Namespace) -> int:
    from distmis.data import write_synthetic_msd
    from distmis.files import check_output, check_replaceable

    if max(args.shape) > MAX_SIDE:
        raise DataError(f"--shape: at most {MAX_SIDE} voxels per axis for synthetic data, got {list(args.shape)}")
    check_output(args.out, option="OUT")
    check_replaceable(Path(args.out), option="OUT", overwrite=args.overwrite)
    try:
        with progress("synthesising cases") as update:
            out = write_synthetic_msd(
                args.out,
                cases=args.cases,
                shape=args.shape,
                modalities=args.modalities,
                test_cases=args.test_cases,
                seed=args.seed,
                overwrite=args.overwrite,
                progress=update,
            )
    except PermissionError as exc:
        raise DataError(f"{args.out}: not writable ({exc})") from None
    print(f"wrote {args.cases} training + {args.test_cases} test cases to {out}")
    return 0
