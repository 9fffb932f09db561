"""Optimisers from config: Adam (lr, beta_2, amsgrad: the dimensions a search varies most), SGD, AdamW.

nnU-Net's optimiser is SGD with Nesterov momentum 0.99, weight decay 3e-5 and the gradient's norm
clipped at 12. Keras's weight decay is decoupled (the weights shrink by lr x decay each update),
where torch's SGD adds decay x weight to the gradient, which momentum then carries: at nnU-Net's
3e-5 both are a small pull towards zero, and the decoupled form is the one Keras has.
"""

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
    clip = {"global_clipnorm": cfg.global_clipnorm} if cfg.global_clipnorm else {}
    if cfg.name == "adam":
        return keras.optimizers.Adam(lr, beta_1=cfg.beta_1, beta_2=cfg.beta_2, amsgrad=cfg.amsgrad, **clip)
    if cfg.name == "adamw":
        return keras.optimizers.AdamW(
            lr, weight_decay=cfg.weight_decay, beta_1=cfg.beta_1, beta_2=cfg.beta_2, amsgrad=cfg.amsgrad, **clip
        )
    return keras.optimizers.SGD(
        lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay or None, **clip
    )
