"""nnU-Net's augmentations as graph ops: image and label moved on one grid, reproducible by seed."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from distmis.data import augment_intensity, augment_spatial


def _volume() -> tuple[tf.Tensor, tf.Tensor]:
    """A label of three nested boxes, and an image whose first channel is 10 x the label."""
    label = np.zeros((20, 18, 16), np.uint8)
    label[4:16, 3:15, 3:13] = 1
    label[7:13, 6:12, 5:11] = 2
    image = np.stack([label * 10.0, np.full(label.shape, 3.0)], axis=-1).astype(np.float32)
    return tf.constant(image), tf.constant(label)


def _moving_seed(image: tf.Tensor, label: tf.Tensor, **options: object) -> tf.Tensor:
    for i in range(200):
        seed = tf.constant([i, 7])
        moved, _ = augment_spatial(image, label, seed, **options)
        if not np.array_equal(moved.numpy(), image.numpy()):
            return seed
    raise AssertionError("no seed in 200 rotated or scaled the patch")


def test_rotation_and_scaling_move_image_and_label_together() -> None:
    image, label = _volume()
    options = {"rotation_degrees": 180.0, "scale": (0.7, 1.4)}
    seed = _moving_seed(image, label, **options)
    moved_image, moved_label = augment_spatial(image, label, seed, **options)
    again = augment_spatial(image, label, seed, **options)
    assert np.array_equal(moved_image.numpy(), again[0].numpy())  # a seed gives one transform
    assert moved_image.shape == image.shape and moved_label.shape == label.shape
    assert moved_label.dtype == label.dtype and set(np.unique(moved_label.numpy())) <= {0, 1, 2}
    # the image's first channel is 10 x the label wherever trilinear interpolation stays inside a
    # region: the two agree on nearly every voxel, so they were resampled on the same grid
    agree = np.abs(moved_image.numpy()[..., 0] / 10.0 - moved_label.numpy()) < 0.5
    assert agree.mean() > 0.95, agree.mean()
    assert (moved_label.numpy() == 2).sum() > 0  # the inner box is still there


def test_no_rotation_and_no_scaling_leave_the_patch_as_it_is() -> None:
    image, label = _volume()
    for i in range(20):
        moved_image, moved_label = augment_spatial(
            image, label, tf.constant([i, 1]), rotation_degrees=0.0, scale=(1.0, 1.0)
        )
        assert np.array_equal(moved_image.numpy(), image.numpy())
        assert np.array_equal(moved_label.numpy(), label.numpy())


def test_intensity_transforms_keep_shape_and_finiteness_and_are_off_at_strength_0() -> None:
    image, _ = _volume()
    image = image + tf.random.stateless_normal(tf.shape(image), [1, 2])
    assert np.array_equal(augment_intensity(image, tf.constant([0, 0]), strength=0.0).numpy(), image.numpy())
    changed = 0
    for i in range(40):
        out = augment_intensity(image, tf.constant([i, 3]), strength=1.0).numpy()
        assert out.shape == tuple(image.shape) and np.isfinite(out).all()
        changed += not np.array_equal(out, image.numpy())
    # nnU-Net's probabilities: about 1 - 0.9*0.8*0.85*0.85*0.75*0.9*0.7 = 0.76 of patches are changed
    assert 15 <= changed <= 40, changed


def test_the_training_pipeline_applies_them_when_the_config_asks(prepared16) -> None:
    import pytest

    from distmis.config import AugmentConfig
    from distmis.data import make_dataset

    config = AugmentConfig(rotation=30.0, scale=(0.8, 1.2), nnunet_intensity=1.0)
    ds = make_dataset(prepared16, "train", batch_size=2, patch=(8, 8, 8), training=True, augment_config=config)
    image, label, weight = next(iter(ds))
    assert image.shape[1:4] == (8, 8, 8) and label.shape[1:4] == (8, 8, 8)
    assert np.isfinite(image.numpy()).all() and set(np.unique(label.numpy())) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="low <= high"):
        AugmentConfig(scale=(1.4, 0.7))
