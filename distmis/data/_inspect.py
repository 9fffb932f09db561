"""A dataset fingerprint, as nnU-Net computes one before it plans anything.

Before choosing a volume shape, a patch or a normalisation, a researcher looks at the data:
per case its shape, voxel spacing and orientation; per modality the intensities inside the
labelled region (nnU-Net's CT normalisation uses the 0.5/99.5 percentiles of exactly that);
per label how much of the volume it covers and in how many cases it appears at all. The
fingerprint also warns about what breaks training silently: anisotropic or inconsistent
spacing (a model trained on 1 mm sees 3 mm cases as squashed), mixed orientations, labels
absent from most cases (a class the model can hardly learn), and suggests a prepared shape and
a training patch for a given accelerator memory, stating the rule used.

``distmis inspect SRC`` writes it as JSON and a PNG overview; ``distmis prepare`` stores it in
``info.json``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from distmis.data._normalize import channel_schemes
from distmis.recipes import (
    ANISOTROPIC_SPACING,
    DEFAULT_RECIPE,
    RECIPES,
    Topology,
    anisotropic_topology,
    level_scales,
    level_widths,
)

#: foreground voxels sampled per case and modality for the intensity percentiles (nnU-Net: 10 000)
SAMPLES_PER_CASE = 10_000
#: median spacing max/min beyond which a dataset is called anisotropic (nnU-Net's threshold)
ANISOTROPY_RATIO = 3.0
#: a case whose spacing differs from the median by more than this fraction is reported
SPACING_TOLERANCE = 0.1
#: a label present in fewer than this share of cases is reported
RARE_LABEL_SHARE = 0.5


def case_stats(
    case_id: str, image: np.ndarray, affine: np.ndarray, label: np.ndarray | None, seed: int = 0
) -> dict[str, Any]:
    """What the fingerprint needs from one case (small: sampled intensities, label voxel counts)."""
    import nibabel as nib

    spacing = [float(s) for s in np.linalg.norm(np.asarray(affine, dtype=float)[:3, :3], axis=0)]
    rng = np.random.default_rng(seed)
    foreground = label > 0 if label is not None else np.any(image != 0, axis=-1)
    samples = []
    for c in range(image.shape[-1]):
        values = image[..., c][foreground]
        if values.size > SAMPLES_PER_CASE:
            values = rng.choice(values, SAMPLES_PER_CASE, replace=False)
        samples.append(values.astype(np.float32))
    counts: dict[int, int] = {}
    if label is not None:
        values, n = np.unique(label, return_counts=True)
        counts = {int(v): int(k) for v, k in zip(values, n, strict=True)}
    return {
        "case_id": case_id,
        "shape": [int(s) for s in image.shape[:3]],
        "spacing": spacing,
        "orientation": "".join(nib.aff2axcodes(affine)),
        "voxels": int(np.prod(image.shape[:3])),
        "label_voxels": counts,
        "samples": samples,
    }


def _percentiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"p00_5": math.nan, "p50": math.nan, "p99_5": math.nan, "mean": math.nan, "std": math.nan}
    p = np.percentile(values, [0.5, 50, 99.5])
    return {
        "p00_5": float(p[0]),
        "p50": float(p[1]),
        "p99_5": float(p[2]),
        "mean": float(values.mean()),
        "std": float(values.std()),
    }


def activation_bytes(
    patch: tuple[int, int, int],
    *,
    depth: int,
    filters: int,
    batch: int,
    channels: int,
    bytes_per_value: int = 4,
    pools: list[tuple[int, int, int]] | None = None,
    max_filters: int | None = None,
) -> float:
    """Estimated training memory of the U-Net for one step (the rule stated in the fingerprint).

    Each level keeps about 12 feature maps of its width for the backward pass (2 convolutions,
    2 normalisations, 2 activations, in the encoder and again in the decoder), at 1/8 of the
    voxels per level down (or fewer halvings with ``pools``, nnU-Net's per-axis pooling of thick
    slices); gradients and workspace add about half again. A level is as wide as the model makes
    it (``max_filters`` caps it, as nnU-Net's 320 does), so a capped deep plan is not charged for
    maps it never builds.
    """
    voxels = float(np.prod(patch))
    shrink = [math.prod(scale) for scale in level_scales(depth, pools)]
    widths = level_widths(depth, filters, max_filters)
    maps = sum(12 * width * voxels / scale for width, scale in zip(widths, shrink, strict=True))
    return 1.5 * batch * (maps + channels * voxels) * bytes_per_value


def shrink_to_fit(
    shape: list[int],
    divisors: tuple[int, int, int],
    fits: Callable[[list[int]], bool],
    *,
    floor: list[int] | None = None,
) -> list[int]:
    """The whole ``shape`` if it fits, else the longest axis that can still shrink loses one divisor
    at a time until it does (or nothing can shrink: the caller checks ``fits`` again). nnU-Net's
    planner shrinks the same way, so a thick-slice volume keeps its few slices whole. No axis
    shrinks below its ``floor`` (default: a voxel)."""
    low = floor or [1, 1, 1]
    patch = list(shape)
    while not fits(patch):
        shrinkable = [axis for axis in range(3) if patch[axis] - divisors[axis] >= low[axis]]
        if not shrinkable:
            break
        axis = max(shrinkable, key=lambda a: patch[a])
        patch[axis] -= divisors[axis]
    return patch


def suggest(
    median_shape: list[int],
    channels: int,
    *,
    spacing: list[float] | None,
    gpu_memory_gb: float | None,
    depth: int | None,
    filters: int | None,
    batch: int,
    recipe: str = DEFAULT_RECIPE,
) -> dict[str, Any]:
    """A prepared shape (the median shape, rounded up to what the U-Net's levels can halve) and a
    patch (the median shape shrunk until it fits the memory budget), by the rules ``distmis init
    --recipe`` plans with: the recipe's levels for the median shape (or ``depth`` levels where given)
    and, where the spacing is anisotropic, nnU-Net's pooling and kernels per axis, so thick slices are
    not halved (a cube patch would be cut to the few slices' count). The memory estimate counts the
    recipe's base width (or ``filters``) and its width cap."""
    plan = RECIPES[recipe]
    filters = filters or int(plan.model["filters"])
    max_filters = plan.model.get("max_filters")
    if depth is None:
        topology = plan.topology(median_shape, spacing)
    elif spacing is None or max(spacing) < ANISOTROPIC_SPACING * min(spacing):
        topology = Topology(depth=depth)
    else:
        topology = anisotropic_topology(median_shape, spacing, deepest_map=plan.deepest_map, depth_range=(depth, depth))
    divisors = topology.divisors()
    shape = [int(math.ceil(s / d) * d) for s, d in zip(median_shape, divisors, strict=True)]
    suggestion: dict[str, Any] = {
        "prepare_shape": shape,
        "recipe": recipe,
        "depth": topology.depth,
        "filters": filters,
        "batch_size_per_replica": batch,
        "rule": (
            "prepare.shape: the median case shape rounded up, per axis, to a multiple of that axis's total "
            "pooling (2^(depth-1), or fewer halvings along a thick-slice axis: nnU-Net's pools); train.patch: "
            "that shape, its longest axis shrunk by that multiple until the estimated training memory fits "
            "the budget, estimated as 1.5 x batch x 4 bytes x (12 feature maps per U-Net level, filters x "
            "2^level wide (to the recipe's cap), at that level's share of the voxels, + the input channels)"
        ),
    }
    if topology.pools is not None:
        suggestion["pools"] = [list(p) for p in topology.pools]
        suggestion["kernels"] = [list(k) for k in topology.kernels or []]
    if gpu_memory_gb is not None:

        def need(patch: list[int]) -> float:
            return activation_bytes(
                (patch[0], patch[1], patch[2]),
                depth=topology.depth,
                filters=filters,
                batch=batch,
                channels=channels,
                pools=topology.pools,
                max_filters=max_filters,
            )

        budget = gpu_memory_gb * 2**30
        patch = shrink_to_fit(shape, divisors, lambda p: need(p) <= budget)
        suggestion.update(
            {
                "gpu_memory_gb": gpu_memory_gb,
                "train_patch": patch if need(patch) <= budget else None,
                "estimated_gb": round(need(patch) / 2**30, 3),
            }
        )
    return suggestion


def _label_rows(stats: list[dict[str, Any]], labels: dict[int, str], warnings: list[str]) -> dict[str, Any]:
    """Per foreground label: its share of the voxels and of the cases (a warning when it is rare)."""
    total_voxels = sum(s["voxels"] for s in stats)
    label_rows = {}
    for value, label_name in sorted(labels.items()):
        if value == 0:
            continue
        voxels = sum(int(s["label_voxels"].get(value, 0)) for s in stats)
        present = sum(1 for s in stats if s["label_voxels"].get(value, 0) > 0)
        share = present / len(stats) if stats else 0.0
        label_rows[str(value)] = {
            "name": label_name,
            "voxel_fraction": voxels / max(total_voxels, 1),
            "cases_with_label": present,
            "share_of_cases": share,
        }
        if share < RARE_LABEL_SHARE:
            warnings.append(
                f"label {value} ({label_name}) is absent from {len(stats) - present} of {len(stats)} "
                "cases: it will be hard to learn, and its per-case scores are often undefined"
            )
    return label_rows


def aggregate(
    stats: list[dict[str, Any]],
    *,
    labels: dict[int, str],
    modalities: list[str] | tuple[str, ...],
    name: str,
    gpu_memory_gb: float | None = None,
    depth: int | None = None,
    filters: int | None = None,
    batch: int = 2,
    recipe: str = DEFAULT_RECIPE,
) -> dict[str, Any]:
    """The fingerprint of a dataset from its cases' :func:`case_stats`."""
    spacings = np.array([s["spacing"] for s in stats])
    shapes = np.array([s["shape"] for s in stats])
    median_spacing = np.median(spacings, axis=0)
    median_shape = [int(v) for v in np.median(shapes, axis=0)]
    warnings: list[str] = []
    anisotropy = float(median_spacing.max() / max(median_spacing.min(), 1e-9))
    if anisotropy > ANISOTROPY_RATIO:
        warnings.append(
            f"anisotropic spacing: the median spacing {np.round(median_spacing, 3).tolist()} mm has a "
            f"ratio of {anisotropy:.1f} (> {ANISOTROPY_RATIO:g}): init plans nnU-Net's pooling and kernels per axis "
            "for it and spatial augmentation rotates only within the slices; resampling the slices to the finer "
            "spacing would only interpolate between them"
        )
    odd = [
        (s["case_id"], s["spacing"])
        for s in stats
        if np.any(np.abs(np.array(s["spacing"]) - median_spacing) > SPACING_TOLERANCE * median_spacing)
    ]
    if odd:
        listed = ", ".join(f"{cid} {np.round(sp, 3).tolist()}" for cid, sp in odd[:5])
        warnings.append(
            f"inconsistent spacing: {len(odd)} of {len(stats)} case(s) differ from the median "
            f"{np.round(median_spacing, 3).tolist()} mm by more than {SPACING_TOLERANCE:.0%}: {listed}"
            f"{' ...' if len(odd) > 5 else ''}; crop/pad keeps each case's spacing, so they train at "
            "another scale (use --resize resample, or resample them)"
        )
    orientations = sorted({s["orientation"] for s in stats})
    if len(orientations) > 1:
        warnings.append(f"mixed orientations {orientations}: cases are not stored in the same axis order")
    label_rows = _label_rows(stats, labels, warnings)
    intensity = {}
    for c, modality in enumerate(modalities):
        pooled = np.concatenate([s["samples"][c] for s in stats if len(s["samples"]) > c]) if stats else np.zeros(0)
        intensity[modality] = _percentiles(pooled)
    return {
        "dataset": name,
        "cases": len(stats),
        "per_case": [{k: s[k] for k in ("case_id", "shape", "spacing", "orientation")} for s in stats],
        "median_shape": median_shape,
        "min_shape": [int(v) for v in shapes.min(axis=0)],
        "max_shape": [int(v) for v in shapes.max(axis=0)],
        "median_spacing_mm": [float(v) for v in median_spacing],
        "anisotropy": anisotropy,
        "orientations": orientations,
        "intensity_foreground": intensity,
        # what distmis prepare does to each channel by default (CT: from the training cases' foreground)
        "normalization": dict(zip(modalities, channel_schemes(modalities), strict=True)),
        "labels": label_rows,
        "suggestion": suggest(
            median_shape,
            len(modalities),
            spacing=[float(v) for v in median_spacing],
            gpu_memory_gb=gpu_memory_gb,
            depth=depth,
            filters=filters,
            batch=batch,
            recipe=recipe,
        ),
        "warnings": warnings,
    }


def _inspect_case(case: Any, num_modalities: int, labels: dict[int, str], index: int) -> dict[str, Any]:
    from distmis.data._msd import load_case_image, load_case_label

    image, affine, _ = load_case_image(case.image, num_modalities)
    label = load_case_label(case.label, image.shape[:3], labels) if case.label is not None else None
    return case_stats(case.case_id, image, affine, label, seed=index)


def fingerprint(
    src: str | Path,
    *,
    gpu_memory_gb: float | None = None,
    depth: int | None = None,
    filters: int | None = None,
    batch: int = 2,
    recipe: str = DEFAULT_RECIPE,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Read every training case of an MSD dataset (in parallel processes) and fingerprint it.

    Raises:
        DataError: a malformed dataset.json or case (as ``distmis prepare`` would report it).
    """
    import os

    from distmis.data._msd import check_case_headers, read_dataset_json
    from distmis.data._pool import case_pool

    dataset = read_dataset_json(src)
    for case in dataset.training:
        check_case_headers(case, dataset.num_modalities)
    workers = workers or min(len(dataset.training), os.cpu_count() or 1)
    stats = []
    with case_pool(workers) as pool:
        futures = [
            pool.submit(_inspect_case, case, dataset.num_modalities, dataset.labels, i)
            for i, case in enumerate(dataset.training)
        ]
        try:
            for i, fut in enumerate(futures):
                stats.append(fut.result())
                if progress:
                    progress(i + 1, len(futures))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return aggregate(
        stats,
        labels=dataset.labels,
        modalities=dataset.modalities,
        name=dataset.name,
        gpu_memory_gb=gpu_memory_gb,
        depth=depth,
        filters=filters,
        batch=batch,
        recipe=recipe,
    )


def overview_png(fp: dict[str, Any], path: Path) -> Path:
    """Spacing per case, shapes, foreground intensities per modality, label coverage (one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from distmis import __version__
    from distmis.files import atomic_file

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    spacing = np.array([c["spacing"] for c in fp["per_case"]])
    for axis, name in enumerate("xyz"):
        axes[0, 0].plot(spacing[:, axis], "o", ms=4, label=f"{name}")
    axes[0, 0].set(title="voxel spacing per case (mm)", xlabel="case", ylabel="mm")
    axes[0, 0].legend(fontsize=8)
    shapes = np.array([c["shape"] for c in fp["per_case"]])
    axes[0, 1].boxplot([shapes[:, i] for i in range(3)], tick_labels=["x", "y", "z"])
    axes[0, 1].set(title=f"shape (median {fp['median_shape']})", ylabel="voxels")
    mods = list(fp["intensity_foreground"])
    for i, m in enumerate(mods):
        p = fp["intensity_foreground"][m]
        axes[1, 0].plot([i, i], [p["p00_5"], p["p99_5"]], color="C0", linewidth=6, alpha=0.4)
        axes[1, 0].plot([i], [p["p50"]], "o", color="C3")
    axes[1, 0].set_xticks(range(len(mods)), mods)
    axes[1, 0].set(title="foreground intensity: 0.5-99.5 percentile, median", ylabel="intensity")
    rows = fp["labels"]
    names = [f"{v} {r['name']}" for v, r in rows.items()]
    axes[1, 1].bar(names, [r["share_of_cases"] for r in rows.values()], color="C2", alpha=0.7, label="share of cases")
    ax2 = axes[1, 1].twinx()
    ax2.plot(names, [r["voxel_fraction"] * 100 for r in rows.values()], "o-", color="C1", label="% of voxels")
    axes[1, 1].set(title="labels", ylim=(0, 1.05), ylabel="share of cases with the label")
    ax2.set_ylabel("% of all voxels")
    axes[1, 1].tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(
        f"{fp['dataset']}: {fp['cases']} cases" + (f" - {len(fp['warnings'])} warning(s)" if fp["warnings"] else "")
    )
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png", metadata={"Software": f"distmis inspect {__version__}"})
    plt.close(fig)
    return path


__all__ = ["activation_bytes", "aggregate", "case_stats", "fingerprint", "overview_png", "shrink_to_fit", "suggest"]
