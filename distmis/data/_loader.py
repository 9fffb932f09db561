"""``tf.data`` pipelines over a prepared directory (``info.json`` + TFRecord shards).

Elements are ``(image, label, weight)``: image ``(X, Y, Z, C)`` float32, label ``(X, Y, Z, K)``
float32 (K = 1 for binary, one-hot otherwise) and a per-example weight. Weights let
validation pad every worker's shard to the same number of batches with zero-weight
examples, so that multi-worker evaluation neither hangs on uneven shards nor counts a case
twice.

Sharding across workers is explicit (``num_shards``/``shard_index``, normally taken from a
``tf.distribute.InputContext``) and applied to records, before shuffling, so that in one
epoch every worker sees a disjoint subset of the training cases. The prototype switched
auto-sharding off and every replica read every case.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from distmis.data._prepare import FORMAT, MANIFEST
from distmis.exceptions import DataError

if TYPE_CHECKING:
    import tensorflow as tf

# Cache decoded volumes in memory when a worker's share is smaller than this.
_CACHE_LIMIT_BYTES = 2 << 30


@dataclass(frozen=True)
class Manifest:
    root: Path
    info: dict[str, Any]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.info["shape"])  # type: ignore[return-value]

    @property
    def channels(self) -> int:
        return int(self.info["channels"])

    @property
    def num_classes(self) -> int:
        return int(self.info["num_classes"])

    @property
    def label_mode(self) -> str:
        return str(self.info["label_mode"])

    @property
    def regions(self) -> dict[str, list[int]] | None:
        return self.info.get("regions") or None

    @property
    def labels(self) -> dict[int, str]:
        return {int(k): v for k, v in self.info["labels"].items()}

    def num_cases(self, split: str) -> int:
        return int(self.info["splits"].get(split, {}).get("num_cases", 0))

    def files(self, split: str) -> list[str]:
        return [str(self.root / s["file"]) for s in self.info["splits"].get(split, {}).get("shards", [])]

    def case_bytes(self) -> int:
        x, y, z = self.shape
        return x * y * z * (self.channels * 4 + 1)


class _Shard(BaseModel):
    model_config = ConfigDict(extra="allow")
    file: StrictStr = Field(pattern=r"^[^/\\]+$")  # a plain file name inside the prepared directory
    num_cases: int = Field(ge=0)
    sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class _Split(BaseModel):
    model_config = ConfigDict(extra="allow")
    cases: list[StrictStr]
    num_cases: int = Field(ge=0)
    shards: list[_Shard]


class _Source(BaseModel):
    model_config = ConfigDict(extra="allow")
    path: StrictStr


class _Info(BaseModel):
    """The structure of ``info.json`` (what the loader, evaluation and inference rely on)."""

    model_config = ConfigDict(extra="allow")
    format: StrictStr
    source: _Source
    shape: tuple[int, int, int]
    channels: int = Field(ge=1)
    modalities: list[StrictStr]
    labels: dict[str, StrictStr]
    label_mode: Literal["binary", "multiclass", "regions"]
    regions: dict[str, list[int]] | None = None
    num_classes: int = Field(ge=1)
    preprocessing: dict[str, Any]
    splits: dict[Literal["train", "val", "test"], _Split]


def load_manifest(root: str | Path) -> Manifest:
    """Read and check ``info.json`` of a prepared directory.

    Raises:
        DataError: when the directory or its manifest is missing, of another format or
            malformed (naming the field), or a shard it lists is missing.
    """
    from distmis.documents import read_json, validate_document

    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: missing; run `distmis prepare` first")
    info = read_json(path, error=DataError, what="a distmis info.json object")
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        found = info.get("format") if isinstance(info, dict) else type(info).__name__
        raise DataError(f"{path}: format {found!r}, expected {FORMAT!r} (written by distmis prepare)")
    checked = validate_document(_Info, info, path, error=DataError)
    if any(s <= 0 for s in checked.shape):
        raise DataError(f"{path}: shape: expected 3 positive integers, got {list(checked.shape)}")
    if checked.channels != len(checked.modalities):
        raise DataError(f"{path}: channels {checked.channels} but {len(checked.modalities)} modalities")
    for name, split in checked.splits.items():
        if split.num_cases != len(split.cases) or split.num_cases != sum(s.num_cases for s in split.shards):
            raise DataError(
                f"{path}: splits.{name}: num_cases {split.num_cases} does not match its cases "
                f"({len(split.cases)}) and shards ({sum(s.num_cases for s in split.shards)})"
            )
        for shard in split.shards:
            if not (root / shard.file).is_file():
                raise DataError(f"{root / shard.file}: listed in {path} but missing")
    return Manifest(root=root, info=info)


# shards whose checksum was verified in this process: (path, size, mtime) -> ok
_VERIFIED: set[tuple[str, int, int]] = set()
STAMPS = "verified-shards.json"


def _stamp_file() -> Path:
    """Where verified checksums are remembered across processes (the data cache directory):
    every trial actor of a search would otherwise hash the whole dataset again."""
    import os

    home = os.environ.get("DISTMIS_DATA_HOME")
    return (Path(home).expanduser() if home else Path("~/.cache/distmis").expanduser()) / STAMPS


def _read_stamps() -> dict[str, list[Any]]:
    import json

    try:
        data = json.loads(_stamp_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def verify_shards(manifest: Manifest, split: str) -> None:
    """Check the sha256 recorded in ``info.json`` of every shard of ``split``, once per file version.

    A damaged or replaced shard is named here, before training, instead of surfacing as a
    TensorFlow ``DataLossError`` in the middle of an epoch (or not at all). A shard whose
    size and modification time match an earlier successful check (this process, or any
    process using the same data cache) is not hashed again.

    Raises:
        DataError: naming the shard, the expected and the found checksum.
    """
    import hashlib

    stamps: dict[str, list[Any]] | None = None
    for shard in manifest.info["splits"].get(split, {}).get("shards", []):
        path = manifest.root / shard["file"]
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key in _VERIFIED:
            continue
        if st.st_size != shard["bytes"]:
            raise DataError(
                f"{path}: {st.st_size} bytes, info.json records {shard['bytes']}: the shard is damaged "
                "or was replaced; prepare the dataset again"
            )
        stamps = _read_stamps() if stamps is None else stamps
        if stamps.get(key[0]) == [st.st_size, st.st_mtime_ns, shard["sha256"]]:
            _VERIFIED.add(key)
            continue
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != shard["sha256"]:
            raise DataError(
                f"{path}: sha256 {h.hexdigest()[:16]}..., info.json records {shard['sha256'][:16]}...: "
                "the shard is damaged or was replaced; prepare the dataset again"
            )
        _VERIFIED.add(key)
        stamps[key[0]] = [st.st_size, st.st_mtime_ns, shard["sha256"]]
        _remember(stamps)


def _remember(stamps: dict[str, list[Any]]) -> None:
    import contextlib
    import json

    from distmis.files import write_text_atomic

    with contextlib.suppress(OSError):  # a read-only cache only costs a re-check later
        write_text_atomic(_stamp_file(), json.dumps(stamps))


def _parse_fn(manifest: Manifest):  # noqa: ANN202 - returns a tf.function-compatible callable
    import tensorflow as tf

    x, y, z = manifest.shape
    c, k = manifest.channels, manifest.num_classes
    mode, regions = manifest.label_mode, manifest.regions
    spec = {
        "case_id": tf.io.FixedLenFeature([], tf.string),
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.string),
    }

    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        ex = tf.io.parse_single_example(record, spec)
        image = tf.reshape(tf.io.decode_raw(ex["image"], tf.float32), [x, y, z, c])
        label = tf.reshape(tf.io.decode_raw(ex["label"], tf.uint8), [x, y, z])
        if mode == "regions":
            from distmis.labels import tf_regions_from_labels

            label = tf_regions_from_labels(label, regions or {})
        elif k == 1:
            label = tf.cast(label > 0, tf.float32)[..., tf.newaxis]
        else:
            label = tf.one_hot(tf.cast(label, tf.int32), k, dtype=tf.float32)
        return image, label

    return parse


def random_patch(
    image: tf.Tensor, label: tf.Tensor, patch: tuple[int, int, int], seed: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Crop the same random ``patch`` from image and label (stateless, so reproducible)."""
    import tensorflow as tf

    c = tf.shape(image)[-1]
    both = tf.concat([image, label], axis=-1)
    crop = tf.image.stateless_random_crop(both, size=[*patch, tf.shape(both)[-1]], seed=seed)
    return crop[..., :c], crop[..., c:]


