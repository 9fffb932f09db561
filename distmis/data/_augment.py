"""nnU-Net's augmentations of a training patch, as TensorFlow graph ops inside tf.data.

Why graph ops and not Python: a transform written in Python would run under the GIL, in the same
function that reads the patch, and several trials on one node would queue behind each other.
These run in tf.data's own thread pool, in parallel, with stateless random numbers drawn from the
element's seed, so a run with a seed is reproducible and each worker's stream is its own (its seed
is its own).

What nnU-Net v2's default trainer applies, with its probabilities (``nnUNetTrainer``'s transforms;
the ranges are the keys of :class:`distmis.config.AugmentConfig`):

* spatial: rotation (p 0.2 per axis), scaling 0.7-1.4 (p 0.2), on the image by trilinear and on the
  label by nearest-neighbour interpolation, on the same sampling grid; outside the patch the image
  is 0 and the label background;
* intensity: Gaussian noise (p 0.1), Gaussian blur (p 0.2), multiplicative brightness (p 0.15),
  contrast (p 0.15), low-resolution simulation (p 0.25), gamma, inverted (p 0.1) and plain (p 0.3).

Mirroring stays where it was (:func:`distmis.data.augment`). nnU-Net samples a patch larger than the
network's before rotating, so no corner is empty; here the patch itself is transformed, and what
comes from outside it is zero. Elastic deformation is off in nnU-Net's default, and is not here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf

#: nnU-Net's probabilities (nnUNetTrainer.get_training_transforms)
P_ROTATION, P_SCALE = 0.2, 0.2
P_NOISE, P_BLUR, P_BRIGHTNESS, P_CONTRAST, P_LOWRES, P_GAMMA_INVERTED, P_GAMMA = 0.1, 0.2, 0.15, 0.15, 0.25, 0.1, 0.3


def _grid(shape: tf.Tensor) -> tf.Tensor:
    """Every voxel's coordinates of a volume of ``shape`` (3,), as float32 [X*Y*Z, 3]."""
    import tensorflow as tf

    axes = [tf.range(shape[i], dtype=tf.float32) for i in range(3)]
    mesh = tf.meshgrid(*axes, indexing="ij")
    return tf.reshape(tf.stack(mesh, axis=-1), [-1, 3])


def _trilinear(volume: tf.Tensor, coords: tf.Tensor) -> tf.Tensor:
    """``volume`` [X, Y, Z, C] sampled at ``coords`` [N, 3] by trilinear interpolation; 0 outside."""
    import tensorflow as tf

    size = tf.shape(volume)[:3]
    base = tf.floor(coords)
    frac = coords - base
    base = tf.cast(base, tf.int32)
    out = tf.zeros([tf.shape(coords)[0], tf.shape(volume)[3]], volume.dtype)
    for corner in range(8):
        offset = tf.constant([(corner >> 2) & 1, (corner >> 1) & 1, corner & 1], tf.int32)
        index = base + offset
        inside = tf.reduce_all((index >= 0) & (index < size), axis=-1)
        weight = tf.reduce_prod(tf.where(offset > 0, frac, 1.0 - frac), axis=-1) * tf.cast(inside, frac.dtype)
        values = tf.gather_nd(volume, tf.clip_by_value(index, 0, size - 1))
        out += values * tf.cast(weight, volume.dtype)[:, tf.newaxis]
    return out


def _nearest(volume: tf.Tensor, coords: tf.Tensor) -> tf.Tensor:
    """``volume`` [X, Y, Z] sampled at ``coords`` [N, 3] by its nearest voxel; 0 (background) outside."""
    import tensorflow as tf

    size = tf.shape(volume)[:3]
    index = tf.cast(tf.round(coords), tf.int32)
    inside = tf.reduce_all((index >= 0) & (index < size), axis=-1)
    values = tf.gather_nd(volume, tf.clip_by_value(index, 0, size - 1))
    return tf.where(inside, values, tf.zeros_like(values))


