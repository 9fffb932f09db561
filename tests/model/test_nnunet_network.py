"""nnU-Net's network in Keras: the same parameters as nnU-Net's for the same plan, and deep supervision.

nnU-Net's count is computed here from its published architecture (dynamic-network-architectures'
``PlainConvUNet``: ``PlainConvEncoder`` + ``UNetDecoder``), not by importing torch: every stage is
``n_conv_per_stage`` 3x3x3 convolutions with bias, each followed by an affine instance norm; a decoder
stage is a 2x2x2 transposed convolution with bias from the stage below, the concatenation with the
skip, its convolutions, and a 1x1 segmentation head with bias, built on every decoder stage whether
deep supervision is on or not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from distmis.config import ModelConfig
from distmis.model import build_unet, deep_supervision_weights, full_resolution


def _conv(cin: int, cout: int, k: int | tuple[int, ...] = 3) -> int:
    size = k**3 if isinstance(k, int) else math.prod(k)
    return size * cin * cout + cout  # weights + bias (nnU-Net's conv_bias: True)


def nnunet_parameters(
    channels: int,
    classes: int,
    features: list[int],
    convs: int = 2,
    kernels: list[tuple[int, int, int]] | None = None,
    pools: list[tuple[int, int, int]] | None = None,
) -> int:
    """``PlainConvUNet``'s trainable parameters for ``features`` per stage (the plan's
    ``features_per_stage``), ``n_conv_per_stage`` = ``n_conv_per_stage_decoder`` = ``convs``, and the
    plan's ``kernel_sizes`` and ``strides`` below the first stage (default 3 and 2 along every axis)."""
    kernels = kernels or [(3, 3, 3)] * len(features)
    pools = pools or [(2, 2, 2)] * (len(features) - 1)
    total = 0
    cin = channels
    for f, k in zip(features, kernels, strict=True):  # encoder: a stage's first convolution changes the width
        for i in range(convs):
            total += _conv(cin if i == 0 else f, f, k) + 2 * f  # + instance norm's affine scale and shift
        cin = f
    stages = list(zip(features[:0:-1], features[-2::-1], kernels[-2::-1], pools[::-1], strict=True))
    for below, skip, k, pool in stages:  # decoder, lowest stage first
        total += _conv(below, skip, k=pool)  # transposed convolution, its kernel and stride the pooling
        for i in range(convs):
            total += _conv(2 * skip if i == 0 else skip, skip, k) + 2 * skip
        total += _conv(skip, classes, k=1)  # its segmentation head
    return total


def nnunet_model(depth: int) -> ModelConfig:
    return ModelConfig(
        depth=depth,
        filters=32,
        max_filters=320,
        norm="instance",
        activation="leaky_relu",
        downsample="strided",
        deep_supervision=True,
    )


@pytest.mark.parametrize(
    ("depth", "channels", "classes"),
    [
        (4, 2, 3),  # the anatomy task at 48 x 56 x 48: three poolings to a 6 x 7 x 6 bottleneck
        (5, 1, 2),
        (6, 4, 4),  # MSD Task01 (BraTS) at 128^3: nnU-Net's plan, features 32 .. 320, 320
    ],
)
def test_same_parameter_count_as_nnunet_for_the_same_plan(depth: int, channels: int, classes: int) -> None:
    cfg = nnunet_model(depth)
    features = [min(32 * 2**s, 320) for s in range(depth)]
    assert cfg.level_filters() == features
    expected = nnunet_parameters(channels, classes, features)
    got = build_unet(cfg, channels=channels, num_classes=classes).count_params()
    # the only difference: no bias before instance norm (it is cancelled by the mean subtraction)
    assert abs(got - expected) / expected < 0.01, (got, expected)
    biases = sum(f * 2 for f in features) + sum(f * 2 for f in features[:-1])
    assert got == expected - biases
    if depth == 4:
        assert 5.5e6 < expected < 5.7e6  # the 5.6 M parameters nnU-Net reported on the anatomy task


