"""tf.data loading: alignment under augmentation, disjoint worker shards, evaluation padding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from distmis.config import AugmentConfig
from distmis.data import augment, eval_batches, foreground_patch, load_manifest, make_dataset, random_patch


def _case_ids(prepared: Path, split: str, num_shards: int, index: int) -> list[str]:
    """The case ids one worker reads in one pass (via the same sharding as training)."""
    manifest = load_manifest(prepared)
    ds = tf.data.TFRecordDataset(manifest.files(split)).shard(num_shards, index)
    spec = {"case_id": tf.io.FixedLenFeature([], tf.string)}
    return [tf.io.parse_single_example(r, spec)["case_id"].numpy().decode() for r in ds]


def test_two_workers_see_disjoint_halves(prepared16: Path) -> None:
    w0 = _case_ids(prepared16, "train", 2, 0)
    w1 = _case_ids(prepared16, "train", 2, 1)
    everything = load_manifest(prepared16).info["splits"]["train"]["cases"]
    assert not set(w0) & set(w1)
    assert sorted(w0 + w1) == sorted(everything)
    assert abs(len(w0) - len(w1)) <= 1


def test_training_batches_have_the_worker_share_only(prepared16: Path) -> None:
    manifest = load_manifest(prepared16)
    per_worker = manifest.num_cases("train") // 2
    seen = []
    for index in (0, 1):
        ds = make_dataset(prepared16, "train", batch_size=1, training=True, seed=0, num_shards=2, shard_index=index)
        # one epoch of this worker = its share of cases; identify cases by their voxels
        seen.append({x.numpy().tobytes() for x, _, _ in ds.take(per_worker)})
    assert len(seen[0]) == per_worker and len(seen[1]) == per_worker
    assert not seen[0] & seen[1]


def test_augmentation_keeps_image_and_label_aligned() -> None:
    rng = np.random.default_rng(0)
    label = (rng.uniform(size=(16, 16, 16, 1)) > 0.7).astype(np.float32)
    image = np.concatenate([label * 5.0, rng.normal(size=(16, 16, 16, 1)).astype(np.float32)], axis=-1)
    for s in range(12):
        seed = tf.constant([s, 7], tf.int32)
        img, lab = augment(tf.constant(image), tf.constant(label), seed, flip=True, intensity=0.0, noise=0.0)
        np.testing.assert_array_equal(img.numpy()[..., :1] / 5.0, lab.numpy())
        pi, pl = random_patch(tf.constant(image), tf.constant(label), (8, 8, 8), seed)
        assert pi.shape == (8, 8, 8, 2) and pl.shape == (8, 8, 8, 1)
        np.testing.assert_array_equal(pi.numpy()[..., :1] / 5.0, pl.numpy())
    # intensity/noise change the image but never the label
    img, lab = augment(
        tf.constant(image), tf.constant(label), tf.constant([1, 2]), flip=False, intensity=0.2, noise=0.1
    )
    np.testing.assert_array_equal(lab.numpy(), label)
    assert not np.allclose(img.numpy(), image)


def test_training_pipeline_shapes_and_patches(prepared16: Path) -> None:
    ds = make_dataset(
        prepared16,
        "train",
        batch_size=2,
        training=True,
        patch=(8, 8, 8),
        augment_config=AugmentConfig(noise=0.05),
        seed=1,
    )
    x, y, w = next(iter(ds))
    assert x.shape == (2, 8, 8, 8, 4) and y.shape == (2, 8, 8, 8, 1) and w.numpy().tolist() == [1.0, 1.0]
    assert set(np.unique(y.numpy())) <= {0.0, 1.0}


def test_evaluation_padding_counts_every_case_once(prepared16: Path) -> None:
    n = load_manifest(prepared16).num_cases("val")
    steps = eval_batches(n, num_workers=2, batch_size_per_worker=1)
    total = 0.0
    for index in (0, 1):
        ds = make_dataset(
            prepared16, "val", batch_size=1, training=False, num_shards=2, shard_index=index, pad_to_batches=steps
        )
        batches = list(ds)
        assert len(batches) == steps
        total += sum(float(tf.reduce_sum(w)) for _, _, w in batches)
    assert total == n


def test_evaluation_padding_with_more_workers_than_cases(prepared16: Path) -> None:
    """4 workers, 2 validation cases: two workers own no case and must still run every step
    (MultiWorkerMirroredStrategy's collectives need the same steps everywhere) on zero weights."""
    n = load_manifest(prepared16).num_cases("val")
    assert n == 2
    steps = eval_batches(n, num_workers=4, batch_size_per_worker=2)
    total = 0.0
    for index in range(4):
        batches = list(
            make_dataset(
                prepared16, "val", batch_size=2, training=False, num_shards=4, shard_index=index, pad_to_batches=steps
            )
        )
        assert len(batches) == steps and all(b[0].shape[0] == 2 for b in batches), index
        total += sum(float(tf.reduce_sum(w)) for _, _, w in batches)
    assert total == n


def test_foreground_patches_centre_on_every_class_alike() -> None:
    """One class is a large slab, the other a 2^3 block in a corner: each is the centre of about
    half the patches (classes drawn uniformly among those present), and every patch has foreground."""
    label = np.zeros((32, 32, 32), np.int32)
    label[:, :, 12:20] = 1
    label[28:30, 1:3, 28:30] = 2
    onehot = tf.one_hot(label, 3)
    image = tf.cast(onehot[..., 1:], tf.float32)
    hits = {1: 0, 2: 0}
    for s in range(60):
        pi, pl = foreground_patch(image, onehot, (8, 8, 8), tf.constant([s, 3], tf.int32), [1, 2])
        assert pl.shape == (8, 8, 8, 3)
        np.testing.assert_array_equal(pi.numpy(), pl.numpy()[..., 1:])  # image and label cropped alike
        present = pl.numpy()[..., 1:].sum(axis=(0, 1, 2)) > 0
        assert present.any()
        hits[1] += int(present[0])
        hits[2] += int(present[1])
    assert 15 <= hits[2] <= 45, hits  # the tiny class, ~1/2 of the patches; a uniform crop hits it ~1/100
    # no foreground at all: a uniform crop of the right shape
    pi, pl = foreground_patch(image * 0, onehot * 0, (8, 8, 8), tf.constant([1, 2], tf.int32), [1, 2])
    assert pi.shape == (8, 8, 8, 2) and float(tf.reduce_sum(pl)) == 0.0


def test_foreground_oversampling_in_the_training_pipeline(prepared16: Path) -> None:
    def share_with_foreground(p: float) -> float:
        ds = make_dataset(prepared16, "train", batch_size=1, training=True, patch=(4, 4, 4), foreground_oversampling=p)
        return float(np.mean([float(tf.reduce_max(lab)) > 0 for _, lab, _ in ds.take(48)]))

    assert share_with_foreground(1.0) == 1.0
    assert share_with_foreground(0.0) < 1.0  # uniform 4^3 crops of 16^3 volumes miss the tumour about 2 times in 3
