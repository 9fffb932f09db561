"""Draw one prepared case: every channel and the label overlay, as PNG (slice with most tumour) or GIF (all slices)."""

from __future__ import annotations

import argparse

from distmis.cli._common import nonnegative_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prepared", help="prepared dataset directory (info.json)")
    p.add_argument("--case", type=nonnegative_int, default=0, help="index of the case in the split (default 0)")
    p.add_argument("--split", choices=["train", "val", "test"], default="train")
    p.add_argument("--out", default="sample.png", help="output .png or .gif (default sample.png)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing picture distmis wrote")


def run(args: argparse.Namespace) -> int:
    from distmis.data import render_case

    out = render_case(args.prepared, args.out, split=args.split, index=args.case, overwrite=args.overwrite)
    print(f"wrote {out}")
    return 0
