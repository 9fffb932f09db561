"""Model: 3D U-Net, per-example segmentation losses and metrics, optimisers."""

from distmis.model._losses import (
    LOSSES,
    class_scores,
    dice_loss,
    dice_score,
    get_loss,
    hard_prediction,
    iou_score,
    soft_dice,
)
from distmis.model._optimizers import build_optimizer
from distmis.model._unet import build_unet

__all__ = [
    "LOSSES",
    "build_optimizer",
    "build_unet",
    "class_scores",
    "dice_loss",
    "dice_score",
    "get_loss",
    "hard_prediction",
    "iou_score",
    "soft_dice",
]
