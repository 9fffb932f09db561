"""Post-processing chosen by cross-validation: keep only the largest connected component of a class.

nnU-Net removes every part of a structure but its largest connected component when, and only
when, that raises the structure's cross-validated Dice (a tumour or an organ is one piece, and
stray islands are false positives); ``distmis finalize`` decides it the same way on the
out-of-fold predictions and records the masks it keeps in ``final/ensemble.json``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 26-connected component of a boolean mask (all of it when it has one or none)."""
    from scipy.ndimage import generate_binary_structure, label

    labelled, count = label(mask, structure=generate_binary_structure(3, 3))
    if count <= 1:
        return mask.astype(bool)
    sizes = np.bincount(labelled.ravel())
    sizes[0] = 0
    return labelled == int(np.argmax(sizes))


def keep_largest_components(labels: np.ndarray, masks: Sequence[tuple[str, Sequence[int]]]) -> np.ndarray:
    """Labels with every voxel of each mask (a class's or a region's label values) outside the mask's
    largest component set to background."""
    out = labels.copy()
    for _name, values in masks:
        mask = np.isin(out, list(values))
        out[mask & ~largest_component(mask)] = 0
    return out


__all__ = ["keep_largest_components", "largest_component"]
