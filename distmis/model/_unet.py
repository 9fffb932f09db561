"""3D U-Net (Çiçek et al., 2016) as a Keras 3 functional model.

Normalisation is always over the channel axis (-1, channels-last). The prototype normalised
the wrong axis and its group normalisation crashed for 8 filters; here ``instance`` is group
normalisation with one channel per group, ``group`` checks that ``groups`` divides the
filters before building, and ``sync_batch`` synchronises batch statistics across the
replicas of a data-parallel trial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

    from distmis.config import ModelConfig


def _norm(kind: str, groups: int, name: str):  # noqa: ANN202
    import keras

    if kind == "batch":
        return keras.layers.BatchNormalization(axis=-1, name=name)
    if kind == "sync_batch":
        # statistics reduced over all replicas of a data-parallel trial (as the CSCS course
        # recommends for small per-replica batches); identical to "batch" on one replica
        return keras.layers.BatchNormalization(axis=-1, synchronized=True, name=name)
    if kind == "group":
        return keras.layers.GroupNormalization(groups=groups, axis=-1, name=name)
    if kind == "instance":
        return keras.layers.GroupNormalization(groups=-1, axis=-1, name=name)
    return None


def _conv_block(x, filters: int, cfg: "ModelConfig", name: str):  # noqa: ANN001, ANN202
    import keras

    for i in (1, 2):
        x = keras.layers.Conv3D(
            filters, cfg.kernel_size, padding="same", use_bias=cfg.norm == "none", name=f"{name}_conv{i}"
        )(x)
        norm = _norm(cfg.norm, cfg.groups, f"{name}_norm{i}")
        if norm is not None:
            x = norm(x)
        x = keras.layers.Activation("relu", name=f"{name}_relu{i}")(x)
    if cfg.dropout > 0:
        x = keras.layers.SpatialDropout3D(cfg.dropout, name=f"{name}_drop")(x)
    return x


def build_unet(cfg: "ModelConfig", *, channels: int, num_classes: int, name: str = "unet3d") -> "keras.Model":
    """Build a 3D U-Net with a free spatial input shape (patches in training, volumes at inference).

    Args:
        cfg: depth, base filters (doubled per level), kernel size, normalisation, dropout.
        channels: input modalities.
        num_classes: 1 -> one sigmoid channel (binary); K > 1 -> K softmax channels.

    Raises:
        ValueError: when ``groups`` does not divide the filters of group normalisation.
    """
    import keras

    if cfg.norm == "group" and cfg.filters % cfg.groups:
        raise ValueError(
            f"group normalisation expects groups to divide filters. Received: groups={cfg.groups}, filters={cfg.filters}"
        )
    inputs = keras.Input(shape=(None, None, None, channels), name="image")
    x = inputs
    skips = []
    for level in range(cfg.depth - 1):
        x = _conv_block(x, cfg.filters * 2**level, cfg, f"down{level}")
        skips.append(x)
        x = keras.layers.MaxPooling3D(2, name=f"pool{level}")(x)
    x = _conv_block(x, cfg.filters * 2 ** (cfg.depth - 1), cfg, "bottom")
    for level in reversed(range(cfg.depth - 1)):
        x = keras.layers.Conv3DTranspose(cfg.filters * 2**level, 2, strides=2, name=f"up{level}_tconv")(x)
        x = keras.layers.Concatenate(axis=-1, name=f"up{level}_concat")([x, skips[level]])
        x = _conv_block(x, cfg.filters * 2**level, cfg, f"up{level}")
    activation = "sigmoid" if num_classes == 1 else "softmax"
    # float32 output even under mixed precision: the loss needs full precision
    outputs = keras.layers.Conv3D(num_classes, 1, activation=activation, dtype="float32", name="segmentation")(x)
    return keras.Model(inputs, outputs, name=name)
