"""Label values, classes and regions: what a model learns and how results are named.

MSD Task01 (BraTS) labels are 1 edema, 2 non-enhancing tumour, 3 enhancing tumour, but results
are reported per *region*: whole tumour WT = {1, 2, 3}, tumour core TC = {2, 3}, enhancing
tumour ET = {3} (in the BraTS challenges' own numbering, 1 necrotic core, 2 edema, 4 enhancing:
WT = {1, 2, 4}, TC = {1, 4}, ET = {4}). nnU-Net trains BraTS region-based (one sigmoid output per overlapping
region) and every paper reports Dice and HD95 per region, which one merged mask cannot
give. Three label modes:

* ``binary``: one sigmoid channel, any label > 0;
* ``multiclass``: one softmax channel per label value (0 .. max);
* ``regions``: one sigmoid channel per region (``data.regions``).

A region model's output is written back as label values by painting the regions from the
largest to the smallest: ET -> 3, TC without ET -> 2, WT without TC -> 1. That needs regions
that nest, each adding exactly one label value (:func:`paint_order` checks it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from distmis.metrics import DICE, class_metric, class_metrics

if TYPE_CHECKING:
    import tensorflow as tf

#: the MSD Task01 / BraTS evaluation regions
MSD_TASK01_REGIONS: dict[str, list[int]] = {"WT": [1, 2, 3], "TC": [2, 3], "ET": [3]}
#: the same regions in the BraTS challenges' own numbering since 2017 (1 necrotic tumour core,
#: 2 peritumoral edema, 4 enhancing tumour; no 3)
BRATS21_REGIONS: dict[str, list[int]] = {"WT": [1, 2, 4], "TC": [1, 4], "ET": [4]}
PRESETS = {"msd_task01": MSD_TASK01_REGIONS, "brats": MSD_TASK01_REGIONS, "brats21": BRATS21_REGIONS}


def metric_suffix(name: str) -> str:
    """A label or region name as it appears in metric names: ``enhancing tumour`` -> ``enhancing_tumour``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "class"


def metric_name_clash(named: list[tuple[str, str]]) -> str | None:
    """The first group of names that would report under one metric name, described; else None.

    ``named`` holds (what, name) pairs such as ``("label 1", "tumour")``. Names are compared
    once sanitised and without case: ``val_dice_Tumour`` and ``val_dice_tumour`` are one column
    to a MySQL-backed MLflow and one file name on macOS, so they clash too.
    """
    owners: dict[str, list[tuple[str, str]]] = {}
    for what, name in named:
        owners.setdefault(metric_suffix(name).lower(), []).append((what, name))
    for group in owners.values():
        if len(group) > 1:
            spelt = sorted({class_metric(DICE, metric_suffix(name)) for _, name in group})
            return (
                ", ".join(f"{what} {name!r}" for what, name in group)
                + f" all name the metric {' / '.join(spelt)}"
                + " (names keep letters, digits and '_', compared without case)"
            )
    return None


def class_values(labels: Mapping[Any, str], num_classes: int) -> list[int]:
    """The dataset's label value of each softmax class, in class order (class 0 is background).

    Datasets number their labels as they like (BraTS's original 0, 1, 2, 4): a model's classes are
    0..K-1, one per declared label, and class k stands for the k-th declared value. Data prepared
    when every value up to the largest got a class (``num_classes`` = largest + 1) keeps that.
    """
    declared = [0, *sorted({int(v) for v in labels} - {0})]
    return declared if len(declared) == num_classes else list(range(num_classes))


def class_names(
    labels: dict[int, str], label_mode: str, num_classes: int, regions: dict[str, list[int]] | None
) -> list[str]:
    """Names of the model's foreground outputs, in output-channel order (per-class metrics).

    ``binary``: none (``val_dice`` is the one class); ``multiclass``: label values 1..K-1;
    ``regions``: the regions.
    """
    if label_mode == "regions":
        return [metric_suffix(r) for r in (regions or {})]
    if label_mode == "multiclass":
        values = class_values(labels, num_classes)
        return [metric_suffix(labels.get(values[k], str(values[k]))) for k in range(1, num_classes)]
    return []


def metric_names(
    labels: dict[int, str], label_mode: str, num_classes: int, regions: dict[str, list[int]] | None
) -> list[str]:
    """Every per-class validation metric a run reports: ``val_dice_<name>``, ``val_iou_<name>``.

    Multi-class models with regions configured also report the regions (computed from the
    predicted labels), so a multi-class search can optimise ``val_dice_ET`` too.
    """
    names = class_names(labels, label_mode, num_classes, regions)
    if label_mode == "multiclass" and regions:
        names += [metric_suffix(r) for r in regions if metric_suffix(r) not in names]
    return class_metrics(names)


def paint_order(regions: dict[str, list[int]]) -> list[tuple[str, int]]:
    """(region, label value) to paint, largest region first, for writing region predictions back.

    Raises:
        ValueError: regions that do not nest, or a region that adds no single label value.
    """
    ordered = sorted(regions.items(), key=lambda kv: -len(set(kv[1])))
    order = []
    for i, (name, values) in enumerate(ordered):
        inner = [set(v) for _, v in ordered[i + 1 :]]
        for other in inner:
            if not (other <= set(values) or not (other & set(values))):
                raise ValueError(
                    f"regions {sorted(regions)} do not nest ({name} partly overlaps another region); "
                    "label values cannot be written back"
                )
        own = set(values) - set().union(*[o for o in inner if o <= set(values)]) if inner else set(values)
        if len(own) != 1:
            raise ValueError(
                f"region {name} {sorted(values)} adds {sorted(own) or 'no'} label value(s) to the regions "
                "inside it; each must add exactly one to be written back as a label"
            )
        order.append((name, own.pop()))
    return order


def regions_from_labels(label: np.ndarray, regions: dict[str, list[int]]) -> np.ndarray:
    """Label map (X, Y, Z) -> region masks (X, Y, Z, R), bool."""
    return np.stack([np.isin(label, values) for values in regions.values()], axis=-1)


def labels_from_regions(masks: np.ndarray, regions: dict[str, list[int]]) -> np.ndarray:
    """Region masks (X, Y, Z, R) -> MSD label values (uint8), painting the largest region first."""
    index = {name: i for i, name in enumerate(regions)}
    out = np.zeros(masks.shape[:-1], np.uint8)
    for name, value in paint_order(regions):
        out[masks[..., index[name]].astype(bool)] = value
    return out


def tf_regions_from_labels(label: tf.Tensor, regions: dict[str, list[int]]) -> tf.Tensor:
    """The same as :func:`regions_from_labels` for a ``tf.data`` pipeline (float32 channels)."""
    import tensorflow as tf

    label = tf.cast(label, tf.int32)
    channels = [
        tf.reduce_any(tf.stack([tf.equal(label, v) for v in values], axis=-1), axis=-1) for values in regions.values()
    ]
    return tf.cast(tf.stack(channels, axis=-1), tf.float32)


__all__ = [
    "MSD_TASK01_REGIONS",
    "PRESETS",
    "class_names",
    "class_values",
    "labels_from_regions",
    "metric_names",
    "metric_suffix",
    "paint_order",
    "regions_from_labels",
    "tf_regions_from_labels",
]
