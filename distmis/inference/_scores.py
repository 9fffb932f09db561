"""Segmentation scores of a whole predicted volume against its label, in the scan's physical geometry (numpy/scipy).

Conventions follow MONAI / the BraTS and MSD challenges so that numbers are comparable:

* Dice and IoU: both masks empty -> 1 (nothing to find, nothing found).
* Sensitivity TP/(TP+FN) is undefined (NaN) without foreground in the truth; specificity
  TN/(TN+FP) is undefined without background.
* HD95: the symmetric 95th-percentile Hausdorff distance between the two masks' *surfaces*
  (voxels removed by one binary erosion), in millimetres from the voxel spacing: the larger
  of the two directed 95th percentiles (MONAI ``compute_hausdorff_distance(percentile=95)``).
  Undefined (NaN) when either mask is empty: there is no surface to measure to, and a region
  absent from a case (no enhancing tumour) must not pull a mean towards 0 or infinity; the
  summaries count such cases as undefined instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

METRICS = ("dice", "iou", "hd95_mm", "sensitivity", "specificity")


def _surface(mask: np.ndarray) -> np.ndarray:
    from scipy.ndimage import binary_erosion

    return mask & ~binary_erosion(mask, border_value=0)


def _directed(a_surface: np.ndarray, b_surface: np.ndarray, spacing: Sequence[float], q: float) -> float:
    from scipy.ndimage import distance_transform_edt

    # distance of every voxel to the nearest surface voxel of b, in mm
    dist_to_b = distance_transform_edt(~b_surface, sampling=spacing)
    return float(np.percentile(dist_to_b[a_surface], q))


def hausdorff95(truth: np.ndarray, pred: np.ndarray, spacing: Sequence[float], q: float = 95.0) -> float:
    """Symmetric ``q``-th percentile Hausdorff distance between mask surfaces, in mm."""
    truth, pred = truth.astype(bool), pred.astype(bool)
    if not truth.any() or not pred.any():
        return math.nan
    st, sp = _surface(truth), _surface(pred)
    return max(_directed(sp, st, spacing, q), _directed(st, sp, spacing, q))


def mask_metrics(truth: np.ndarray, pred: np.ndarray, spacing: Sequence[float] | None) -> dict[str, float]:
    """Dice, IoU, HD95 (mm), sensitivity and specificity of one binary mask pair (no HD95 without ``spacing``)."""
    truth, pred = truth.astype(bool), pred.astype(bool)
    if truth.shape != pred.shape:
        raise ValueError(f"truth shape {truth.shape} != prediction shape {pred.shape}")
    tp = int(np.count_nonzero(truth & pred))
    fp = int(np.count_nonzero(~truth & pred))
    fn = int(np.count_nonzero(truth & ~pred))
    tn = truth.size - tp - fp - fn
    return {
        "dice": 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn),
        "iou": 1.0 if tp + fp + fn == 0 else tp / (tp + fp + fn),
        **({"hd95_mm": hausdorff95(truth, pred, spacing)} if spacing is not None else {}),
        "sensitivity": tp / (tp + fn) if tp + fn else math.nan,
        "specificity": tn / (tn + fp) if tn + fp else math.nan,
    }


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Mean and median over the finite values, and how many were not finite (inf/NaN)."""
    arr = np.asarray(values, dtype=float)
    finite = arr[np.isfinite(arr)]
    return {
        "mean": float(finite.mean()) if finite.size else math.nan,
        "median": float(np.median(finite)) if finite.size else math.nan,
        "undefined": int(arr.size - finite.size),
    }