def foreground_patch(
    image: tf.Tensor, label: tf.Tensor, patch: tuple[int, int, int], seed: tf.Tensor, classes: list[int]
) -> tuple[tf.Tensor, tf.Tensor]:
    """Crop ``patch`` centred (as far as the volume allows) on a random voxel of a random class.

    The class is drawn uniformly among the foreground ``classes`` (label channels) present in the
    case, then a voxel of it uniformly, as nnU-Net's oversampling does: a rare class is sampled as
    often as a common one. A case without foreground gets a uniformly placed crop.
    """
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, num=3)
    mask = tf.gather(label, classes, axis=-1) > 0.5  # (X, Y, Z, F)
    present = tf.reduce_any(mask, axis=[0, 1, 2])
    size = tf.constant(patch, tf.int64)

    def centred() -> tuple[tf.Tensor, tf.Tensor]:
        logits = tf.where(present, 0.0, -1e9)[tf.newaxis]
        cls = tf.random.stateless_categorical(logits, 1, seeds[0])[0, 0]
        voxels = tf.where(tf.gather(mask, cls, axis=-1))
        pick = tf.random.stateless_uniform([], seeds[1], 0, tf.shape(voxels, out_type=tf.int64)[0], dtype=tf.int64)
        shape = tf.shape(image, out_type=tf.int64)[:3]
        start = tf.clip_by_value(voxels[pick] - size // 2, 0, shape - size)
        begin = tf.concat([start, [0]], 0)
        return (
            tf.slice(image, begin, tf.concat([size, [-1]], 0)),
            tf.slice(label, begin, tf.concat([size, [-1]], 0)),
        )

    return tf.cond(tf.reduce_any(present), centred, lambda: random_patch(image, label, patch, seeds[2]))


def augment(
    image: tf.Tensor, label: tf.Tensor, seed: tf.Tensor, *, flip: bool, intensity: float, noise: float
) -> tuple[tf.Tensor, tf.Tensor]:
    """Flips (same for image and label), per-channel intensity scale/shift and noise (image only)."""
    import tensorflow as tf

    seeds = tf.random.experimental.stateless_split(seed, num=6)
    if flip:
        for axis in range(3):
            do = tf.random.stateless_uniform([], seeds[axis]) < 0.5
            image = tf.cond(do, lambda i=image, a=axis: tf.reverse(i, [a]), lambda i=image: i)
            label = tf.cond(do, lambda m=label, a=axis: tf.reverse(m, [a]), lambda m=label: m)
    channels = tf.shape(image)[-1]
    if intensity > 0:
        scale = tf.random.stateless_uniform([channels], seeds[3], 1 - intensity, 1 + intensity)
        shift = tf.random.stateless_uniform([channels], seeds[4], -intensity, intensity)
        image = image * scale + shift
    if noise > 0:
        image = image + tf.random.stateless_normal(tf.shape(image), seeds[5], stddev=noise)
    return image, label


def make_dataset(
    prepared: str | Path | Manifest,
    split: str,
    *,
    batch_size: int,
    training: bool,
    patch: tuple[int, int, int] | None = None,
    augment_config: Any = None,
    seed: int = 0,
    num_shards: int = 1,
    shard_index: int = 0,
    pad_to_batches: int | None = None,
    threads: int | None = None,
    foreground_oversampling: float = 0.0,
) -> tf.data.Dataset:
    """Build the input pipeline of one worker.

    Args:
        prepared: prepared directory (or its manifest).
        split: ``train``, ``val`` or ``test``.
        batch_size: this worker's batch size (per-replica batch x local replicas).
        training: shuffle, repeat forever, random patches, augmentation and drop incomplete
            batches; otherwise one ordered pass over whole volumes.
        patch: training crop size; ``None`` trains on whole volumes.
        augment_config: an ``AugmentConfig`` (or ``None`` for no augmentation).
        seed: controls shuffling, patches and augmentation.
        num_shards, shard_index: this worker's disjoint share of the records.
        pad_to_batches: for evaluation: pad with zero-weight examples to exactly this many
            batches (every worker must run the same number of steps).
        threads: cap on tf.data's own thread pool (by default it sizes itself to every core of
            the host, which steals CPUs from concurrent trials).
        foreground_oversampling: share of training patches centred on foreground
            (:func:`foreground_patch`); the others are placed uniformly.
    """
    import tensorflow as tf

    manifest = prepared if isinstance(prepared, Manifest) else load_manifest(prepared)
    n_cases = manifest.num_cases(split)
    if training and n_cases < num_shards:
        raise DataError(f"split {split!r} has {n_cases} cases, fewer than the {num_shards} workers reading it")
    # With a thread budget, work in flight is bounded by it too: AUTOTUNE ramps parallel calls
    # (and prefetch) far past one thread's pace, and dropping such an iterator - every trial
    # does - waits for all of that queued work (measured: 5-9 s with augmentation on 1 thread)
    parallel = threads or tf.data.AUTOTUNE
    ds, first_case = _records(manifest, split, num_shards, shard_index, parallel)
    if training:
        local_cases = max(1, math.ceil(n_cases / num_shards))
        ds = ds.shuffle(local_cases, seed=seed, reshuffle_each_iteration=True).repeat()
        # one independent stateless seed per element: reproducible and parallel-safe
        seeds = tf.data.Dataset.random(seed=seed + 7919 * (shard_index + 1)).batch(2)
        crop = _training_map(manifest, patch, augment_config, foreground_oversampling)
        ds = tf.data.Dataset.zip(ds, seeds).map(crop, num_parallel_calls=parallel)
        ds = ds.batch(batch_size, drop_remainder=True)
    else:
        ds = ds.map(lambda i, m: (i, m, tf.constant(1.0)))
        if pad_to_batches is not None:
            # zero-weight copies of a real case (so shapes and dtypes match); taken from the whole
            # split, because with more workers than cases a worker's own shard can be empty
            filler = first_case.map(_parse_fn(manifest)).map(lambda i, m: (i, m, tf.constant(0.0))).repeat()
            ds = ds.concatenate(filler).take(pad_to_batches * batch_size)
        ds = ds.batch(batch_size, drop_remainder=pad_to_batches is not None)
    ds = ds.prefetch(2 if threads else tf.data.AUTOTUNE)
    if threads:
        # no private thread pool: its threads come on top of the trial's inter-op pool, and an
        # iterator over a private pool of 1-2 threads was seen to hang when it was destroyed
        options = tf.data.Options()
        options.threading.max_intra_op_parallelism = 1
        ds = ds.with_options(options)
    return ds


def _records(
    manifest: Manifest, split: str, num_shards: int, shard_index: int, parallel: int
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """This worker's parsed (image, label) pairs of ``split`` (cached when small enough), and the
    split's first raw record (the padding template even for a worker with no case of its own)."""
    import tensorflow as tf

    files = manifest.files(split)
    if not files:
        raise DataError(f"{manifest.root}: split {split!r} has no cases")
    verify_shards(manifest, split)
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=min(len(files), tf.data.AUTOTUNE if len(files) > 1 else 1))
    selected = manifest.info["splits"][split].get("selected")
    if selected:  # a cross-validation fold: the listed cases of the shards, before sharding (even shares)
        ds = ds.filter(_case_filter(manifest.info["splits"][split]["cases"]))
    first_case = ds.take(1)
    # Sharding by record (not by file) works for any shard count, and records are read in a
    # deterministic order, so the shards are disjoint and together cover the split.
    ds = ds.shard(num_shards, shard_index)
    ds = ds.map(_parse_fn(manifest), num_parallel_calls=parallel, deterministic=True)
    if math.ceil(manifest.num_cases(split) / num_shards) * manifest.case_bytes() <= _CACHE_LIMIT_BYTES:
        ds = ds.cache()
    return ds, first_case


def _case_filter(cases: list[str]) -> Callable[[tf.Tensor], tf.Tensor]:
    """record -> whether its case id is one of ``cases``."""
    import tensorflow as tf

    wanted = tf.constant(sorted(cases))
    spec = {"case_id": tf.io.FixedLenFeature([], tf.string)}

    def keep(record: tf.Tensor) -> tf.Tensor:
        return tf.reduce_any(tf.equal(tf.io.parse_single_example(record, spec)["case_id"], wanted))

    return keep


def _training_map(
    manifest: Manifest, patch: tuple[int, int, int] | None, augment_config: Any, foreground_oversampling: float
) -> Callable[..., tuple[tf.Tensor, tf.Tensor, tf.Tensor]]:
    """(image, label), seed -> (patch, label patch, weight 1): a uniform or foreground-centred crop, then augmentation."""
    import tensorflow as tf

    # the label channels that are foreground: a softmax model's channel 0 is the background
    k = manifest.num_classes
    classes = list(range(1, k)) if manifest.label_mode == "multiclass" else list(range(k))
    crops = patch is not None and tuple(patch) != tuple(manifest.shape)

    def train_map(xy: tuple[tf.Tensor, tf.Tensor], s: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        image, label = xy
        s = tf.cast(s % (2**31 - 1), tf.int32)
        if crops:
            cube = (patch[0], patch[1], patch[2])  # type: ignore[index]
            if foreground_oversampling > 0:
                image, label = tf.cond(
                    tf.random.stateless_uniform([], s + 2) < foreground_oversampling,
                    lambda: foreground_patch(image, label, cube, s + 3, classes),
                    lambda: random_patch(image, label, cube, s),
                )
            else:
                image, label = random_patch(image, label, cube, s)
        if augment_config is not None:
            a = augment_config
            image, label = augment(image, label, s + 1, flip=a.flip, intensity=a.intensity, noise=a.noise)
        return image, label, tf.constant(1.0)

    return train_map


def eval_batches(n_cases: int, num_workers: int, batch_size_per_worker: int) -> int:
    """Batches every worker must run so that all of its share of ``n_cases`` is seen."""
    return max(1, math.ceil(math.ceil(n_cases / num_workers) / batch_size_per_worker))
