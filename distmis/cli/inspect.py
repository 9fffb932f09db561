"""Fingerprint an MSD dataset before training, as nnU-Net does: per case shape, spacing and
orientation; per modality the foreground intensity percentiles; per label its share of the
voxels and of the cases. Warns about anisotropic or inconsistent spacing, mixed orientations
and rare labels, and suggests a prepared shape and training patch for --gpu-memory. Writes
fingerprint.json and overview.png."""

from __future__ import annotations

import argparse
from pathlib import Path

from distmis.cli._common import positive_float, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    from distmis.recipes import DEFAULT_RECIPE, RECIPES

    p.add_argument("src", help="MSD dataset directory (holding dataset.json)")
    p.add_argument("--out", default=None, help="output directory (default runs/inspect-<dataset directory name>)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier fingerprint directory")
    p.add_argument(
        "--gpu-memory",
        type=positive_float,
        default=None,
        help="accelerator memory in GiB: also suggest the largest training patch that fits",
    )
    p.add_argument(
        "--depth",
        type=positive_int,
        default=None,
        help="U-Net levels the suggestion assumes (default: the recipe's levels for the median shape, as init plans)",
    )
    p.add_argument(
        "--filters",
        type=positive_int,
        default=None,
        help="U-Net base filters the suggestion assumes (default: the recipe's)",
    )
    p.add_argument("--batch", type=positive_int, default=2, help="batch per replica the suggestion assumes")
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default=DEFAULT_RECIPE,
        help=f"the recipe `distmis init --recipe` would plan with (default {DEFAULT_RECIPE}): its pooling rule "
        "and widths",
    )
    p.add_argument("--processes", type=positive_int, default=None, help="parallel processes (default: all cores)")


def run(args: argparse.Namespace) -> int:
    from distmis.console import progress_bar as progress
    from distmis.data import fingerprint, overview_png
    from distmis.files import atomic_directory, check_output, check_replaceable, write_json_atomic

    src = Path(args.src)
    out = Path(args.out or f"runs/inspect-{src.resolve().name}")
    check_output(out, option="--out", inputs={"source dataset": src})
    check_replaceable(out, option="--out", overwrite=args.overwrite)
    with progress("reading cases") as update:
        fp = fingerprint(
            src,
            gpu_memory_gb=args.gpu_memory,
            depth=args.depth,
            filters=args.filters,
            batch=args.batch,
            recipe=args.recipe,
            workers=args.processes,
            progress=update,
        )
    with atomic_directory(out, command="inspect", overwrite=args.overwrite, option="--out") as tmp:
        write_json_atomic(tmp / "fingerprint.json", fp)
        overview_png(fp, tmp / "overview.png")
    s = fp["suggestion"]
    print(
        f"{fp['dataset']}: {fp['cases']} cases, median shape {fp['median_shape']}, median spacing "
        f"{[round(v, 3) for v in fp['median_spacing_mm']]} mm, orientation {', '.join(fp['orientations'])}"
    )
    for modality, scheme in fp["normalization"].items():
        row = fp["intensity_foreground"][modality]
        how = (
            f"ct: clipped to {row['p00_5']:.4g}..{row['p99_5']:.4g}, z-scored with mean {row['mean']:.4g}, std "
            f"{row['std']:.4g} (foreground; prepare takes them from the training split)"
            if scheme == "ct"
            else "zscore per case over non-zero voxels"
        )
        print(f"  channel {modality}: {how} (override: distmis prepare --normalization)")
    for name, row in fp["labels"].items():
        print(
            f"  label {name} {row['name']}: {100 * row['voxel_fraction']:.2f}% of voxels, in "
            f"{row['cases_with_label']}/{fp['cases']} cases"
        )
    print(
        f"  suggested ({s['recipe']} recipe, depth {s['depth']}, {s['filters']} filters): "
        f"prepare.shape {s['prepare_shape']}"
        + (
            f", train.patch {s['train_patch']} (~{s['estimated_gb']} GiB at batch {s['batch_size_per_replica']})"
            if s.get("gpu_memory_gb")
            else " (give --gpu-memory for a patch)"
        )
        + (f", model.pools {s['pools']} and model.kernels {s['kernels']} (anisotropic spacing)" if "pools" in s else "")
    )
    for warning in fp["warnings"]:
        print(f"distmis: warning: {warning}")
    print(f"fingerprint: {out / 'fingerprint.json'}, {out / 'overview.png'}")
    return 0
