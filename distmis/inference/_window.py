"""Sliding-window (domain decomposition) inference over a whole volume, in plain numpy.

Training sees patches; whole scans (240x240x155x4 for BraTS, far larger for histology) do not
fit a GPU's activations. The volume is covered by overlapping cubes, the cubes are run in
batches, and each cube's output is blended into volume-sized accumulators with a weight that
is highest at the cube centre (Gaussian, as nnU-Net and MONAI do: predictions near a cube's
border see zero padding and are less reliable) or uniform (``average``).

Memory on the accelerator is bounded by ``batch_size`` cubes, never by the volume: only the
two accumulators (probabilities and summed weights) are volume-sized, on the host.

This is written by hand rather than taken from MONAI's ``sliding_window_inference`` because
MONAI is a PyTorch library; pulling PyTorch into a TensorFlow product for ~60 lines of
index arithmetic is not worth it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy as np

BLENDS = ("gaussian", "average")
PredictFn = Callable[[np.ndarray], np.ndarray]  # (B, x, y, z, C) -> (B, x, y, z, K)


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


def _batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def sliding_window_predict(
    volume: np.ndarray,
    predict: PredictFn,
    *,
    patch: tuple[int, int, int],
    overlap: float = 0.5,
    blend: str = "gaussian",
    batch_size: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Predict a whole ``volume`` (X, Y, Z, C) cube by cube; returns (X, Y, Z, K) float32.

    Volumes smaller than a cube along an axis are zero-padded (zero is the background after
    non-zero z-scoring) and the padding is cut off again.
    """
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"overlap must be in [0, 1), got {overlap}")
    if blend not in BLENDS:
        raise ValueError(f"blend must be one of {BLENDS}, got {blend!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    spatial = volume.shape[:3]
    padded_shape = tuple(max(s, p) for s, p in zip(spatial, patch, strict=True))
    if padded_shape != spatial:
        pad = [(0, p - s) for s, p in zip(spatial, padded_shape, strict=True)] + [(0, 0)]
        volume = np.pad(volume, pad)
    weight = gaussian_weight(patch) if blend == "gaussian" else np.ones(patch, np.float32)
    origins = cube_origins(padded_shape, patch, overlap)  # type: ignore[arg-type]
    probs: np.ndarray | None = None
    norm = np.zeros(padded_shape, np.float32)
    px, py, pz = patch
    done = 0
    for batch in _batches(origins, batch_size):
        cubes = np.stack([volume[x : x + px, y : y + py, z : z + pz] for x, y, z in batch]).astype(np.float32)
        out = np.asarray(predict(cubes), dtype=np.float32)
        if probs is None:
            probs = np.zeros((*padded_shape, out.shape[-1]), np.float32)
        for (x, y, z), cube_out in zip(batch, out, strict=True):
            probs[x : x + px, y : y + py, z : z + pz] += cube_out * weight[..., None]
            norm[x : x + px, y : y + py, z : z + pz] += weight
        done += len(batch)
        if progress is not None:
            progress(done, len(origins))
    assert probs is not None
    probs /= norm[..., None]
    return probs[: spatial[0], : spatial[1], : spatial[2]]
