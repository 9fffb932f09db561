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


def _foreground(y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Drop the background channel of softmax (``exclusive``) outputs; sigmoid channels
    (binary, regions) are all foreground. ``None``: softmax when there is more than one channel."""
    if exclusive is None:
        exclusive = y_true.shape[-1] is not None and y_true.shape[-1] > 1
    if exclusive:
        return y_true[..., 1:], y_pred[..., 1:]
    return y_true, y_pred


def soft_dice(y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None) -> tf.Tensor:
    """Soft Dice coefficient per example, averaged over foreground classes. Shape ``[batch]``."""
    import tensorflow as tf

    y_true, y_pred = _foreground(tf.cast(y_true, tf.float32), tf.cast(y_pred, tf.float32), exclusive)
    inter = tf.reduce_sum(y_true * y_pred, axis=_SPATIAL)
    denom = tf.reduce_sum(y_true, axis=_SPATIAL) + tf.reduce_sum(y_pred, axis=_SPATIAL)
    return tf.reduce_mean((2.0 * inter + SMOOTH) / (denom + SMOOTH), axis=-1)


def hard_prediction(y_pred: tf.Tensor, exclusive: bool | None = None) -> tf.Tensor:
    """Thresholded (sigmoid channels) or argmax one-hot (softmax) prediction, float32."""
    import tensorflow as tf

    if exclusive is None:
        exclusive = y_pred.shape[-1] is not None and y_pred.shape[-1] > 1
    if not exclusive:
        return tf.cast(y_pred > 0.5, tf.float32)
    return tf.one_hot(tf.argmax(y_pred, axis=-1), tf.shape(y_pred)[-1], dtype=tf.float32)


def overlap_per_class(y_true: tf.Tensor, y_hat: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Hard Dice and IoU per example and channel (``[batch, C]``); empty truth and prediction score 1."""
    import tensorflow as tf

    inter = tf.reduce_sum(y_true * y_hat, axis=_SPATIAL)
    total = tf.reduce_sum(y_true, axis=_SPATIAL) + tf.reduce_sum(y_hat, axis=_SPATIAL)
    union = tf.reduce_sum(tf.maximum(y_true, y_hat), axis=_SPATIAL)
    dice = tf.where(total > 0, 2.0 * inter / tf.maximum(total, 1e-12), 1.0)
    iou = tf.where(union > 0, inter / tf.maximum(union, 1e-12), 1.0)
    return dice, iou


def class_scores(
    y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None, regions: list[list[int]] | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-example, per-class hard Dice and IoU (``[batch, C]``), foreground classes only.

    ``regions`` (softmax outputs only): also score these unions of label values, computed from
    the one-hot truth and the argmax prediction, appended after the classes.
    """
    import tensorflow as tf

    y_true = tf.cast(y_true, tf.float32)
    y_hat = hard_prediction(tf.cast(y_pred, tf.float32), exclusive)
    t, p = _foreground(y_true, y_hat, exclusive)
    if regions:
        t = tf.concat([t, *[tf.reduce_max(tf.gather(y_true, r, axis=-1), axis=-1, keepdims=True) for r in regions]], -1)
        p = tf.concat([p, *[tf.reduce_max(tf.gather(y_hat, r, axis=-1), axis=-1, keepdims=True) for r in regions]], -1)
    return overlap_per_class(t, p)


def dice_score(y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None) -> tf.Tensor:
    """Hard (thresholded / argmax) Dice per example, the mean over foreground classes."""
    import tensorflow as tf

    return tf.reduce_mean(class_scores(y_true, y_pred, exclusive)[0], axis=-1)


def iou_score(y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None) -> tf.Tensor:
    """Hard intersection-over-union per example, the mean over foreground classes."""
    import tensorflow as tf

    return tf.reduce_mean(class_scores(y_true, y_pred, exclusive)[1], axis=-1)


def dice_loss(y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None) -> tf.Tensor:
    return 1.0 - soft_dice(y_true, y_pred, exclusive)


def _crossentropy(y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None) -> tf.Tensor:
    import keras
    import tensorflow as tf

    y_true, y_pred = tf.cast(y_true, tf.float32), tf.cast(y_pred, tf.float32)
    if exclusive is None:
        exclusive = y_pred.shape[-1] is not None and y_pred.shape[-1] > 1
    if not exclusive:  # one sigmoid channel, or one per region: binary cross-entropy per channel
        voxel = keras.losses.binary_crossentropy(y_true, y_pred)
    else:
        voxel = keras.losses.categorical_crossentropy(y_true, y_pred)
    return tf.reduce_mean(voxel, axis=_SPATIAL)


def dice_bce_loss(y_true: tf.Tensor, y_pred: tf.Tensor, exclusive: bool | None = None) -> tf.Tensor:
    return dice_loss(y_true, y_pred, exclusive) + _crossentropy(y_true, y_pred, exclusive)


LOSSES: dict[str, Callable[..., tf.Tensor]] = {
    "dice": dice_loss,
    "dice_bce": dice_bce_loss,
    "dice_ce": dice_bce_loss,  # same function: sigmoid outputs -> BCE, softmax -> categorical CE
}


def resolve_loss(name: str, label_mode: str) -> str:
    """``auto``: Dice for one binary channel; Dice + cross-entropy for softmax classes and sigmoid regions.

    nnU-Net trains every task with Dice + cross-entropy: the Dice term balances the classes, the
    cross-entropy term gives every voxel its own gradient, which thin structures (one or two voxels
    across) need; a binary tumour mask at these sizes trains as well with Dice alone. ``distmis
    init`` writes ``dice_bce`` for a binary label all the same: on real anatomy it helped a small
    structure and did not cost a large one (docs/benchmarks.md, "nnU-Net's loss on the binary path").
    """
    if name != "auto":
        return name
    return "dice" if label_mode == "binary" else "dice_ce"


def get_loss(name: str, label_mode: str | None = None) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """Look a per-example loss up by name; with ``label_mode``, bound to its output kind
    (``multiclass`` softmax: background channel excluded; ``binary``/``regions`` sigmoid: all channels)."""
    try:
        loss = LOSSES[name]
    except KeyError:
        raise ValueError(f"Could not interpret loss identifier: {name!r}; expected one of {sorted(LOSSES)}") from None
    if label_mode is None:
        return loss
    exclusive = label_mode == "multiclass"
    return lambda y_true, y_pred: loss(y_true, y_pred, exclusive)
