"""nnU-Net's augmentations of a training patch, as TensorFlow ops inside tf.data.

Why TensorFlow ops and not Python: a transform written in Python would run under the GIL, in the
same function that reads the patch, and several trials on one node would queue behind each other.
These run in tf.data's own thread pool, in parallel, with stateless random numbers drawn from the
element's seed, so a run with a seed is reproducible and each worker's stream is its own (its seed
is its own).

Why the heavy ones are compiled with XLA (``jit_compile``): as plain graph ops, resampling a
128^3 x 4 patch through eight ``gather_nd`` calls materialises every intermediate and took 1.3 s on
one core; XLA fuses it into one loop, 0.08 s, with the same numbers (``benchmarks/augmentation.py``).
Only what has static shapes is compiled (the low-resolution simulation's coarse grid depends on
its random zoom, so it stays a graph of separable gathers); random numbers are drawn outside.

What nnU-Net v2's default trainer applies, with its probabilities (``nnUNetTrainer``'s transforms;
the ranges are the keys of :class:`distmis.config.AugmentConfig`):

* spatial: rotation (p 0.2 per patch, about all three axes at once, or about the through-plane axis
  only for anisotropic data, nnU-Net's "dummy 2D"), scaling 0.7-1.4 (p 0.2), on the image by
  trilinear and on the label by nearest-neighbour interpolation, on the same sampling grid;
  outside the patch the image is 0 and the label background (nnU-Net marks it "ignore");
* intensity: Gaussian noise (p 0.1), Gaussian blur (p 0.2), multiplicative brightness (p 0.15),
  contrast (p 0.15), low-resolution simulation (p 0.25), gamma, inverted (p 0.1) and plain (p 0.3).

Mirroring stays where it was (:func:`distmis.data.augment`). As nnU-Net does, a patch that is drawn
to be rotated or scaled is sampled from a larger box around it (:func:`context_size`), so none of
its corners is empty where the case has data; nnU-Net reads that box for every patch, the loader
reads it only for the patches it moves (about a third). Elastic deformation is off in nnU-Net's
default, and is not here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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


def spatial_parameters(
    seed: tf.Tensor, *, rotation_degrees: float, scale: tuple[float, float], plane_axis: int | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """The rotation angles [3] (radians, about each axis) and the zoom factor of one patch, drawn as
    nnU-Net draws them: rotation with p 0.2 per patch, each axis's angle uniform in
    +-``rotation_degrees``; scaling with p 0.2, one factor for all axes. ``plane_axis``: rotate about
    that axis only (the through-plane axis of anisotropic data)."""
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, num=4)
    limit = math.radians(rotation_degrees)
    rotated = tf.random.stateless_uniform([], seeds[0]) < P_ROTATION
    angles = tf.random.stateless_uniform([3], seeds[1], -limit, limit)
    if plane_axis is not None:
        angles = angles * tf.one_hot(plane_axis, 3)
    angles = tf.where(rotated, angles, tf.zeros([3]))
    scaled = tf.random.stateless_uniform([], seeds[2]) < P_SCALE
    factor = tf.where(scaled, tf.random.stateless_uniform([], seeds[3], scale[0], scale[1]), 1.0)
    return angles, factor


@functools.cache
def _compiled(name: str) -> Callable[..., Any]:
    """The XLA-compiled form of a kernel below, built on first use (importing this module does not
    import TensorFlow), once per process; XLA compiles it again for each new patch shape."""
    import tensorflow as tf

    kernels: dict[str, Callable[..., Any]] = {"resample": _resample, "blur": _blur, "gamma": _gamma}
    return tf.function(kernels[name], jit_compile=True, autograph=False)  # type: ignore[no-any-return]


def _resample(
    image: tf.Tensor, label: tf.Tensor, angles: tf.Tensor, zoom: tf.Tensor, centre: tf.Tensor, size: tuple[int, ...]
) -> tuple[tf.Tensor, tf.Tensor]:
    """A patch of ``size`` sampled from ``image`` [X, Y, Z, C] and ``label`` [X, Y, Z] (the patch, or a
    box read around it), rotated by ``angles`` and zoomed by ``zoom`` [3] about ``centre`` (the
    patch's centre in the box's voxels), on one sampling grid (trilinear / nearest); 0 outside."""
    import tensorflow as tf

    out_centre = (tf.constant(size, tf.float32) - 1.0) / 2.0
    # output voxel -> where it comes from: rotated back, and a zoom by ``zoom`` samples 1/zoom apart
    source = tf.linalg.matvec(tf.transpose(_rotation(angles)), _grid(tf.constant(size)) - out_centre) / zoom + centre
    channels = tf.shape(image)[3:]
    moved_image = tf.reshape(_trilinear(image, source), tf.concat([tf.constant(size), channels], 0))
    moved_label = tf.reshape(_nearest(label, source), size)
    return moved_image, moved_label


def _zoom(factor: tf.Tensor, plane_axis: int | None) -> tf.Tensor:
    """The per-axis zoom of a drawn ``factor``: in-plane only for anisotropic data (nnU-Net scales
    its "dummy 2D" slices, never across them)."""
    import tensorflow as tf

    zoom = tf.fill([3], factor)
    return zoom if plane_axis is None else tf.where(tf.one_hot(plane_axis, 3) > 0, 1.0, zoom)


def context_size(
    patch: tuple[int, int, int], *, rotation_degrees: float, scale: tuple[float, float], plane_axis: int | None = None
) -> tuple[int, int, int]:
    """The box to read around a patch that is rotated or scaled, so that every voxel it samples lies in
    the box: the largest extent of the patch under any rotation within the limits (about all three
    axes, or about ``plane_axis`` only), over the smallest zoom, plus a voxel each side for interpolation.

    nnU-Net's ``get_patch_size`` does this job with the corner vector rotated by the largest angle
    about one axis at a time and a fixed smallest zoom of 0.85; here the extent is the bounding box of
    the rotated patch over a grid of angles (all three turn at once here) and the configured zoom, so a
    patch zoomed out to 0.7 has no empty border either.
    """
    import numpy as np

    half = np.asarray(patch, float) / 2.0
    limit = math.radians(min(rotation_degrees, 180.0))
    steps = np.linspace(-limit, limit, 13) if limit > 0 else np.zeros(1)
    turns = [steps if plane_axis is None or axis == plane_axis else np.zeros(1) for axis in range(3)]
    extent = half.copy()
    for ax in turns[0]:
        for ay in turns[1]:
            for az in turns[2]:
                c, s = np.cos([ax, ay, az]), np.sin([ax, ay, az])
                rx = np.array([[1, 0, 0], [0, c[0], -s[0]], [0, s[0], c[0]]])
                ry = np.array([[c[1], 0, s[1]], [0, 1, 0], [-s[1], 0, c[1]]])
                rz = np.array([[c[2], -s[2], 0], [s[2], c[2], 0], [0, 0, 1]])
                extent = np.maximum(extent, np.abs((rz @ ry @ rx).T) @ half)  # output -> source
    zoom = np.full(3, min(1.0, scale[0]))
    if plane_axis is not None:
        zoom[plane_axis] = 1.0
    box = 2.0 * extent / zoom + 2.0  # trilinear reads the voxel on each side
    return tuple(int(math.ceil(b - 1e-6)) for b in box)  # type: ignore[return-value]


def resample_from_context(
    image: tf.Tensor,
    label: tf.Tensor,
    angles: tf.Tensor,
    factor: tf.Tensor,
    centre: tf.Tensor,
    size: tuple[int, int, int],
    *,
    plane_axis: int | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """The patch of ``size`` centred at ``centre`` [3] (voxels of the box ``image``/``label`` read around
    it, :func:`context_size`), rotated by ``angles`` and zoomed by ``factor`` (drawn by
    :func:`spatial_parameters`)."""
    import tensorflow as tf

    zoom = _zoom(factor, plane_axis)
    resample = _compiled("resample")
    return resample(image, label, angles, zoom, tf.cast(centre, tf.float32), tuple(size))  # type: ignore[no-any-return]


def spatial(
    image: tf.Tensor,
    label: tf.Tensor,
    seed: tf.Tensor,
    *,
    rotation_degrees: float,
    scale: tuple[float, float],
    plane_axis: int | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Rotate and scale ``image`` [X, Y, Z, C] and ``label`` [X, Y, Z] about the patch's centre, with
    nnU-Net's probabilities (:func:`spatial_parameters`); image and label are resampled on one grid
    (trilinear / nearest), and what comes from outside the patch is 0. A patch drawn neither rotated
    nor scaled is returned as it is. (The loader reads a larger box for a moved patch instead:
    :func:`context_size`, :func:`resample_from_context`.)

    ``plane_axis``: rotate about this axis only (the through-plane axis of anisotropic data), as
    nnU-Net's "dummy 2D" augmentation does, and scaled in-plane only.
    """
    import tensorflow as tf

    angles, factor = spatial_parameters(seed, rotation_degrees=rotation_degrees, scale=scale, plane_axis=plane_axis)
    size = tuple(int(n) for n in label.shape)
    centre = (tf.constant(size, tf.float32) - 1.0) / 2.0

    def move() -> tuple[tf.Tensor, tf.Tensor]:
        return resample_from_context(image, label, angles, factor, centre, size, plane_axis=plane_axis)  # type: ignore[arg-type]

    return tf.cond(is_moved(angles, factor), move, lambda: (image, label))