def test_deep_supervision_weights_are_nnunets() -> None:
    assert deep_supervision_weights(1) == [1.0]
    # 1, 1/2, 1/4 and the lowest 0, normalised
    np.testing.assert_allclose(deep_supervision_weights(4), np.array([1, 0.5, 0.25, 0]) / 1.75)
    np.testing.assert_allclose(sum(deep_supervision_weights(5)), 1.0)
    assert deep_supervision_weights(2) == [1.0, 0.0]


@pytest.mark.filterwarnings("error::UserWarning")  # the view takes the image tensor as validation passes it
def test_deep_supervised_outputs_and_the_full_resolution_view() -> None:
    model = build_unet(nnunet_model(4).model_copy(update={"filters": 4, "max_filters": 12}), channels=2, num_classes=3)
    x = np.random.default_rng(0).normal(size=(1, 16, 24, 16, 2)).astype(np.float32)
    outs = model(x, training=False)
    assert [tuple(o.shape) for o in outs] == [(1, 16, 24, 16, 3), (1, 8, 12, 8, 3), (1, 4, 6, 4, 3)]
    main = full_resolution(model)
    np.testing.assert_allclose(main(x).numpy(), outs[0].numpy(), rtol=1e-5, atol=1e-6)
    assert len(main.weights) < len(model.weights)  # the lower heads are not in the inference model
    plain = build_unet(ModelConfig(depth=3, filters=4, norm="none"), channels=2, num_classes=1)
    assert full_resolution(plain) is plain


def test_strided_leaky_model_builds_without_pooling() -> None:
    model = build_unet(nnunet_model(3).model_copy(update={"deep_supervision": False}), channels=1, num_classes=1)
    names = [layer.name for layer in model.layers]
    assert not any(n.startswith("pool") for n in names)
    assert model.get_layer("down1_conv1").strides == (2, 2, 2)
    assert abs(model.get_layer("down0_relu1").negative_slope - 0.01) < 1e-9
    assert model.get_layer("bottom_conv1").strides == (2, 2, 2)


#: nnunetv2 2.8.1's ``get_pool_and_conv_props(spacing, shape, 4, 999999)`` (its 3d_fullres planner's call),
#: run on these shapes and spacings: the pooling below each stage and every stage's kernels
NNUNET_PLANNER = [
    (
        [64, 80, 28],
        [2.0, 2.0, 5.0],
        [(2, 2, 1), (2, 2, 2), (2, 2, 2), (2, 2, 1)],
        [(3, 3, 1), (3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3)],
    ),
    (
        [128, 128, 32],
        [1.0, 1.0, 2.0],
        [(2, 2, 1), (2, 2, 2), (2, 2, 2), (2, 2, 2), (2, 2, 1)],
        [(3, 3, 1), (3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3)],
    ),
    (
        [160, 192, 64],
        [0.8, 0.8, 2.5],
        [(2, 2, 1), (2, 2, 2), (2, 2, 2), (2, 2, 2), (2, 2, 2)],
        [(3, 3, 1), (3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3)],
    ),
    (  # the thick axis, the longest, pooled last and alone
        [96, 96, 96],
        [1.0, 1.0, 3.0],
        [(2, 2, 1), (2, 2, 2), (2, 2, 2), (2, 2, 2), (1, 1, 2)],
        [(3, 3, 1), (3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3), (3, 3, 3)],
    ),
]


@pytest.mark.parametrize(("shape", "spacing", "pools", "kernels"), NNUNET_PLANNER)
def test_anisotropic_data_gets_nnunets_pooling_and_kernels(
    shape: list[int], spacing: list[float], pools: list[tuple[int, int, int]], kernels: list[tuple[int, int, int]]
) -> None:
    from distmis.recipes import NNUNET

    topology = NNUNET.topology(shape, spacing)
    assert (topology.depth, topology.pools, topology.kernels) == (len(pools) + 1, pools, kernels)


