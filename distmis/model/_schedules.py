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


def learning_rate_at(
    step: float, *, kind: str, peak: float, start: float, warmup_steps: int, total_steps: int
) -> float:
    """The learning rate of update ``step`` (0-based), in plain Python (tests, plots)."""
    if warmup_steps and step < warmup_steps:
        return start + (peak - start) * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    t = min(max(t, 0.0), 1.0)
    if kind == "poly":
        return peak * (1.0 - t) ** POLY_EXPONENT
    if kind == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * t))
    return peak


def learning_rate_schedule(
    *, kind: str, peak: float, start: float, warmup_steps: int, total_steps: int
) -> Any:  # keras.optimizers.schedules.LearningRateSchedule | float
    """A Keras schedule for :func:`learning_rate_at`; a plain float when nothing varies.

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
    """Built once, lazily: Keras is imported only when a model is trained."""
    import keras

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


__all__ = ["SCHEDULES", "learning_rate_at", "learning_rate_schedule"]
