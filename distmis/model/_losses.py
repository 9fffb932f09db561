"""Segmentation losses and metrics as pure per-example functions.

They return one value per example (shape ``[batch]``), never a scalar: the training loop
averages them over the *global* batch with ``tf.nn.compute_average_loss``. A scalar loss
would skip the 1/num_replicas scaling and multiply the gradients by the replica count.
Keras' built-in ``Dice`` loss reduces over the batch, so it cannot be used that way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

SMOOTH = 1e-5
_SPATIAL = (1, 2, 3)


def _foreground(y_true: "tf.Tensor", y_pred: "tf.Tensor") -> tuple["tf.Tensor", "tf.Tensor"]:
    """Drop the background channel of multi-class outputs; binary outputs are all foreground."""
    if y_true.shape[-1] is not None and y_true.shape[-1] > 1:
        return y_true[..., 1:], y_pred[..., 1:]
    return y_true, y_pred


def soft_dice(y_true: "tf.Tensor", y_pred: "tf.Tensor") -> "tf.Tensor":
    """Soft Dice coefficient per example, averaged over foreground classes. Shape ``[batch]``."""
    import tensorflow as tf

    y_true, y_pred = _foreground(tf.cast(y_true, tf.float32), tf.cast(y_pred, tf.float32))
    inter = tf.reduce_sum(y_true * y_pred, axis=_SPATIAL)
    denom = tf.reduce_sum(y_true, axis=_SPATIAL) + tf.reduce_sum(y_pred, axis=_SPATIAL)
    return tf.reduce_mean((2.0 * inter + SMOOTH) / (denom + SMOOTH), axis=-1)


def _hard(y_pred: "tf.Tensor") -> "tf.Tensor":
    import tensorflow as tf

    if y_pred.shape[-1] == 1:
        return tf.cast(y_pred > 0.5, tf.float32)
    return tf.one_hot(tf.argmax(y_pred, axis=-1), tf.shape(y_pred)[-1], dtype=tf.float32)


def dice_score(y_true: "tf.Tensor", y_pred: "tf.Tensor") -> "tf.Tensor":
    """Hard (thresholded / argmax) Dice per example; empty truth and empty prediction score 1."""
    import tensorflow as tf

    y_true, y_hat = _foreground(tf.cast(y_true, tf.float32), _hard(tf.cast(y_pred, tf.float32)))
    inter = tf.reduce_sum(y_true * y_hat, axis=_SPATIAL)
    denom = tf.reduce_sum(y_true, axis=_SPATIAL) + tf.reduce_sum(y_hat, axis=_SPATIAL)
    return tf.reduce_mean(tf.where(denom > 0, 2.0 * inter / tf.maximum(denom, 1e-12), 1.0), axis=-1)


def iou_score(y_true: "tf.Tensor", y_pred: "tf.Tensor") -> "tf.Tensor":
    """Hard intersection-over-union per example; empty truth and prediction score 1."""
    import tensorflow as tf

    y_true, y_hat = _foreground(tf.cast(y_true, tf.float32), _hard(tf.cast(y_pred, tf.float32)))
    inter = tf.reduce_sum(y_true * y_hat, axis=_SPATIAL)
    union = tf.reduce_sum(tf.maximum(y_true, y_hat), axis=_SPATIAL)
    return tf.reduce_mean(tf.where(union > 0, inter / tf.maximum(union, 1e-12), 1.0), axis=-1)


def dice_loss(y_true: "tf.Tensor", y_pred: "tf.Tensor") -> "tf.Tensor":
    return 1.0 - soft_dice(y_true, y_pred)


def _crossentropy(y_true: "tf.Tensor", y_pred: "tf.Tensor") -> "tf.Tensor":
    import keras
    import tensorflow as tf

    y_true, y_pred = tf.cast(y_true, tf.float32), tf.cast(y_pred, tf.float32)
    if y_pred.shape[-1] == 1:
        voxel = keras.losses.binary_crossentropy(y_true, y_pred)
    else:
        voxel = keras.losses.categorical_crossentropy(y_true, y_pred)
    return tf.reduce_mean(voxel, axis=_SPATIAL)


def dice_bce_loss(y_true: "tf.Tensor", y_pred: "tf.Tensor") -> "tf.Tensor":
    return dice_loss(y_true, y_pred) + _crossentropy(y_true, y_pred)


LOSSES: dict[str, Callable[["tf.Tensor", "tf.Tensor"], "tf.Tensor"]] = {
    "dice": dice_loss,
    "dice_bce": dice_bce_loss,
    "dice_ce": dice_bce_loss,  # same function: binary -> BCE, multi-class -> categorical CE
}


def get_loss(name: str) -> Callable[["tf.Tensor", "tf.Tensor"], "tf.Tensor"]:
    """Look a per-example loss up by name."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"Could not interpret loss identifier: {name!r}; expected one of {sorted(LOSSES)}") from None