def _rotation(angles: tf.Tensor) -> tf.Tensor:
    """The 3x3 rotation by ``angles`` (radians) about the first, second and third axis in turn."""
    import tensorflow as tf

    c, s = tf.cos(angles), tf.sin(angles)
    one, zero = tf.ones([]), tf.zeros([])
    rx = tf.stack([[one, zero, zero], [zero, c[0], -s[0]], [zero, s[0], c[0]]])
    ry = tf.stack([[c[1], zero, s[1]], [zero, one, zero], [-s[1], zero, c[1]]])
    rz = tf.stack([[c[2], -s[2], zero], [s[2], c[2], zero], [zero, zero, one]])
    return rz @ ry @ rx


def spatial(
    image: tf.Tensor,
    label: tf.Tensor,
    seed: tf.Tensor,
    *,
    rotation_degrees: float,
    scale: tuple[float, float],
    in_plane_only: bool = False,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Rotate and scale ``image`` [X, Y, Z, C] and ``label`` [X, Y, Z] about the patch's centre, each
    with nnU-Net's probability; image and label are resampled on one grid (trilinear / nearest).

    ``in_plane_only``: rotate about the last axis only (anisotropic data: its through-plane axis is
    the last), as nnU-Net's "dummy 2D" augmentation does.
    """
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, num=4)
    limit = math.radians(rotation_degrees)
    draw = tf.random.stateless_uniform([3], seeds[0]) < P_ROTATION
    if in_plane_only:
        draw = draw & tf.constant([False, False, True])
    angles = tf.where(draw, tf.random.stateless_uniform([3], seeds[1], -limit, limit), 0.0)
    scaled = tf.random.stateless_uniform([], seeds[2]) < P_SCALE
    factor = tf.where(scaled, tf.random.stateless_uniform([], seeds[3], scale[0], scale[1]), 1.0)
    moved = tf.reduce_any(tf.not_equal(angles, 0.0)) | tf.not_equal(factor, 1.0)

    def transformed() -> tuple[tf.Tensor, tf.Tensor]:
        shape = tf.shape(label)
        centre = (tf.cast(shape, tf.float32) - 1.0) / 2.0
        grid = _grid(shape)
        # output voxel -> where it comes from: rotated back, and a zoom by ``factor`` samples 1/factor apart
        source = tf.linalg.matvec(tf.transpose(_rotation(angles)), grid - centre) / factor + centre
        moved_image = tf.reshape(_trilinear(image, source), tf.shape(image))
        moved_label = tf.reshape(_nearest(label, source), shape)
        return moved_image, moved_label

    return tf.cond(moved, transformed, lambda: (image, label))


def _gaussian_kernel(sigma: tf.Tensor, radius: int) -> tf.Tensor:
    import tensorflow as tf

    x = tf.range(-radius, radius + 1, dtype=tf.float32)
    k = tf.exp(-0.5 * tf.square(x / sigma))
    return k / tf.reduce_sum(k)


def _blur(image: tf.Tensor, sigma: tf.Tensor) -> tf.Tensor:
    """Each channel blurred by a separable Gaussian of ``sigma`` voxels (edges padded by reflection)."""
    import tensorflow as tf

    radius = 3
    kernel = _gaussian_kernel(sigma, radius)
    volume = tf.transpose(image, [3, 0, 1, 2])[..., tf.newaxis]  # channels as a batch: [C, X, Y, Z, 1]
    for axis in range(3):
        shape = [1, 1, 1, 1, 1]
        shape[axis] = 2 * radius + 1
        pad = [[0, 0], [0, 0], [0, 0], [0, 0], [0, 0]]
        pad[axis + 1] = [radius, radius]
        volume = tf.pad(volume, pad, mode="REFLECT")
        volume = tf.nn.conv3d(volume, tf.reshape(kernel, shape), strides=[1, 1, 1, 1, 1], padding="VALID")
    return tf.transpose(volume[..., 0], [1, 2, 3, 0])


def _low_resolution(image: tf.Tensor, zoom: tf.Tensor) -> tf.Tensor:
    """The image as a scanner of coarser resolution would see it: sampled every 1/zoom voxels
    (nearest), then brought back to the grid by trilinear interpolation."""
    import tensorflow as tf

    shape = tf.shape(image)[:3]
    coarse_shape = tf.maximum(1, tf.cast(tf.round(tf.cast(shape, tf.float32) * zoom), tf.int32))
    step = tf.cast(shape, tf.float32) / tf.cast(coarse_shape, tf.float32)
    coarse_grid = _grid(coarse_shape)
    coarse = tf.gather_nd(image, tf.cast(tf.floor(coarse_grid * step), tf.int32))
    coarse = tf.reshape(coarse, tf.concat([coarse_shape, tf.shape(image)[3:]], 0))
    fine = (_grid(shape) + 0.5) / step - 0.5
    return tf.reshape(
        _trilinear(coarse, tf.clip_by_value(fine, 0.0, tf.cast(coarse_shape, tf.float32) - 1.0)), tf.shape(image)
    )


def _gamma(image: tf.Tensor, gamma: tf.Tensor, *, invert: bool) -> tf.Tensor:
    """Per channel: rescaled to [0, 1], raised to ``gamma``, rescaled back; mean and standard
    deviation kept (nnU-Net's ``retain_stats``). ``invert``: the same on the negated image."""
    import tensorflow as tf

    x = -image if invert else image
    axes = [0, 1, 2]
    mean, std = tf.reduce_mean(x, axes), tf.math.reduce_std(x, axes)
    low, high = tf.reduce_min(x, axes), tf.reduce_max(x, axes)
    span = tf.maximum(high - low, 1e-7)
    y = tf.pow((x - low) / span, gamma) * span + low
    y = (y - tf.reduce_mean(y, axes)) / tf.maximum(tf.math.reduce_std(y, axes), 1e-7) * std + mean
    return -y if invert else y


def intensity(image: tf.Tensor, seed: tf.Tensor, *, strength: float = 1.0) -> tf.Tensor:
    """nnU-Net's intensity transforms of ``image`` [X, Y, Z, C], each with its probability; ``strength``
    scales every range about "no change" (0: none, 1: nnU-Net's)."""
    import tensorflow as tf

    if strength <= 0:
        return image
    s = tf.random.experimental.stateless_split(seed, num=14)

    def chance(i: int, p: float) -> tf.Tensor:
        return tf.random.stateless_uniform([], s[i]) < p

    def around_one(i: int, low: float, high: float) -> tf.Tensor:
        return tf.random.stateless_uniform([], s[i], 1 + (low - 1) * strength, 1 + (high - 1) * strength)

    variance = tf.random.stateless_uniform([], s[1], 0.0, 0.1 * strength)
    noise = tf.random.stateless_normal(tf.shape(image), s[2], stddev=tf.sqrt(variance))
    image = tf.cond(chance(0, P_NOISE), lambda: image + noise, lambda: image)
    sigma = tf.random.stateless_uniform([], s[4], 0.5, 0.5 + 0.5 * strength)
    image = tf.cond(chance(3, P_BLUR), lambda: _blur(image, sigma), lambda: image)
    image = tf.cond(chance(5, P_BRIGHTNESS), lambda: image * around_one(6, 0.75, 1.25), lambda: image)

    def contrast() -> tf.Tensor:
        axes = [0, 1, 2]
        mean, low, high = tf.reduce_mean(image, axes), tf.reduce_min(image, axes), tf.reduce_max(image, axes)
        return tf.clip_by_value((image - mean) * around_one(8, 0.75, 1.25) + mean, low, high)

    image = tf.cond(chance(7, P_CONTRAST), contrast, lambda: image)
    zoom = tf.random.stateless_uniform([], s[10], 1.0 - 0.5 * strength, 1.0)
    image = tf.cond(chance(9, P_LOWRES), lambda: _low_resolution(image, zoom), lambda: image)
    gamma = around_one(12, 0.7, 1.5)
    image = tf.cond(chance(11, P_GAMMA_INVERTED), lambda: _gamma(image, gamma, invert=True), lambda: image)
    return tf.cond(chance(13, P_GAMMA), lambda: _gamma(image, gamma, invert=False), lambda: image)


__all__ = ["intensity", "spatial"]
