"""Learning-rate schedules: a linear warm-up, then constant, poly or cosine decay over the whole run.

nnU-Net trains every configuration with the poly schedule ``lr = lr0 (1 - epoch/epochs)^0.9``: a
large learning rate early finds the basin, a small one late settles the boundaries, which is where
the Dice of thin structures is won or lost. Here the schedule is a function of the optimiser's
update count (evaluated per step, so it is smooth within an epoch), which the checkpoint stores:
a resumed trial continues exactly where its schedule was. The horizon is ``train.epochs`` even
when the scheduler stops a trial early: a trial is judged on the learning rates it would have had.
"""

from __future__ import annotations

import functools
import math
from typing import Any

SCHEDULES = ("constant", "poly", "cosine")
POLY_EXPONENT = 0.9


def learning_rate_schedule(
    *, kind: str, peak: float, start: float, warmup_steps: int, total_steps: int
) -> Any:  # keras.optimizers.schedules.LearningRateSchedule | float
    """The Keras schedule of a run: a linear warm-up, then constant, poly or cosine decay; a plain
    float when nothing varies.

    Args:
        kind: ``constant``, ``poly`` or ``cosine`` (after the warm-up).
        peak: the learning rate after the warm-up (``optimizer.lr``, times the workers when scaled).
        start: where the warm-up starts (0, or the unscaled learning rate under linear scaling).
        warmup_steps: updates of linear warm-up from ``start`` to ``peak``.
        total_steps: updates of the whole run (``train.epochs`` x steps per epoch).
    """
    if kind not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {list(SCHEDULES)}, got {kind!r}")
    if kind == "constant" and not warmup_steps:
        return peak
    return _schedule_class()(kind, peak, start, warmup_steps, total_steps)


@functools.cache
def _schedule_class() -> type:
    """Built once, lazily (Keras is imported only when a model is trained), and registered with Keras
    so that an optimiser's saved configuration names it.

    One class rather than Keras's ``CosineDecay`` and ``PolynomialDecay``: ``PolynomialDecay`` has no
    warm-up, and ``CosineDecay``'s reaches the peak one update later than this one does, so
    switching would change every run's learning rates, and with them the recorded learning curves
    (``benchmarks/curves``) that simulations replay.
    """
    import keras

    @keras.saving.register_keras_serializable(package="distmis")
    class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
        """Linear warm-up to ``peak``, then constant, poly or cosine decay (see the module docstring)."""

        def __init__(self, kind: str, peak: float, start: float, warmup_steps: int, total_steps: int) -> None:
            self.kind, self.peak, self.start = kind, float(peak), float(start)
            self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)

        def __call__(self, step: Any) -> Any:
            import tensorflow as tf

            step = tf.cast(step, tf.float32)
            warm = float(max(self.warmup_steps, 1))
            warming = self.start + (self.peak - self.start) * (step + 1.0) / warm
            t = tf.clip_by_value((step - self.warmup_steps) / float(max(1, self.total_steps - self.warmup_steps)), 0, 1)
            if self.kind == "poly":
                decayed = self.peak * tf.pow(1.0 - t, POLY_EXPONENT)
            elif self.kind == "cosine":
                decayed = self.peak * 0.5 * (1.0 + tf.cos(math.pi * t))
            else:
                decayed = tf.constant(self.peak, tf.float32)
            if not self.warmup_steps:
                return decayed
            return tf.where(step < self.warmup_steps, warming, decayed)

        def get_config(self) -> dict[str, Any]:
            return {
                "kind": self.kind,
                "peak": self.peak,
                "start": self.start,
                "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps,
            }

    return WarmupDecay


__all__ = ["SCHEDULES", "learning_rate_schedule"]
