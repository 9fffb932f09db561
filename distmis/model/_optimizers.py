"""Optimisers from config: Adam (lr, beta_2, amsgrad: the dimensions a search varies most), SGD, AdamW."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

    from distmis.config import OptimizerConfig


def build_optimizer(
    cfg: OptimizerConfig, *, learning_rate: float | keras.optimizers.schedules.LearningRateSchedule | None = None
) -> keras.optimizers.Optimizer:
    """Build a Keras optimiser; ``learning_rate`` overrides ``cfg.lr`` (e.g. a warm-up schedule)."""
    import keras

    lr = cfg.lr if learning_rate is None else learning_rate
    if cfg.name == "adam":
        return keras.optimizers.Adam(lr, beta_1=cfg.beta_1, beta_2=cfg.beta_2, amsgrad=cfg.amsgrad)
    if cfg.name == "adamw":
        return keras.optimizers.AdamW(
            lr, weight_decay=cfg.weight_decay, beta_1=cfg.beta_1, beta_2=cfg.beta_2, amsgrad=cfg.amsgrad
        )
    return keras.optimizers.SGD(lr, momentum=cfg.momentum)
