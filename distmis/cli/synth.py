"""Write a synthetic MSD Task01_BrainTumour-style dataset (dataset.json, imagesTr, labelsTr, imagesTs)."""

from __future__ import annotations

import argparse

from distmis.cli._common import progress, shape3
from distmis.exceptions import DataError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="output directory (must not exist unless --overwrite)")
    p.add_argument("--cases", type=int, default=24, help="training cases (default 24)")
    p.add_argument("--test-cases", type=int, default=2, help="unlabelled test cases (default 2)")
    p.add_argument("--shape", type=shape3, default=(32, 32, 32), help="volume shape X,Y,Z (default 32,32,32)")
    p.add_argument("--modalities", type=int, default=4, help="channels (default 4: FLAIR,T1w,t1gd,T2w)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")


def run(args: argparse.Namespace) -> int:
    from distmis.data import write_synthetic_msd

    if args.cases < 2 or args.modalities < 1 or args.test_cases < 0:
        raise DataError("--cases must be >= 2, --modalities >= 1, --test-cases >= 0")
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
    except FileExistsError:
        raise DataError(f"{args.out}: already exists; remove it or pass --overwrite") from None
    except PermissionError as exc:
        raise DataError(f"{args.out}: not writable ({exc})") from None
    print(f"wrote {args.cases} training + {args.test_cases} test cases to {out}")
    return 0
