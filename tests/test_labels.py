"""Classes and BraTS regions: scores worked out by hand, the regions <-> labels round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distmis.inference import mask_metrics, summarise
from distmis.labels import (
    MSD_TASK01_REGIONS,
    class_names,
    labels_from_regions,
    metric_names,
    paint_order,
    regions_from_labels,
)


def test_regions_paint_back_largest_first() -> None:
    assert paint_order(MSD_TASK01_REGIONS) == [("WT", 1), ("TC", 2), ("ET", 3)]
    assert paint_order({"A": [1], "B": [2]}) in ([("A", 1), ("B", 2)], [("B", 2), ("A", 1)])
    with pytest.raises(ValueError, match="do not nest"):
        paint_order({"X": [1, 2], "Y": [2, 3]})
    with pytest.raises(ValueError, match="adds exactly one|adds \\[1, 2\\]"):
        paint_order({"X": [1, 2, 3], "Y": [3]})


def test_regions_to_labels_to_regions_is_the_identity() -> None:
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 4, (12, 10, 8)).astype(np.uint8)
    masks = regions_from_labels(truth, MSD_TASK01_REGIONS)
    assert masks.shape == (12, 10, 8, 3)
    np.testing.assert_array_equal(masks[..., 0], truth > 0)  # WT
    np.testing.assert_array_equal(masks[..., 1], np.isin(truth, [2, 3]))  # TC
    np.testing.assert_array_equal(masks[..., 2], truth == 3)  # ET
    np.testing.assert_array_equal(labels_from_regions(masks, MSD_TASK01_REGIONS), truth)
    np.testing.assert_array_equal(
        regions_from_labels(labels_from_regions(masks, MSD_TASK01_REGIONS), MSD_TASK01_REGIONS), masks
    )


def test_metric_names() -> None:
    labels = {0: "background", 1: "edema", 2: "non-enhancing tumor", 3: "enhancing tumour"}
    assert class_names(labels, "multiclass", 4, None) == ["edema", "non_enhancing_tumor", "enhancing_tumour"]
    assert class_names(labels, "regions", 3, MSD_TASK01_REGIONS) == ["WT", "TC", "ET"]
    assert class_names(labels, "binary", 1, MSD_TASK01_REGIONS) == []
    names = metric_names(labels, "multiclass", 4, MSD_TASK01_REGIONS)
    assert "val_dice_edema" in names and "val_iou_enhancing_tumour" in names and "val_dice_ET" in names


def test_region_scores_by_hand() -> None:
    """Empty truth and empty prediction score 1; empty truth and a non-empty prediction 0;
    a half overlap 2/3 (Dice) and 1/2 (IoU)."""
    import tensorflow as tf

    from distmis.model import class_scores

    truth = np.zeros((3, 4, 4, 4, 2), np.float32)  # 3 examples, 2 region channels (sigmoid)
    pred = np.zeros((3, 4, 4, 4, 2), np.float32)
    truth[1, :2, :, :, 0] = 1  # example 1, region 0: 32 voxels
    pred[1, :, :, :, 0] = 0.9  # predicted everywhere: 64 voxels -> Dice 2*32/96
    pred[2, 0, 0, 0, 1] = 0.8  # example 2, region 1: nothing there, one voxel predicted
    dice, iou = (np.asarray(x) for x in class_scores(tf.constant(truth), tf.constant(pred), exclusive=False))
    assert dice[0].tolist() == [1.0, 1.0]  # nothing to find, nothing found
    assert dice[1, 0] == pytest.approx(2 * 32 / 96) and iou[1, 0] == pytest.approx(0.5)
    assert dice[2, 1] == 0.0 and iou[2, 1] == 0.0  # empty truth, non-empty prediction


def test_multiclass_model_scored_per_region_from_its_labels() -> None:
    import tensorflow as tf

    from distmis.model import class_scores

    truth_labels = np.array([[[[0, 1, 2, 3]]]])  # (1, 1, 1, 4)
    pred_labels = np.array([[[[0, 1, 3, 3]]]])  # 2 mistaken for 3
    one_hot = lambda a: tf.one_hot(a, 4)
    probs = tf.one_hot(pred_labels, 4) * 0.9 + 0.025
    dice, _ = class_scores(
        one_hot(truth_labels), probs, exclusive=True, regions=[list(v) for v in MSD_TASK01_REGIONS.values()]
    )
    dice = np.asarray(dice)[0]
    # classes 1, 2, 3, then regions WT, TC, ET
    assert dice[:3].tolist() == pytest.approx([1.0, 0.0, 2 * 1 / 3])
    assert dice[3] == 1.0 and dice[4] == 1.0  # WT and TC are right: 2 and 3 are both tumour core
    assert dice[5] == pytest.approx(2 * 1 / 3)  # ET: 1 right of 2 predicted


def test_hd95_of_an_empty_region_is_undefined_and_counted() -> None:
    empty = np.zeros((8, 8, 8), bool)
    found = empty.copy()
    found[2:4, 2:4, 2:4] = True
    assert math.isnan(mask_metrics(empty, empty, (1, 1, 1))["hd95_mm"])
    assert math.isnan(mask_metrics(empty, found, (1, 1, 1))["hd95_mm"])
    assert mask_metrics(empty, empty, (1, 1, 1))["dice"] == 1.0
    assert mask_metrics(empty, found, (1, 1, 1))["dice"] == 0.0
    s = summarise([2.0, math.nan, 4.0])
    assert s["mean"] == 3.0 and s["undefined"] == 1
