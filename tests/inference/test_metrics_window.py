"""Sliding-window bookkeeping and volume metrics against hand-computed values (no TensorFlow)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distmis.inference import hausdorff95, mask_metrics, sliding_window_predict, summarise, window_starts


@pytest.mark.parametrize(
    "size,patch,overlap", [(37, 8, 0.5), (16, 16, 0.5), (17, 16, 0.25), (100, 32, 0.0), (9, 4, 0.9)]
)
def test_window_starts_cover_the_axis(size: int, patch: int, overlap: float) -> None:
    starts = window_starts(size, patch, overlap)
    assert starts[0] == 0 and starts[-1] == size - patch
    assert all(b - a <= max(1, int(patch * (1 - overlap))) for a, b in zip(starts, starts[1:], strict=False))
    covered = np.zeros(size, bool)
    for s in starts:
        covered[s : s + patch] = True
    assert covered.all()


@pytest.mark.parametrize("blend", ["gaussian", "average"])
def test_voxelwise_model_is_reproduced_exactly(blend: str) -> None:
    """With a per-voxel 'model', stitching must give back the direct result at every voxel,
    including borders, uneven sizes and an axis (z=5) smaller than the cube."""
    rng = np.random.default_rng(0)
    volume = rng.normal(size=(37, 29, 5, 2)).astype(np.float32)

    def voxelwise(cubes: np.ndarray) -> np.ndarray:
        return np.concatenate([1 / (1 + np.exp(-cubes.sum(-1, keepdims=True))), np.tanh(cubes[..., :1])], axis=-1)

    calls: list[int] = []
    out = sliding_window_predict(
        volume,
        lambda c: (calls.append(len(c)), voxelwise(c))[1],
        patch=(8, 8, 8),
        overlap=0.5,
        blend=blend,
        batch_size=3,
    )
    np.testing.assert_allclose(out, voxelwise(volume[None])[0], rtol=1e-5, atol=1e-6)
    assert max(calls) <= 3  # memory is bounded by the cube batch


def test_dice_iou_sensitivity_specificity_by_hand() -> None:
    truth = np.zeros((8, 8, 8), bool)
    pred = np.zeros((8, 8, 8), bool)
    truth[0:4, 0:4, 0:4] = True  # 64 voxels
    pred[2:6, 0:4, 0:4] = True  # 64 voxels, 32 shared
    m = mask_metrics(truth, pred, (1, 1, 1))
    assert m["dice"] == pytest.approx(2 * 32 / 128)
    assert m["iou"] == pytest.approx(32 / 96)
    assert m["sensitivity"] == pytest.approx(32 / 64)
    assert m["specificity"] == pytest.approx((512 - 96) / (512 - 64))
    empty = mask_metrics(np.zeros((4, 4, 4), bool), np.zeros((4, 4, 4), bool), (1, 1, 1))
    assert empty["dice"] == 1.0 and math.isnan(empty["hd95_mm"]) and math.isnan(empty["sensitivity"])


def test_hd95_in_millimetres_by_hand() -> None:
    # two parallel planes 3 slices apart along z with 1.5 mm slices: every surface voxel is 4.5 mm away
    a = np.zeros((16, 16, 12), bool)
    b = np.zeros((16, 16, 12), bool)
    a[:, :, 4] = True
    b[:, :, 7] = True
    assert hausdorff95(a, b, (0.8, 0.8, 1.5)) == pytest.approx(4.5)
    # two single voxels: (5,5,5) and (5,8,5), 2 mm along y -> 6 mm
    p = np.zeros((10, 10, 10), bool)
    q = np.zeros((10, 10, 10), bool)
    p[5, 5, 5] = True
    q[5, 8, 5] = True
    assert hausdorff95(p, q, (1.0, 2.0, 1.0)) == pytest.approx(6.0)
    # the 95th percentile ignores one far outlier among 256 surface voxels; the maximum would not
    c = a.copy()
    c[0, 0, 11] = True
    assert hausdorff95(a, c, (1, 1, 1)) == pytest.approx(0.0)
    assert hausdorff95(a, c, (1, 1, 1), q=100) == pytest.approx(math.sqrt(0 + 0 + 7**2))
    assert math.isnan(hausdorff95(a, np.zeros_like(a), (1, 1, 1)))  # undefined, not infinite


def test_summary_skips_undefined_values() -> None:
    s = summarise([1.0, 3.0, math.inf, math.nan])
    assert s == {"mean": 2.0, "median": 2.0, "undefined": 2}
