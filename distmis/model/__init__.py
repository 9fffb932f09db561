"""Model: 3D U-Net, per-example segmentation losses and metrics, optimisers."""

from distmis.model._losses import (
    LOSSES,
    class_scores,
    dice_loss,
    dice_score,
    get_loss,
    iou_score,
    resolve_loss,
    soft_dice,
)
from distmis.model._optimizers import build_optimizer
from distmis.model._schedules import SCHEDULES, learning_rate_schedule
from distmis.model._unet import build_unet, deep_supervision_weights, full_resolution
from distmis.model._windows import cube_origins, gaussian_weight, window_starts

__all__ = [
    "cube_origins",
    "gaussian_weight",
    "window_starts",
    "LOSSES",
    "SCHEDULES",
    "build_optimizer",
    "build_unet",
    "deep_supervision_weights",
    "full_resolution",
    "class_scores",
    "dice_loss",
    "dice_score",
    "get_loss",
    "iou_score",
    "learning_rate_schedule",
    "resolve_loss",
    "soft_dice",
]
