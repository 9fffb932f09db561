"""nnU-Net's augmentations as graph ops: image and label moved on one grid, reproducible by seed."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from distmis.data import (
    INTENSITY_CHANCES,
    augment_intensity,
    augment_intensity_parameters,
    augment_spatial,
    augment_spatial_parameters,
)

DRAWS = 3000


def _within_chance(hits: int, p: float, n: int = DRAWS) -> bool:
    """Whether ``hits`` of ``n`` draws is what a chance of ``p`` gives (5 standard deviations)."""
    return abs(hits / n - p) <= 5 * np.sqrt(p * (1 - p) / n)


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


def test_spatial_draws_have_nnunets_chances_and_ranges() -> None:
    """Rotation p 0.2 per patch (all three axes at once, each within the limit), scaling p 0.2 (one
    factor within the range); and anisotropic data rotates about its through-plane axis only."""
    draw = tf.function(augment_spatial_parameters)
    angles, factors = [], []
    for i in range(DRAWS):
        a, f = draw(tf.constant([i, 11]), rotation_degrees=30.0, scale=(0.7, 1.4))
        angles.append(a.numpy())
        factors.append(float(f))
    angles_a, factors_a = np.array(angles), np.array(factors)
    rotated = np.any(angles_a != 0, axis=1)
    assert _within_chance(int(rotated.sum()), 0.2)
    assert np.all(angles_a[rotated] != 0)  # every axis turns when the patch does
    assert np.abs(angles_a).max() <= np.radians(30) + 1e-6 and np.abs(angles_a).max() > np.radians(25)
    scaled = factors_a != 1.0
    assert _within_chance(int(scaled.sum()), 0.2)
    assert factors_a[scaled].min() >= 0.7 and factors_a[scaled].max() <= 1.4
    assert factors_a[scaled].min() < 0.75 and factors_a[scaled].max() > 1.35
    assert not np.corrcoef(rotated, scaled)[0, 1] > 0.1  # drawn independently
    for i in range(200):
        a, _ = draw(tf.constant([i, 5]), rotation_degrees=180.0, scale=(1.0, 1.0), plane_axis=2)
        assert a.numpy()[0] == 0 and a.numpy()[1] == 0


def test_intensity_draws_have_nnunets_chances_and_ranges() -> None:
    draw = tf.function(augment_intensity_parameters)
    hits = dict.fromkeys(INTENSITY_CHANCES, 0)
    values: dict[str, list[float]] = {}
    for i in range(DRAWS):
        p = draw(tf.constant([i, 13]), strength=1.0)
        for name in INTENSITY_CHANCES:
            hits[name] += bool(p[name])
        for name in ("noise_variance", "blur_sigma", "brightness_factor", "contrast_factor", "zoom", "gamma_value"):
            values.setdefault(name, []).append(float(p[name]))
    for name, chance in INTENSITY_CHANCES.items():
        assert _within_chance(hits[name], chance), (name, hits[name] / DRAWS, chance)
    ranges = {
        "noise_variance": (0.0, 0.1),
        "blur_sigma": (0.5, 1.0),
        "brightness_factor": (0.75, 1.25),
        "contrast_factor": (0.75, 1.25),
        "zoom": (0.5, 1.0),
        "gamma_value": (0.7, 1.5),
    }
    for name, (low, high) in ranges.items():
        seen = np.array(values[name])
        span = high - low
        assert seen.min() >= low and seen.max() <= high, name
        assert seen.min() < low + 0.02 * span and seen.max() > high - 0.02 * span, name  # the whole range is used
    half = draw(tf.constant([1, 13]), strength=0.5)
    assert 0.875 <= float(half["brightness_factor"]) <= 1.125  # strength scales the range about "no change"


def test_a_seed_gives_the_same_patch_and_another_seed_another() -> None:
    image, label = _volume()
    image = image + tf.random.stateless_normal(tf.shape(image), [4, 2])

    def both(seed: tf.Tensor) -> tuple[np.ndarray, np.ndarray]:
        x, y = augment_spatial(image, label, seed, rotation_degrees=30.0, scale=(0.7, 1.4))
        return augment_intensity(x, seed + 3, strength=1.0).numpy(), y.numpy()

    changed = 0
    for i in range(30):
        first, again = both(tf.constant([i, 9])), both(tf.constant([i, 9]))
        assert np.array_equal(first[0], again[0]) and np.array_equal(first[1], again[1])
        changed += not np.array_equal(first[0], both(tf.constant([i, 10]))[0])
    assert changed >= 20, changed


def test_in_plane_rotation_keeps_each_slice_in_its_plane() -> None:
    """Rotated about the last axis only, a label whose slices differ keeps them apart: no slice of
    one value takes voxels of another (what a through-plane rotation of thick slices would do)."""
    label = np.zeros((16, 16, 6), np.uint8)
    label[3:13, 3:13, :3] = 1
    label[3:13, 3:13, 3:] = 2
    image = tf.constant(label[..., None].astype(np.float32) * 10)
    for i in range(60):
        _, moved = augment_spatial(
            image, tf.constant(label), tf.constant([i, 3]), rotation_degrees=180.0, scale=(1.0, 1.0), plane_axis=2
        )
        moved_np = moved.numpy()
        assert set(np.unique(moved_np[..., :3])) <= {0, 1} and set(np.unique(moved_np[..., 3:])) <= {0, 2}


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


def test_a_dataset_of_thick_slices_is_rotated_in_plane(tmp_path) -> None:
    """The prepared record names the through-plane axis of data whose slices are more than 3 times
    thicker than their pixels (nnU-Net's threshold); near-isotropic data has none."""
    import nibabel as nib

    from distmis.config import PrepareConfig
    from distmis.data import load_manifest, prepare_dataset, write_synthetic_msd

    found = {}
    for name, zooms in {"thick": (1.0, 1.0, 5.0), "isotropic": (1.0, 1.0, 1.2)}.items():
        raw = write_synthetic_msd(tmp_path / name, cases=6, shape=(12, 12, 12), modalities=1, test_cases=0)
        for path in sorted(raw.glob("*Tr/*.nii.gz")):
            img = nib.load(path)
            nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj), np.diag([*zooms, 1.0])), path)
        prepared = prepare_dataset(raw, tmp_path / f"{name}-prep", PrepareConfig(shape=(12, 12, 12), seed=0))
        info = load_manifest(tmp_path / f"{name}-prep").info
        found[name] = info.through_plane_axis
        assert prepared.through_plane_axis == found[name]
        # the fingerprint's warning says what is done for thick slices, not to resample them
        warned = [w for w in (info.fingerprint or {}).get("warnings", []) if w.startswith("anisotropic spacing")]
        assert (name, len(warned)) in {("thick", 1), ("isotropic", 0)}
        assert all("rotates only within the slices" in w and "consider resampling" not in w for w in warned)
    assert found == {"thick": 2, "isotropic": None}


