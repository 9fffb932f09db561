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

from collections.abc import Callable, Iterator

import numpy as np

from distmis.model import cube_origins, gaussian_weight

BLENDS = ("gaussian", "average")
PredictFn = Callable[[np.ndarray], np.ndarray]  # (B, x, y, z, C) -> (B, x, y, z, K)


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
