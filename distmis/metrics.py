"""The one vocabulary of what a training run reports: every metric's name, which way is better, and
the keys a trial adds to its results.

:class:`EpochMetrics` is the definition. The training loop fills it; Tune, ``results.csv``,
``metrics.csv``, MLflow, the plots, ``distmis compare`` and ``distmis validate`` take their names
from it (its fields, :data:`SEARCH_METRICS`, :func:`class_metric`) instead of spelling them again.
Nothing here imports TensorFlow, Ray or MLflow.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, fields
from typing import Any

# --------------------------------------------------------------------------- the metrics of an epoch
LOSS = "loss"
DICE = "dice"
IOU = "iou"
VAL_LOSS = "val_loss"
NONFINITE_WEIGHTS = "nonfinite_weights"
VAL_DICE = "val_dice"
VAL_IOU = "val_iou"
#: what a search can optimise besides the per-class / per-region metrics, the default first
SEARCH_METRICS = (VAL_DICE, VAL_LOSS, VAL_IOU, DICE, LOSS)
#: per class / region: ``val_dice_<name>`` and ``val_iou_<name>``
CLASS_KINDS = (DICE, IOU)
CLASS_METRIC = re.compile(r"val_(dice|iou)_[A-Za-z0-9_]+")
_HIGHER_IS_BETTER = (DICE, IOU)
_LOWER_IS_BETTER = (LOSS,)


@dataclass
class EpochMetrics:
    """What one epoch reports (the keys Tune, MLflow and the CSV see)."""

    epoch: int
    loss: float
    dice: float
    val_loss: float
    val_dice: float
    val_iou: float
    lr: float
    epoch_seconds: float
    train_seconds: float
    samples_per_second: float
    # wall-clock time (Unix seconds) at the end of the epoch: time-to-target and timelines
    finished_at: float = 0.0
    # the sliding-window validation's share of epoch_seconds (0 in rows written before it was recorded)
    val_seconds: float = 0.0
    # how many of the model's weight arrays hold a NaN or an infinity after the epoch: a diverged
    # network can keep a finite loss and Dice (a constant prediction scores), so the weights are read too
    nonfinite_weights: float = 0.0
    # per class / region: val_dice_<name>, val_iou_<name> (multi-class and region models)
    classes: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        out = {k: v for k, v in self.__dict__.items() if k != "classes"}
        out.update(self.classes)
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> EpochMetrics:
        """The inverse of :meth:`as_dict` (rows of ``metrics.csv`` and checkpoint histories)."""
        known = set(base_fields())
        return cls(
            **{k: float(v) if k != "epoch" else int(float(v)) for k, v in row.items() if k in known},  # type: ignore[arg-type]
            classes={k: float(v) for k, v in row.items() if k not in known},
        )


def base_fields() -> list[str]:
    """Every metric an epoch reports whatever the labels, in ``metrics.csv`` order."""
    return [f.name for f in fields(EpochMetrics) if f.name != "classes"]


#: what MLflow logs per epoch (every number an epoch reports but its index and wall-clock stamp)
TRACKED = tuple(name for name in base_fields() if name not in ("epoch", "finished_at"))


def class_metric(kind: str, name: str) -> str:
    """``class_metric("dice", "ET")`` -> ``val_dice_ET``: the validation metric of one class or region."""
    return f"val_{kind}_{name}"


def class_metrics(names: list[str]) -> list[str]:
    """Every per-class metric of these classes / regions, in ``metrics.csv`` order."""
    return [class_metric(kind, n) for n in names for kind in CLASS_KINDS]


def is_class_metric(name: str) -> bool:
    return CLASS_METRIC.fullmatch(name) is not None


def is_known_metric(name: str) -> bool:
    """A metric some data could report (which classes exist is checked against the data)."""
    return name in SEARCH_METRICS or is_class_metric(name)


def better_direction(metric: str) -> str | None:
    """``max`` for Dice and IoU, ``min`` for losses (``None``: unknown)."""
    if metric.endswith(_HIGHER_IS_BETTER):
        return "max"
    if metric.endswith(_LOWER_IS_BETTER):
        return "min"
    return None


def result_metrics(search_metric: str) -> list[str]:
    """What ``results.csv`` reports per trial: the standard metrics and the search's own."""
    return list(SEARCH_METRICS) if search_metric in SEARCH_METRICS else [*SEARCH_METRICS, search_metric]


