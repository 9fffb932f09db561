"""U-Net shapes and normalisation axis; Dice/IoU on known arrays; per-example losses."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from distmis.config import ModelConfig, OptimizerConfig
from distmis.model import build_optimizer, build_unet, dice_loss, dice_score, get_loss, iou_score, soft_dice


def test_dice_and_iou_on_known_arrays() -> None:
    t = np.zeros((2, 4, 4, 4, 1), np.float32)
    p = np.zeros_like(t)
    t[0, :2] = 1  # 32 voxels
    p[0, :1] = 1  # 16 voxels, all inside the truth
    # example 1: both empty -> 1 by convention
    np.testing.assert_allclose(dice_score(t, p).numpy(), [2 * 16 / (32 + 16), 1.0], rtol=1e-6)
    np.testing.assert_allclose(iou_score(t, p).numpy(), [16 / 32, 1.0], rtol=1e-6)
    np.testing.assert_allclose(soft_dice(t, t).numpy(), [1.0, 1.0], rtol=1e-5)
    assert dice_loss(t, p).shape == (2,)  # per example, never reduced over the batch


def test_multiclass_dice_ignores_background() -> None:
    labels = np.zeros((1, 4, 4, 4), np.int32)
    labels[0, :2] = 1
    labels[0, 2:] = 2
    y = tf.one_hot(labels, 3)
    np.testing.assert_allclose(dice_score(y, y).numpy(), [1.0])
    wrong = tf.one_hot(np.where(labels == 1, 2, labels), 3)  # class 1 predicted as 2
    # class 1: 0 ; class 2: 2*32/(32+64)
    np.testing.assert_allclose(dice_score(y, wrong).numpy(), [(0 + 2 * 32 / 96) / 2], rtol=1e-6)


@pytest.mark.parametrize("norm", ["batch", "sync_batch", "group", "instance", "none"])
def test_unet_output_shape(norm: str) -> None:
    model = build_unet(ModelConfig(depth=3, filters=8, norm=norm, groups=4), channels=4, num_classes=1)
    x = np.random.default_rng(0).normal(size=(2, 16, 16, 16, 4)).astype(np.float32)
    y = model(x, training=False).numpy()
    assert y.shape == (2, 16, 16, 16, 1) and np.all((y >= 0) & (y <= 1))
    # fully convolutional: another volume size works at inference
    assert model(np.zeros((1, 32, 16, 24, 4), np.float32)).shape == (1, 32, 16, 24, 1)


def test_softmax_head_for_multiclass() -> None:
    model = build_unet(ModelConfig(depth=2, filters=4, norm="none"), channels=2, num_classes=4)
    y = model(np.zeros((1, 8, 8, 8, 2), np.float32)).numpy()
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-5)


def test_normalisation_is_over_channels() -> None:
    model = build_unet(ModelConfig(depth=2, filters=8, norm="batch"), channels=4, num_classes=1)
    bn = model.get_layer("down0_norm1")
    assert bn.axis in (-1, 4) and tuple(bn.gamma.shape) == (8,)
    gn = build_unet(ModelConfig(depth=2, filters=8, norm="group", groups=4), channels=4, num_classes=1).get_layer(
        "down0_norm1"
    )
    assert gn.axis in (-1, 4) and gn.groups == 4 and tuple(gn.gamma.shape) == (8,)
    # instance norm: each channel normalised on its own over space
    inst = build_unet(ModelConfig(depth=2, filters=8, norm="instance"), channels=4, num_classes=1).get_layer(
        "down0_norm1"
    )
    x = tf.random.normal((2, 8, 8, 8, 8), mean=3.0, stddev=5.0)
    out = inst(x, training=True).numpy()
    np.testing.assert_allclose(out.mean(axis=(1, 2, 3)), 0, atol=1e-3)
    np.testing.assert_allclose(out.std(axis=(1, 2, 3)), 1, atol=1e-2)


def test_group_norm_with_8_filters_builds_and_bad_groups_fail() -> None:
    build_unet(
        ModelConfig.model_construct(depth=3, filters=8, kernel_size=3, norm="group", groups=8, dropout=0.0),
        channels=4,
        num_classes=1,
    )
    with pytest.raises(ValueError, match="groups to divide filters"):
        build_unet(
            ModelConfig.model_construct(depth=2, filters=8, kernel_size=3, norm="group", groups=3, dropout=0.0),
            channels=4,
            num_classes=1,
        )


def test_optimisers_and_loss_registry() -> None:
    opt = build_optimizer(OptimizerConfig(name="adam", lr=0.01, beta_2=0.99, amsgrad=True))
    assert opt.amsgrad and abs(float(opt.beta_2) - 0.99) < 1e-9
    assert type(build_optimizer(OptimizerConfig(name="sgd"))).__name__ == "SGD"
    assert type(build_optimizer(OptimizerConfig(name="adamw", weight_decay=1e-4))).__name__ == "AdamW"
    assert get_loss("dice") is dice_loss
    with pytest.raises(ValueError, match="Could not interpret loss identifier"):
        get_loss("focal")