def _moved_draws(count: int, **options: object) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """The first ``count`` drawn transforms that rotate or scale (seeds [i, 21])."""
    found = []
    for i in range(400):
        angles, factor = augment_spatial_parameters(tf.constant([i, 21]), **options)
        if np.any(angles.numpy() != 0) or float(factor) != 1.0:
            found.append((angles, factor))
        if len(found) == count:
            return found
    raise AssertionError(f"fewer than {count} moving draws in 400 seeds")


def test_a_moved_patch_is_sampled_from_the_data_around_it_so_no_corner_is_empty() -> None:
    """As nnU-Net does, a rotated or zoomed-out patch takes its corners from the box read around it
    (``augment_context_size``), not from zeros beyond the patch; unmoved, the box gives the patch exactly."""
    from distmis.data import augment_context_size, augment_from_context

    options = {"rotation_degrees": 30.0, "scale": (0.7, 1.4)}
    size = (12, 10, 8)
    box = augment_context_size(size, **options)
    assert all(
        b >= s * np.sqrt(2) for b, s in zip(box, size, strict=True)
    )  # a 30-degree turn zoomed out to 0.7 needs more
    rng = np.random.default_rng(3)
    volume = rng.uniform(1.0, 2.0, (*box, 1)).astype(np.float32)  # data everywhere: no zero is the data's
    label = np.ones(box, np.uint8)
    corner = [(b - s) // 2 for b, s in zip(box, size, strict=True)]
    patch = volume[corner[0] : corner[0] + size[0], corner[1] : corner[1] + size[1], corner[2] : corner[2] + size[2]]
    centre = tf.constant([c + (s - 1) / 2 for c, s in zip(corner, size, strict=True)], tf.float32)

    same, _ = augment_from_context(volume, label, tf.zeros([3]), tf.constant(1.0), centre, size)
    assert np.array_equal(same.numpy(), patch)
    emptied = 0
    for angles, factor in _moved_draws(12, **options):
        image, moved_label = augment_from_context(volume, label, angles, factor, centre, size)
        assert image.shape == (*size, 1) and (image.numpy() > 0.999).all(), "a corner came from outside the box"
        assert (moved_label.numpy() == 1).all()
        alone, _ = augment_from_context(
            patch,
            label[: size[0], : size[1], : size[2]],
            angles,
            factor,
            tf.constant([(s - 1) / 2 for s in size], tf.float32),
            size,
        )
        emptied += bool((alone.numpy() == 0).any())
    assert emptied >= 6, emptied  # the patch alone would have had empty corners


def test_the_box_around_a_training_patch_holds_the_patch_the_sampler_chose(prepared16) -> None:
    """The loader's read with context is the same patch, at the centre it reports, moved inside the case
    at its edges (the foreground it was centred on stays the patch's centre)."""
    from distmis.data import PatchSampler, load_manifest

    manifest = load_manifest(prepared16)
    size = (8, 8, 8)
    sampler = PatchSampler(manifest, manifest.cases("train"), size, oversampling=0.5)
    wanted = (20, 40, 14)
    box_shape = sampler.context_shape(wanted)
    assert box_shape == tuple(min(w, s) for w, s in zip(wanted, manifest.info.shape, strict=True))
    for seed in range(12):
        image, label = sampler(seed % len(manifest.cases("train")), seed)
        box_image, box_label, centre = sampler.with_context(seed % len(manifest.cases("train")), seed, wanted)
        assert box_image.shape[:3] == box_shape and box_label.shape == box_shape
        start = (centre - (np.asarray(size) - 1) / 2).round().astype(int)
        assert np.all(start >= 0) and np.all(start + size <= box_shape)
        crop = tuple(slice(int(a), int(a) + n) for a, n in zip(start, size, strict=True))
        assert np.array_equal(box_image[crop], image) and np.array_equal(box_label[crop], label)
