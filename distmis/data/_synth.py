"""Synthetic MSD Task01_BrainTumour-style data.

Real BraTS data cannot be downloaded here and is large; the synthetic set has the same
layout (``dataset.json``, ``imagesTr``, ``labelsTr``, ``imagesTs``, 4D float images, labels
0..3) so that every code path — including ``prepare`` — is exercised on it. The task is made
learnable but not trivial: a head-shaped non-zero region, a tumour of nested irregular blobs
whose contrast differs per modality (some classes are invisible in some modalities), plus a
smooth multiplicative bias field and Gaussian noise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from distmis.files import atomic_directory, write_json_atomic

MODALITIES = ("FLAIR", "T1w", "t1gd", "T2w")
LABELS = {0: "background", 1: "edema", 2: "non-enhancing tumor", 3: "enhancing tumour"}

# mean intensity per modality (rows) of: brain, edema, non-enhancing, enhancing
_CONTRAST = np.array(
    [
        [0.50, 0.95, 0.80, 0.85],  # FLAIR: edema bright
        [0.60, 0.50, 0.35, 0.55],  # T1w: core dark
        [0.60, 0.55, 0.35, 1.00],  # t1gd: enhancing ring bright
        [0.45, 0.90, 0.95, 0.70],  # T2w: fluid bright
    ],
    dtype=np.float32,
)


def _blob(grid: np.ndarray, centre: np.ndarray, radii: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An ellipsoid whose surface is perturbed by low-frequency harmonics (irregular blob)."""
    d = (grid - centre[:, None, None, None]) / radii[:, None, None, None]
    r = np.sqrt((d**2).sum(0))
    theta = np.arctan2(d[1], d[0])
    phi = np.arccos(np.clip(d[2] / np.maximum(r, 1e-6), -1, 1))
    wobble = 1.0
    for _ in range(3):
        k, m = rng.integers(1, 4, size=2)
        wobble = wobble + rng.uniform(0.05, 0.15) * np.sin(k * theta + rng.uniform(0, 2 * np.pi)) * np.cos(
            m * phi + rng.uniform(0, 2 * np.pi)
        )
    return r < wobble


def synth_case(shape: tuple[int, int, int], modalities: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One case: image (X, Y, Z, C) float32 and label (X, Y, Z) uint8 with values 0..3."""
    s = np.asarray(shape, dtype=np.float32)
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float32) for n in shape], indexing="ij"))
    head = _blob(grid, s / 2 + rng.normal(0, 0.02, 3) * s, s * rng.uniform(0.40, 0.47, 3), rng)
    centre = s / 2 + rng.uniform(-0.15, 0.15, 3) * s
    r_edema = s * rng.uniform(0.16, 0.26, 3)
    edema = _blob(grid, centre, r_edema, rng) & head
    enhancing = _blob(grid, centre + rng.normal(0, 0.02, 3) * s, r_edema * rng.uniform(0.5, 0.7), rng) & edema
    core = _blob(grid, centre, r_edema * rng.uniform(0.25, 0.4), rng) & enhancing
    label = np.zeros(shape, np.uint8)
    label[edema] = 1
    label[enhancing] = 3
    label[core] = 2

    contrast = np.resize(_CONTRAST, (modalities, 4)) * rng.uniform(0.85, 1.15, (modalities, 1))
    tissue = np.where(head, 0, -1) + np.where(head, label.astype(np.int64), 0)  # -1 outside head
    image = np.zeros(shape + (modalities,), np.float32)
    # smooth multiplicative bias field, different per case
    coeffs = rng.normal(0, 0.15, (3,))
    bias = 1.0 + sum(c * (grid[i] / s[i] - 0.5) for i, c in enumerate(coeffs))
    for c in range(modalities):
        vol = np.where(tissue >= 0, contrast[c][np.clip(tissue, 0, 3)], 0.0).astype(np.float32)
        vol = vol * bias + rng.normal(0, 0.08, shape).astype(np.float32) * head
        image[..., c] = np.where(head, np.clip(vol, 1e-3, None), 0.0) * 1000.0
    return image, label


def write_synthetic_msd(
    out: str | Path,
    *,
    cases: int = 24,
    shape: tuple[int, int, int] = (32, 32, 32),
    modalities: int = 4,
    test_cases: int = 2,
    seed: int = 0,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write an MSD-layout dataset to ``out`` (atomically). Deterministic for a given ``seed``."""
    import nibabel as nib

    out = Path(out)
    names = tuple(MODALITIES[i] if i < len(MODALITIES) else f"mod{i}" for i in range(modalities))
    rng = np.random.default_rng(seed)
    affine = np.diag([1.0, 1.0, 1.0, 1.0])
    with atomic_directory(out, command="synth", overwrite=overwrite) as tmp:
        for sub in ("imagesTr", "labelsTr", "imagesTs"):
            (tmp / sub).mkdir()
        training, test = [], []
        total = cases + test_cases
        for i in range(total):
            image, label = synth_case((shape[0], shape[1], shape[2]), modalities, rng)
            cid = f"SYNTH_{i:03d}"
            if i < cases:
                nib.save(nib.Nifti1Image(image, affine), tmp / "imagesTr" / f"{cid}.nii.gz")
                nib.save(nib.Nifti1Image(label, affine), tmp / "labelsTr" / f"{cid}.nii.gz")
                training.append({"image": f"./imagesTr/{cid}.nii.gz", "label": f"./labelsTr/{cid}.nii.gz"})
            else:
                nib.save(nib.Nifti1Image(image, affine), tmp / "imagesTs" / f"{cid}.nii.gz")
                test.append(f"./imagesTs/{cid}.nii.gz")
            if progress:
                progress(i + 1, total)
        meta = {
            "name": "SYNTH_BRATS",
            "description": f"distmis synthetic brain-tumour-like data (seed {seed})",
            "reference": "generated by distmis synth",
            "licence": "CC0",
            "tensorImageSize": "4D" if modalities > 1 else "3D",
            "modality": {str(i): n for i, n in enumerate(names)},
            "labels": {str(k): v for k, v in LABELS.items()},
            "numTraining": cases,
            "numTest": test_cases,
            "training": training,
            "test": test,
        }
        write_json_atomic(tmp / "dataset.json", meta)
    return out


__all__ = ["LABELS", "MODALITIES", "synth_case", "write_synthetic_msd"]