def test_the_planner_stops_at_the_recipes_depth_and_leaves_near_isotropic_data_alone() -> None:
    from distmis.recipes import DISTMIS, NNUNET

    # nnU-Net plans 7 stages for 320 x 320 x 20 at 0.6 x 0.6 x 3.6 mm; the recipe keeps its 6, the first 5 poolings
    prostate = NNUNET.topology([320, 320, 20], [0.6, 0.6, 3.6])
    assert prostate.depth == 6 and prostate.pools == [(2, 2, 1), (2, 2, 1), (2, 2, 2), (2, 2, 2), (2, 2, 1)]
    # under 2x between the finest and the coarsest spacing nnU-Net pools every axis: the model's default
    near = NNUNET.topology([40, 56, 40], [1.0, 1.0, 1.9])
    assert near.pools is None and near.kernels is None and near.depth == NNUNET.depth(40)
    # distmis's recipe: its deeper maps (16 voxels), and at least its 3 levels even where the slices run out
    thick = DISTMIS.topology([64, 80, 28], [2.0, 2.0, 5.0])
    assert thick.depth == 3 and thick.pools == [(2, 2, 1), (2, 2, 2)]
    assert thick.kernels == [(3, 3, 1), (3, 3, 3), (3, 3, 3)]


def test_an_anisotropic_network_has_nnunets_parameter_count_and_heads() -> None:
    shape, spacing, pools, kernels = NNUNET_PLANNER[0]
    cfg = nnunet_model(len(pools) + 1).model_copy(update={"pools": pools, "kernels": kernels})
    features = [min(32 * 2**s, 320) for s in range(cfg.depth)]
    expected = nnunet_parameters(1, 3, features, kernels=kernels, pools=pools)
    got = build_unet(cfg, channels=1, num_classes=3).count_params()
    biases = sum(f * 2 for f in features) + sum(f * 2 for f in features[:-1])
    assert got == expected - biases
    assert got < build_unet(nnunet_model(cfg.depth), channels=1, num_classes=3).count_params()  # 3x3x1 kernels
    small = cfg.model_copy(update={"filters": 2, "max_filters": 4})
    outs = build_unet(small, channels=1, num_classes=3)(np.zeros((1, 32, 32, 16, 1), np.float32), training=False)
    # each head at its level's scale along each axis: the step deep supervision takes its labels at
    scales = small.level_scales()
    assert small.divisors() == (16, 16, 4)
    assert [tuple(o.shape[1:4]) for o in outs] == [(32 // a, 32 // b, 16 // c) for a, b, c in scales[:-1]]


@pytest.mark.parametrize("downsample", ["maxpool", "strided"])
@pytest.mark.parametrize("thick", [True, False])
def test_the_plans_convolution_work_is_the_built_networks_multiply_adds(downsample: str, thick: bool) -> None:
    """init weighs a wider network's step by :func:`conv_work`: it must count what the network the file
    describes computes, kernels and pooling per axis included (transposed convolutions and heads aside)."""
    import keras

    from distmis.data import conv_work
    from distmis.recipes import DISTMIS, Topology

    topology = DISTMIS.topology([64, 80, 28], [2.0, 2.0, 5.0]) if thick else Topology(depth=3)
    cfg = ModelConfig(
        depth=topology.depth,
        filters=8,
        norm="instance",
        downsample=downsample,
        pools=topology.pools,
        kernels=topology.kernels,
    )
    assert cfg.level_scales() == topology.level_scales() and cfg.divisors() == topology.divisors()
    patch = [16, 16, 8]
    model = build_unet(cfg, channels=2, num_classes=3)
    convs = [
        layer for layer in model.layers if type(layer) is keras.layers.Conv3D and layer.kernel.shape[:3] != (1, 1, 1)
    ]
    outputs = keras.Model(model.inputs, [layer.output for layer in convs])(
        {"image": np.zeros((1, *patch, 2), np.float32)}
    )
    macs = sum(math.prod(c.kernel.shape) * math.prod(o.shape[1:4]) for c, o in zip(convs, outputs, strict=True))
    assert conv_work(patch, topology=topology, filters=8, max_filters=None, channels=2) == macs
