"""Where the cubes of a sliding window go over a volume, and how much each voxel of a cube counts.

Shared by inference (:mod:`distmis.inference`, in numpy over a whole scan) and by validation
during training (in TensorFlow, inside the evaluation step): both must cover a volume the same
way, so that the validation Dice is the Dice that ``predict`` will give.
"""

from __future__ import annotations

import itertools

import numpy as np


def window_starts(size: int, patch: int, overlap: float) -> list[int]:
    """Start offsets along one axis so that cubes of ``patch`` cover ``size`` with >= ``overlap``.

    The last cube is flush with the end of the axis (no cube leaves the volume); ``size`` must
    be at least ``patch`` (the caller pads smaller volumes).
    """
    if size <= patch:
        return [0]
    stride = max(1, int(patch * (1.0 - overlap)))
    n = int(np.ceil((size - patch) / stride)) + 1
    # spread the n cubes evenly between 0 and size - patch
    return sorted({int(round(i * (size - patch) / (n - 1))) for i in range(n)})


def gaussian_weight(patch: tuple[int, int, int], sigma_scale: float = 0.125) -> np.ndarray:
    """Separable Gaussian importance map, sigma = ``sigma_scale`` x cube size (nnU-Net's 1/8)."""
    axes = []
    for n in patch:
        centre = (n - 1) / 2.0
        sigma = max(n * sigma_scale, 1e-3)
        axes.append(np.exp(-0.5 * ((np.arange(n) - centre) / sigma) ** 2))
    w = axes[0][:, None, None] * axes[1][None, :, None] * axes[2][None, None, :]
    w = w / w.max()
    # never exactly zero: a voxel covered only by cube borders must still get a prediction
    return np.maximum(w, 1e-3).astype(np.float32)


def cube_origins(
    shape: tuple[int, int, int], patch: tuple[int, int, int], overlap: float
) -> list[tuple[int, int, int]]:
    """Every cube origin that tiles a (padded) volume of ``shape``."""
    per_axis = [window_starts(s, p, overlap) for s, p in zip(shape, patch, strict=True)]
    return [tuple(o) for o in itertools.product(*per_axis)]  # type: ignore[misc]


__all__ = ["cube_origins", "gaussian_weight", "window_starts"]
