"""3D U-Net (Çiçek et al., 2016) as a Keras 3 functional model, with nnU-Net's variants as options.

nnU-Net's ``PlainConvUNet`` (dynamic-network-architectures) differs from the classic U-Net in four
ways, each a ``model`` key here so that a search can vary it and a benchmark can measure it: the
filters per level are capped (``max_filters``, 320 in 3D), the activation is a leaky ReLU
(``activation``), a level starts with a strided convolution instead of max pooling
(``downsample: strided``), and every decoder level has a 1x1 head trained on labels down-sampled to
it (``deep_supervision``). Its convolutions also carry a bias before instance normalisation, which the
normalisation's mean subtraction cancels; they are left out here (the parameter counts differ by
the number of convolution channels, well under 1 %).

Normalisation is always over the channel axis (-1, channels-last), whatever the layer: over
any other axis it would mix voxels, not channels. ``instance`` is group
normalisation with one channel per group, ``group`` checks that ``groups`` divides the
filters before building, and ``sync_batch`` synchronises batch statistics across the
replicas of a data-parallel trial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

    from distmis.config import ModelConfig, Vec3


#: Keras's BatchNormalization momentum for its moving statistics
BATCH_NORM_MOMENTUM = 0.99


def _norm(kind: str, groups: int, name: str, *, recomputed: bool = False):  # noqa: ANN202
    import keras

    # A rematerialised block runs its training forward pass twice per step (once forward, once
    # again in the backward pass), and batch normalisation updates its moving statistics each
    # time, from the same batch. Two updates with momentum sqrt(m) are exactly one with m:
    # M <- m'(m'M + (1-m')x) + (1-m')x = m'^2 M + (1-m'^2) x. (Keras and TensorFlow have no
    # switch to skip the update on recomputation.) Tested against the same model without remat.
    momentum = BATCH_NORM_MOMENTUM**0.5 if recomputed else BATCH_NORM_MOMENTUM
    if kind == "batch":
        return keras.layers.BatchNormalization(axis=-1, momentum=momentum, name=name)
    if kind == "sync_batch":
        # statistics reduced over all replicas of a data-parallel trial (as the CSCS course
        # recommends for small per-replica batches); identical to "batch" on one replica
        return keras.layers.BatchNormalization(axis=-1, momentum=momentum, synchronized=True, name=name)
    if kind == "group":
        return keras.layers.GroupNormalization(groups=groups, axis=-1, name=name)
    if kind == "instance":
        return keras.layers.GroupNormalization(groups=-1, axis=-1, name=name)
    return None


#: nnU-Net's leaky ReLU slope (torch's LeakyReLU default; Keras's default is 0.3)
LEAKY_SLOPE = 0.01


def _activation(kind: str, name: str):  # noqa: ANN202
    import keras

    if kind == "leaky_relu":
        return keras.layers.LeakyReLU(negative_slope=LEAKY_SLOPE, name=name)
    return keras.layers.Activation("relu", name=name)


def _block_layers(
    filters: int,
    cfg: ModelConfig,
    name: str,
    *,
    kernel: Vec3,
    stride: int | Vec3 = 1,
    recomputed: bool = False,
) -> list:
    """conv -> norm -> activation, twice, at ``kernel``, the first convolution at ``stride`` (dropout is
    applied by :func:`_conv_block`)."""
    import keras

    layers = []
    for i in (1, 2):
        layers.append(
            keras.layers.Conv3D(
                filters,
                kernel,
                strides=stride if i == 1 else 1,
                padding="same",
                use_bias=cfg.norm == "none",
                name=f"{name}_conv{i}",
            )
        )
        norm = _norm(cfg.norm, cfg.groups, f"{name}_norm{i}", recomputed=recomputed)
        if norm is not None:
            layers.append(norm)
        layers.append(_activation(cfg.activation, f"{name}_relu{i}"))
    return layers


def _conv_block(x, filters: int, cfg: ModelConfig, name: str, *, kernel: Vec3, skip=None, stride: int | Vec3 = 1):  # noqa: ANN001, ANN202
    """The block's two convolutions; a decoder block first concatenates ``skip`` to ``x``."""
    import keras

    layers = _block_layers(filters, cfg, name, kernel=kernel, stride=stride, recomputed=cfg.remat)
    if skip is not None:
        layers.insert(0, keras.layers.Concatenate(axis=-1, name=f"{name}_concat"))
    inputs = x if skip is None else [x, skip]
    if cfg.remat:
        # a decoder block's concatenation is recomputed too: otherwise the concatenated tensor,
        # as large as the up-sampled and skip tensors together, is kept as the block's input,
        # while the skip tensor is kept anyway (the encoder's pooling needs it)
        x = _remat_block_class()(layers, name=name)(inputs)
    else:
        x = inputs
        for layer in layers:
            x = layer(x)
    if cfg.dropout > 0:
        # outside the rematerialised block: its recomputation would draw a new dropout mask (the
        # seed generator has moved on), and the gradient would not be the forward pass's
        x = keras.layers.SpatialDropout3D(cfg.dropout, name=f"{name}_drop")(x)
    return x


