"""A training step's seconds for a planned model on this machine, measured in a few steps.

``distmis init --budget`` sizes a search (trials, epochs, steps per epoch) from the seconds one
step takes. Estimating them from a FLOP count would need a per-device throughput that nobody
knows for their CPU or GPU; a few real steps of the planned network on random data of the planned
patch and batch cost seconds and are right for the machine they run on. ``--step-seconds`` gives
the figure for another machine (the cluster the search will run on).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distmis.config import ModelConfig, OptimizerConfig


def measure_step_seconds(
    model_config: ModelConfig,
    optimizer_config: OptimizerConfig,
    *,
    patch: tuple[int, int, int],
    channels: int,
    classes: int,
    batch: int,
    steps: int = 3,
) -> float:
    """The median seconds of ``steps`` training steps after one warm-up step (the trace)."""
    import numpy as np
    import tensorflow as tf

    from distmis.model import build_optimizer, build_unet, deep_supervision_weights, get_loss

    model = build_unet(model_config, channels=channels, num_classes=classes)
    optimizer = build_optimizer(optimizer_config)
    mode = "binary" if classes == 1 else "multiclass"
    loss_fn = get_loss("dice_ce" if classes > 1 else "dice", mode)
    weights = deep_supervision_weights(len(model.outputs))
    rng = np.random.default_rng(0)
    image = tf.constant(rng.normal(size=(batch, *patch, channels)).astype(np.float32))
    label = tf.one_hot(rng.integers(0, max(classes, 2), size=(batch, *patch)), max(classes, 2))[..., -classes:]

    @tf.function
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            outputs = model(image, training=True)
            outputs = outputs if isinstance(outputs, list) else [outputs]
            loss = tf.add_n(
                [w * tf.reduce_mean(loss_fn(label[:, :: 2**i, :: 2**i, :: 2**i], o)) for i, (w, o) in
                 enumerate(zip(weights, outputs, strict=True))]
            )  # fmt: skip
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    step()  # the trace and the first allocation
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step().numpy()
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


__all__ = ["measure_step_seconds"]