# --------------------------------------------------------------------------- what a trial adds to each result
STARTED_AT = "trial_started_at"
REPORTED_AT = "trial_reported_at"
PID = "trial_pid"
NODE = "node_ip"
#: a slot's cold start (once per trainable and its worker group), and whether this trial reused a slot
GROUP_STARTUP = "group_startup_seconds"
WARM = "warm_start"
#: seconds from the trial's start to its run being ready (a warm slot: building the model)
TRIAL_SETUP = "trial_setup_seconds"
#: set in the one result of a trial whose configuration cannot be trained (the reason)
FAILURE = "distmis_failure"


#: how the reason of a diverged run begins (results.csv's error column, Optuna's user attribute)
DIVERGED = "diverged"


def is_divergence(reason: str | None) -> bool:
    """Whether a trial's failure reason is a divergence (:func:`divergence`)."""
    return bool(reason) and str(reason).startswith(DIVERGED)


def _is_zero(value: Any) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return True  # not a count (an empty CSV cell): nothing to say


def divergence(row: dict[str, Any], metric: str) -> str | None:
    """Why an epoch's metrics show a diverged run (weights, loss or search metric holding a NaN or an
    infinity), else None.

    A diverged network predicts nothing useful, yet its Dice can still be a number (0, or the score
    of marking every voxel foreground), so a search would rank it and a finalize ensemble it.
    """
    epoch = row.get("epoch", "?")
    broken = row.get(NONFINITE_WEIGHTS)
    weights = (
        f"{float(broken):g} weight array(s) hold NaN or infinity" if broken is not None and not _is_zero(broken) else ""
    )
    for name in dict.fromkeys((LOSS, VAL_LOSS, metric)):
        value = row.get(name)
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(number):
            also = f"; {weights}" if weights else ""
            return f"{DIVERGED}: {name} is {number} at epoch {epoch}{also} (try a lower learning rate)"
    if weights:  # the loss and the metric look finite: a dead network behind a ReLU predicts a constant
        return f"{DIVERGED}: {weights} at epoch {epoch}, though the loss looks finite (try a lower learning rate)"
    return None


def configuration_failure(reason: str, started_at: float) -> dict[str, Any]:
    """The single, final result of a trial that cannot train its configuration.

    Every metric is NaN (Optuna records the trial as failed, ASHA never promotes it) and
    ``done`` ends the trial without Tune retrying it.
    """
    result: dict[str, Any] = {name: math.nan for name in base_fields()}
    result.update(
        {
            "epoch": 0,
            "epoch_seconds": 0.0,
            "train_seconds": 0.0,
            "samples_per_second": 0.0,
            "finished_at": time.time(),
            FAILURE: reason,
            STARTED_AT: started_at,
            REPORTED_AT: time.time(),
            "done": True,
        }
    )
    return result


__all__ = [
    "NONFINITE_WEIGHTS",
    "CLASS_KINDS",
    "DICE",
    "FAILURE",
    "GROUP_STARTUP",
    "IOU",
    "LOSS",
    "NODE",
    "PID",
    "REPORTED_AT",
    "SEARCH_METRICS",
    "STARTED_AT",
    "TRACKED",
    "TRIAL_SETUP",
    "VAL_DICE",
    "VAL_IOU",
    "VAL_LOSS",
    "WARM",
    "EpochMetrics",
    "base_fields",
    "better_direction",
    "class_metric",
    "class_metrics",
    "configuration_failure",
    "is_class_metric",
    "is_known_metric",
    "result_metrics",
]