def _remat_block_class():  # noqa: ANN202 - built lazily: Keras is imported only when a model is built
    import keras

    class RematBlock(keras.layers.Layer):
        """A convolution block as one layer whose training forward pass is recomputed in the
        backward pass (``keras.remat``): only the block's inputs are kept for the gradient, not its
        concatenation, convolution, normalisation and activation outputs.

        ``keras.RematScope`` would pass ``training`` to TensorFlow's ``custom_gradient`` as a
        keyword, which graph mode refuses; so the block closes over it and hands ``keras.remat``
        a function of the input tensors alone (positional: ``custom_gradient`` takes no list).
        """

        def __init__(self, layers: list, **kwargs) -> None:  # noqa: ANN003
            super().__init__(**kwargs)
            self.block = layers

        def _forward(self, inputs, training):  # noqa: ANN001, ANN202
            x = inputs if len(inputs) > 1 else inputs[0]
            for layer in self.block:
                x = layer(x, training=training) if _takes_training(layer) else layer(x)
            return x

        def call(self, inputs, training=None):  # noqa: ANN001, ANN202 - Keras tensors
            tensors = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if not training:  # inference (and the symbolic build) keeps nothing for a backward pass
                return self._forward(tensors, training)
            return keras.remat(lambda *args: self._forward(list(args), training))(*tensors)

    return RematBlock


def _takes_training(layer) -> bool:  # noqa: ANN001
    import keras

    return isinstance(layer, keras.layers.BatchNormalization)


def build_unet(
    cfg: ModelConfig, *, channels: int, num_classes: int, activation: str | None = None, name: str = "unet3d"
) -> keras.Model:
    """Build a 3D U-Net with a free spatial input shape (patches in training, volumes at inference).

    With ``cfg.deep_supervision`` the model has one output per decoder level, full resolution first
    (nnU-Net's order); :func:`full_resolution` gives the one-output model that inference uses, on
    the same weights.

    Args:
        cfg: depth, filters per level, kernel size, normalisation, activation, down-sampling,
            deep supervision, dropout, remat.
        channels: input modalities.
        num_classes: output channels.
        activation: ``sigmoid`` (binary, or one channel per region) or ``softmax`` (one channel
            per label value); default sigmoid for one channel, softmax for more.

    Raises:
        ValueError: when ``groups`` does not divide the filters of group normalisation.
    """
    import keras

    filters = cfg.level_filters()
    if cfg.norm == "group" and any(f % cfg.groups for f in filters):
        raise ValueError(
            f"group normalisation expects groups to divide filters. Received: groups={cfg.groups}, filters={filters}"
        )
    strided = cfg.downsample == "strided"
    # pools[level]: the down-sampling from level to level + 1, along each axis (nnU-Net's anisotropic
    # pooling when the model's pools say so); kernels[level]: the level's convolution size
    pools, kernels = cfg.level_pools(), cfg.level_kernels()
    inputs = keras.Input(shape=(None, None, None, channels), name="image")
    x = inputs
    skips = []
    for level in range(cfg.depth - 1):
        stride = pools[level - 1] if strided and level else 1
        x = _conv_block(x, filters[level], cfg, f"down{level}", kernel=kernels[level], stride=stride)
        skips.append(x)
        if not strided:
            # pooled in float32: TensorFlow has no float16 MaxPool3D kernel on the CPU, so a
            # mixed_float16 model would not run there; the cast around one pooling is cheap
            x = keras.layers.MaxPooling3D(pools[level], name=f"pool{level}", dtype="float32")(x)
    bottom_stride = pools[-1] if strided and cfg.depth > 1 else 1
    x = _conv_block(x, filters[-1], cfg, "bottom", kernel=kernels[-1], stride=bottom_stride)
    activation = activation or ("sigmoid" if num_classes == 1 else "softmax")
    heads = []
    for level in reversed(range(cfg.depth - 1)):
        x = keras.layers.Conv3DTranspose(filters[level], pools[level], strides=pools[level], name=f"up{level}_tconv")(x)
        x = _conv_block(x, filters[level], cfg, f"up{level}", kernel=kernels[level], skip=skips[level])
        if cfg.deep_supervision and level:
            heads.append(_head(x, num_classes, activation, f"segmentation_level{level}"))
    # float32 output even under mixed precision: the loss needs full precision
    outputs = _head(x, num_classes, activation, "segmentation")
    if not heads:
        return keras.Model(inputs, outputs, name=name)
    return keras.Model(inputs, [outputs, *reversed(heads)], name=name)


def _head(x, num_classes: int, activation: str, name: str):  # noqa: ANN001, ANN202
    import keras

    return keras.layers.Conv3D(num_classes, 1, activation=activation, dtype="float32", name=name)(x)


def full_resolution(model: keras.Model) -> keras.Model:
    """The model itself, or for a deep-supervised one the same layers with only the full-resolution
    head as output (what validation and inference run: the lower heads would cost time for nothing)."""
    import keras

    if len(model.outputs) == 1:
        return model
    # the one input tensor, not the list ``model.inputs``: a view built on the list expects a list, and
    # Keras warns at every call with the image tensor that validation and inference pass
    (image,) = model.inputs
    return keras.Model(image, model.outputs[0], name=f"{model.name}_full_resolution")


def deep_supervision_weights(outputs: int) -> list[float]:
    """nnU-Net's weights of the outputs of a deep-supervised U-Net, full resolution first: 1/2^i, the
    lowest resolution's set to 0, normalised to sum to 1 (one output: ``[1.0]``)."""
    if outputs <= 1:
        return [1.0]
    weights = [1.0 / 2**i for i in range(outputs)]
    weights[-1] = 0.0
    total = sum(weights)
    return [w / total for w in weights]