def is_moved(angles: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """Whether the drawn transform changes the patch at all (most patches are neither rotated nor scaled)."""
    import tensorflow as tf

    return tf.reduce_any(tf.not_equal(angles, 0.0)) | tf.not_equal(factor, 1.0)


def _gaussian_kernel(sigma: tf.Tensor, radius: int) -> tf.Tensor:
    import tensorflow as tf

    x = tf.range(-radius, radius + 1, dtype=tf.float32)
    k = tf.exp(-0.5 * tf.square(x / sigma))
    return k / tf.reduce_sum(k)


def _blur(image: tf.Tensor, sigma: tf.Tensor) -> tf.Tensor:
    """Each channel blurred by a separable Gaussian of ``sigma`` voxels (edges padded by reflection),
    as weighted sums of shifted views: XLA fuses them, where it runs ``conv3d`` 40 times slower."""
    import tensorflow as tf

    radius = 3
    kernel = _gaussian_kernel(sigma, radius)
    volume = image
    for axis in range(3):
        pad = [[0, 0], [0, 0], [0, 0], [0, 0]]
        pad[axis] = [radius, radius]
        padded = tf.pad(volume, pad, mode="REFLECT")
        size = volume.shape[axis]
        total = tf.zeros_like(volume)
        for tap in range(2 * radius + 1):
            window = [slice(None)] * 4
            window[axis] = slice(tap, tap + size)
            total += padded[tuple(window)] * kernel[tap]
        volume = total
    return volume


def _low_resolution(image: tf.Tensor, zoom: tf.Tensor) -> tf.Tensor:
    """The image as a scanner of coarser resolution would see it: sampled every 1/zoom voxels
    (nearest), then brought back to the grid by (separable) linear interpolation."""
    import tensorflow as tf

    shape = tf.shape(image)[:3]
    coarse_shape = tf.maximum(1, tf.cast(tf.round(tf.cast(shape, tf.float32) * zoom), tf.int32))
    step = tf.cast(shape, tf.float32) / tf.cast(coarse_shape, tf.float32)
    volume = image
    for axis in range(3):
        nearest = tf.cast(tf.floor(tf.cast(tf.range(coarse_shape[axis]), tf.float32) * step[axis]), tf.int32)
        volume = tf.gather(volume, nearest, axis=axis)
    for axis in range(3):
        last = tf.cast(coarse_shape[axis] - 1, tf.float32)
        position = tf.clip_by_value((tf.cast(tf.range(shape[axis]), tf.float32) + 0.5) / step[axis] - 0.5, 0.0, last)
        low = tf.cast(tf.floor(position), tf.int32)
        high = tf.minimum(low + 1, coarse_shape[axis] - 1)
        broadcast = [1, 1, 1, 1]
        broadcast[axis] = -1
        weight = tf.reshape(position - tf.cast(low, tf.float32), broadcast)
        volume = tf.gather(volume, low, axis=axis) * (1 - weight) + tf.gather(volume, high, axis=axis) * weight
    return volume


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


#: each intensity transform's chance, by the name :func:`intensity_parameters` gives its draw
INTENSITY_CHANCES = {
    "noise": P_NOISE,
    "blur": P_BLUR,
    "brightness": P_BRIGHTNESS,
    "contrast": P_CONTRAST,
    "low_resolution": P_LOWRES,
    "gamma_inverted": P_GAMMA_INVERTED,
    "gamma": P_GAMMA,
}


def intensity_parameters(seed: tf.Tensor, *, strength: float = 1.0) -> dict[str, tf.Tensor]:
    """One patch's draws for :func:`intensity`: for each name of :data:`INTENSITY_CHANCES`, whether it
    applies (a boolean), and the values it uses (``noise_variance``, ``blur_sigma``,
    ``brightness_factor``, ``contrast_factor``, ``zoom``, ``gamma_value``; ``noise_seed``).
    ``strength`` scales every range about "no change" (1: nnU-Net's)."""
    import tensorflow as tf

    s = tf.random.experimental.stateless_split(seed, num=14)

    def around_one(i: int, low: float, high: float) -> tf.Tensor:
        return tf.random.stateless_uniform([], s[i], 1 + (low - 1) * strength, 1 + (high - 1) * strength)

    draws = {
        name: tf.random.stateless_uniform([], s[2 * i]) < p for i, (name, p) in enumerate(INTENSITY_CHANCES.items())
    }
    return {
        **draws,
        "noise_variance": tf.random.stateless_uniform([], s[1], 0.0, 0.1 * strength),
        "noise_seed": s[13],
        "blur_sigma": tf.random.stateless_uniform([], s[3], 0.5, 0.5 + 0.5 * strength),
        "brightness_factor": around_one(5, 0.75, 1.25),
        "contrast_factor": around_one(7, 0.75, 1.25),
        "zoom": tf.random.stateless_uniform([], s[9], 1.0 - 0.5 * strength, 1.0),
        "gamma_value": around_one(11, 0.7, 1.5),
    }


def intensity(image: tf.Tensor, seed: tf.Tensor, *, strength: float = 1.0) -> tf.Tensor:
    """nnU-Net's intensity transforms of ``image`` [X, Y, Z, C], in its order, each with its chance
    (:func:`intensity_parameters`); ``strength`` 0 leaves the image as it is."""
    import tensorflow as tf

    if strength <= 0:
        return image
    p = intensity_parameters(seed, strength=strength)

    def noisy() -> tf.Tensor:  # drawn inside the branch: 8 M normals only for the patches that get noise
        return image + tf.random.stateless_normal(tf.shape(image), p["noise_seed"], stddev=tf.sqrt(p["noise_variance"]))

    image = tf.cond(p["noise"], noisy, lambda: image)
    image = tf.cond(p["blur"], lambda: _compiled("blur")(image, p["blur_sigma"]), lambda: image)
    image = tf.cond(p["brightness"], lambda: image * p["brightness_factor"], lambda: image)

    def contrast() -> tf.Tensor:
        axes = [0, 1, 2]
        mean, low, high = tf.reduce_mean(image, axes), tf.reduce_min(image, axes), tf.reduce_max(image, axes)
        return tf.clip_by_value((image - mean) * p["contrast_factor"] + mean, low, high)

    image = tf.cond(p["contrast"], contrast, lambda: image)
    image = tf.cond(p["low_resolution"], lambda: _low_resolution(image, p["zoom"]), lambda: image)
    gamma = _compiled("gamma")
    image = tf.cond(p["gamma_inverted"], lambda: gamma(image, p["gamma_value"], invert=True), lambda: image)
    return tf.cond(p["gamma"], lambda: gamma(image, p["gamma_value"], invert=False), lambda: image)


__all__ = ["INTENSITY_CHANCES", "intensity", "intensity_parameters", "spatial", "spatial_parameters"]
