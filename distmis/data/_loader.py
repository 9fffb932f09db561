"""``tf.data`` pipelines over a prepared directory, reading each patch from its case on demand.

Elements are ``(image, label, weight)``: image ``(X, Y, Z, C)`` float32, label ``(X, Y, Z, K)``
float32 (K = 1 for binary, one-hot otherwise) and a per-example weight. Weights let
validation pad every worker's shard to the same number of batches with zero-weight
examples, so that multi-worker evaluation neither hangs on uneven shards nor counts a case
twice.

Training shuffles case indices and draws a patch position per element; only the patch is read
(:class:`~distmis.data._cases.CaseReader`), so a worker's memory is bounded by the patches in
flight, whatever the number of cases, and the first batch needs one patch per element, not a
pass over the data. Sharding across workers is explicit (``num_shards``/``shard_index``,
normally taken from a ``tf.distribute.InputContext``) and applied to case indices, so that every
worker trains on a disjoint subset of the training cases.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmis.data._cases import CaseReader, check_locations
from distmis.data._record import Manifest, load_manifest
from distmis.exceptions import DataError, TrainingError

if TYPE_CHECKING:
    import tensorflow as tf


# case files whose checksum was verified in this process: (path, size, mtime, ctime) -> ok; the
# ctime too, which no user tool can set back: a file damaged in place with its mtime restored is hashed again
_VERIFIED: set[tuple[str, int, int, int]] = set()
STAMPS = "verified-cases.json"


def _stamp_file() -> Path:
    """Where verified checksums are remembered across processes (the default data cache, by the
    same rule as the data itself): every trial actor of a search would otherwise hash the whole
    dataset again."""
    from distmis.config import DataConfig

    return DataConfig().resolved_cache_dir() / STAMPS


@contextlib.contextmanager
def pipeline_errors() -> Iterator[None]:
    """distmis's own errors raised while tf.data reads a case, as themselves.

    A read runs inside ``tf.numpy_function``: TensorFlow wraps whatever it raises in an ``OpError``
    whose message holds the whole Python traceback. The user is owed the one line distmis wrote.
    """
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        found = re.search(r"(DataError|TrainingError): (.+?)(?:\n|$)", exc.message or "")
        if found is None:
            raise
        raise (DataError if found.group(1) == "DataError" else TrainingError)(found.group(2)) from None


def _read_stamps() -> dict[str, list[Any]]:
    import json

    from distmis.links import read_regular_text

    try:  # a FIFO or link planted there is not read: the cases are hashed again instead
        data = json.loads(read_regular_text(_stamp_file()))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def verify_cases(manifest: Manifest, split: str) -> None:
    """Check the size and sha256 recorded in ``info.json`` of every file of ``split``'s cases, once
    per file version.

    A damaged or replaced case is named here, before training, instead of surfacing as a
    decompression error in the middle of an epoch (or not at all). A file whose size and
    modification and change times match an earlier successful check (this process, or any process using the
    same data cache) is not hashed again.

    Raises:
        DataError: naming the file, the expected and the found checksum.
    """
    from distmis.data._cases import sha256_of

    stamps: dict[str, list[Any]] | None = None
    files = manifest.case_files()
    reader = CaseReader(manifest.root, files)
    for case in manifest.cases(split):
        reader.check_layout(case, manifest.info.shape, manifest.info.channels)
        for kind in ("image", "label", "foreground"):
            entry = getattr(files[case], kind)
            path = manifest.root / entry.file
            st = path.stat()
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if key in _VERIFIED:
                continue
            if st.st_size != entry.bytes:
                raise DataError(
                    f"{path}: {st.st_size} bytes, info.json records {entry.bytes}: the case file is damaged "
                    "or was replaced; prepare the dataset again"
                )
            stamps = _read_stamps() if stamps is None else stamps
            if stamps.get(key[0]) == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, entry.sha256]:
                _VERIFIED.add(key)
                continue
            digest = sha256_of(path)
            if digest != entry.sha256:
                raise DataError(
                    f"{path}: sha256 {digest[:16]}..., info.json records {entry.sha256[:16]}...: "
                    "the case file is damaged or was replaced; prepare the dataset again"
                )
            if kind == "foreground":  # a coordinate outside the volume would crash a worker mid-epoch
                declared = {1} if manifest.info.label_mode == "binary" else set(manifest.info.label_names) - {0}
                check_locations(reader.foreground(case), manifest.info.shape, path, labels=declared)
            _VERIFIED.add(key)
            stamps[key[0]] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, entry.sha256]
            _remember(stamps)


def _remember(stamps: dict[str, list[Any]]) -> None:
    import contextlib
    import json

    from distmis.files import write_text_atomic

    with contextlib.suppress(OSError):  # a read-only cache only costs a re-check later
        write_text_atomic(_stamp_file(), json.dumps(stamps))


def _label_channels(manifest: Manifest) -> Callable[[tf.Tensor], tf.Tensor]:
    """label values (X, Y, Z) uint8 -> the model's label channels (X, Y, Z, K) float32."""
    import tensorflow as tf

    from distmis.labels import class_values

    k, mode, regions = manifest.info.num_classes, manifest.info.label_mode, manifest.info.regions
    values = class_values(manifest.info.label_names, k)
    # label value -> class: prepared labels keep the dataset's own numbering (0, 1, 2, 4)
    classes = None if values == list(range(k)) else np.zeros(256, np.int32)
    if classes is not None:
        classes[values] = np.arange(k, dtype=np.int32)

    def channels(label: tf.Tensor) -> tf.Tensor:
        if mode == "regions":
            from distmis.labels import tf_regions_from_labels

            return tf_regions_from_labels(label, regions or {})
        if k == 1:
            return tf.cast(label > 0, tf.float32)[..., tf.newaxis]
        index = tf.cast(label, tf.int32)
        if classes is not None:
            index = tf.gather(tf.constant(classes), index)
        return tf.one_hot(index, k, dtype=tf.float32)

    return channels


def _channel_values(manifest: Manifest) -> list[list[int]]:
    """For each foreground label channel, the label values it is made of (what oversampling centres on)."""
    k = manifest.info.num_classes
    if manifest.info.label_mode == "regions":
        return [list(v) for v in (manifest.info.regions or {}).values()]
    if manifest.info.label_mode == "multiclass":
        from distmis.labels import class_values

        return [[v] for v in class_values(manifest.info.label_names, k)[1:]]
    return [[v for v in manifest.info.label_names if v > 0] or [1]]


class PatchSampler:
    """Where each training patch comes from: a uniform position, or (with probability
    ``oversampling``) one centred on a sampled voxel of a random foreground channel present in the
    case, as nnU-Net oversamples: a rare class is drawn as often as a common one. Seeded per
    element, so the same seeds give the same patches, in any thread order."""

    def __init__(
        self, manifest: Manifest, cases: list[str], patch: tuple[int, int, int] | None, oversampling: float
    ) -> None:
        self.reader = CaseReader(manifest.root, manifest.case_files())
        self.cases, self.shape = cases, manifest.info.shape
        self.size = tuple(patch) if patch is not None else manifest.info.shape
        self.oversampling = oversampling
        self.channel_values = _channel_values(manifest)

    def __call__(self, index: Any, seed: Any) -> tuple[np.ndarray, np.ndarray]:
        case, start = self._place(index, seed)
        return self.reader.read(case, tuple(start), self.size)  # type: ignore[arg-type]

    def context_shape(self, context: tuple[int, int, int]) -> tuple[int, int, int]:
        """The box :meth:`with_context` reads for a wanted ``context``: no larger than the case."""
        return tuple(min(c, s) for c, s in zip(context, self.shape, strict=True))  # type: ignore[return-value]

    def with_context(self, index: Any, seed: Any, context: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The same patch as ``self(index, seed)``, read with the box of shape ``context`` around it
        (moved inside the case where it would cross an edge: beyond an edge there is no data), and
        the patch's centre in the box's voxels, for a transform that samples beyond the patch."""
        case, start = self._place(index, seed)
        box: np.ndarray = np.asarray(self.context_shape(tuple(int(c) for c in context)))  # type: ignore[arg-type]
        size, shape = np.asarray(self.size), np.asarray(self.shape)
        box_start = np.clip(start + size // 2 - box // 2, 0, shape - box)
        image, label = self.reader.read(case, tuple(box_start), tuple(box))  # type: ignore[arg-type]
        centre = (start - box_start + (size - 1) / 2.0).astype(np.float32)
        return image, label, centre

    def _place(self, index: Any, seed: Any) -> tuple[str, np.ndarray]:
        """The case and patch position of one element (its seed decides both)."""
        case = self.cases[int(index)]
        rng = np.random.default_rng(int(seed))
        limit = np.asarray(self.shape) - np.asarray(self.size)
        start = None
        if self.size != self.shape and self.oversampling > 0 and rng.random() < self.oversampling:
            start = self._foreground_start(case, rng, limit)
        if start is None:
            start = rng.integers(0, limit + 1)
        return case, np.asarray(start)

    def _foreground_start(self, case: str, rng: np.random.Generator, limit: np.ndarray) -> np.ndarray | None:
        locations = self.reader.foreground(case)
        check_locations(locations, self.shape, self.reader.root / self.reader.files[case].foreground.file)
        present = [vals for vals in self.channel_values if any(v in locations for v in vals)]
        if not present:
            return None  # no foreground in this case: a uniform patch
        values = present[rng.integers(len(present))]
        voxels = np.concatenate([locations[v] for v in values if v in locations])
        centre = voxels[rng.integers(len(voxels))]
        return np.clip(centre - np.asarray(self.size) // 2, 0, limit)


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
    validation_patches: int = 0,
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
        foreground_oversampling: share of training patches centred on foreground (see
            :class:`PatchSampler`); the others are placed uniformly.
        validation_patches: evaluation only: instead of whole volumes, this many ``patch``-sized
            crops of each case, the same every epoch (seeded by ``seed``), a third centred on
            foreground: nnU-Net's pseudo-Dice, for volumes whose sliding window costs more than
            the epoch's training.

    Patches are read by Python (``tf.numpy_function``). A script may end with an iterator still
    alive: the iterators are released at exit, before the interpreter finalises
    (:func:`distmis.tensorflow_env.release_data_iterators`), so no read is left waiting for a GIL
    it can never take again.
    """
    import tensorflow as tf

    manifest = prepared if isinstance(prepared, Manifest) else load_manifest(prepared)
    cases = manifest.cases(split)
    if not cases:
        raise DataError(f"{manifest.root}: split {split!r} has no cases")
    if training and len(cases) < num_shards:
        raise DataError(f"split {split!r} has {len(cases)} cases, fewer than the {num_shards} workers reading it")
    verify_cases(manifest, split)
    _prepare_readers()
    # With a thread budget, work in flight is bounded by it too: AUTOTUNE ramps parallel calls
    # (and prefetch) far past one thread's pace, and dropping such an iterator - every trial
    # does - waits for all of that queued work
    parallel = threads or tf.data.AUTOTUNE
    local = cases[shard_index::num_shards]  # disjoint shares that together cover the split
    if training:
        ds = _training_pipeline(
            manifest, local, batch_size, patch, augment_config, seed, shard_index, parallel, foreground_oversampling
        )
    elif validation_patches and patch is not None and tuple(patch) != tuple(manifest.info.shape):
        ds = _patch_evaluation_pipeline(
            manifest, cases, local, patch, validation_patches, seed, batch_size, pad_to_batches, parallel
        )
    else:
        ds = _evaluation_pipeline(manifest, local, cases[0], batch_size, pad_to_batches, parallel)
    ds = ds.prefetch(2 if threads else tf.data.AUTOTUNE)
    if threads:
        # no private thread pool: its threads come on top of the trial's inter-op pool, and an
        # iterator over a private pool of 1-2 threads was seen to hang when it was destroyed
        options = tf.data.Options()
        options.threading.max_intra_op_parallelism = 1
        ds = ds.with_options(options)
    return ds


def _training_pipeline(
    manifest: Manifest,
    local: list[str],
    batch_size: int,
    patch: tuple[int, int, int] | None,
    augment_config: Any,
    seed: int,
    shard_index: int,
    parallel: int,
    foreground_oversampling: float,
) -> tf.data.Dataset:
    """Shuffled case indices x per-element seeds -> a patch read from its case, augmented, batched."""
    import tensorflow as tf

    to_channels = _label_channels(manifest)
    sampler = PatchSampler(manifest, local, patch, foreground_oversampling)
    indices = tf.data.Dataset.range(len(local)).shuffle(len(local), seed=seed, reshuffle_each_iteration=True)
    # one independent seed per element: reproducible and parallel-safe
    seeds = tf.data.Dataset.random(seed=seed + 7919 * (shard_index + 1)).batch(2)
    augmented = _augment_map(augment_config)
    patch_of = _patch_reader(sampler, manifest.info.channels, augment_config, manifest.info.through_plane_axis)

    def read(index: tf.Tensor, s: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        s = tf.cast(s % (2**31 - 1), tf.int32)
        image, label = patch_of(index, s)  # rotated and scaled on label values: nearest
        return (*augmented(image, to_channels(label), s), tf.constant(1.0))

    ds = tf.data.Dataset.zip(indices.repeat(), seeds).map(read, num_parallel_calls=parallel)
    return ds.batch(batch_size, drop_remainder=True)


def _evaluation_pipeline(
    manifest: Manifest, local: list[str], filler: str, batch_size: int, pad_to_batches: int | None, parallel: int
) -> tf.data.Dataset:
    """This worker's whole cases in order (one volume in memory per element in flight), padded to
    ``pad_to_batches`` with zero-weight copies of ``filler`` - a case of the whole split, because
    with more workers than cases a worker's own share can be empty."""
    import tensorflow as tf

    to_channels = _label_channels(manifest)
    reader = CaseReader(manifest.root, manifest.case_files())
    x, y, z = manifest.info.shape

    def whole(case: tf.Tensor, weight: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        image, label = tf.numpy_function(
            lambda c: reader.read(c.decode()), [case], (tf.float32, tf.uint8), stateful=False
        )
        image = tf.ensure_shape(image, [x, y, z, manifest.info.channels])
        return image, to_channels(tf.ensure_shape(label, [x, y, z])), weight

    names = [(c, 1.0) for c in local]
    if pad_to_batches is not None:
        names += [(filler, 0.0)] * max(0, pad_to_batches * batch_size - len(names))
        names = names[: pad_to_batches * batch_size]
    listed = tf.data.Dataset.from_tensor_slices(
        (tf.constant([n for n, _ in names], tf.string), tf.constant([w for _, w in names], tf.float32))
    )
    ds = listed.map(whole, num_parallel_calls=parallel, deterministic=True)
    return ds.batch(batch_size, drop_remainder=pad_to_batches is not None)


#: the share of validation patches centred on foreground (nnU-Net's oversampling)
VALIDATION_OVERSAMPLING = 1 / 3


def _patch_evaluation_pipeline(
    manifest: Manifest,
    cases: list[str],
    local: list[str],
    patch: tuple[int, int, int],
    per_case: int,
    seed: int,
    batch_size: int,
    pad_to_batches: int | None,
    parallel: int,
) -> tf.data.Dataset:
    """``per_case`` fixed patches of each of this worker's cases (padding: zero-weight patches of the
    split's first case). A patch's seed depends on its case and number only, so every epoch and every
    worker layout scores the same patches."""
    import tensorflow as tf

    to_channels = _label_channels(manifest)
    sampler = PatchSampler(manifest, cases, patch, VALIDATION_OVERSAMPLING)
    size = sampler.size
    items = [
        (cases.index(c), seed * 1_000_003 + cases.index(c) * 1009 + k, 1.0) for c in local for k in range(per_case)
    ]
    if pad_to_batches is not None:
        items += [(0, seed, 0.0)] * max(0, pad_to_batches * batch_size - len(items))
        items = items[: pad_to_batches * batch_size]

    def read(index: tf.Tensor, s: tf.Tensor, weight: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        image, label = tf.numpy_function(sampler, [index, s], (tf.float32, tf.uint8), stateful=False)
        image = tf.ensure_shape(image, [*size, manifest.info.channels])
        return image, to_channels(tf.ensure_shape(label, list(size))), weight

    listed = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant([i for i, _, _ in items], tf.int64),
            tf.constant([s % (2**31 - 1) for _, s, _ in items], tf.int64),
            tf.constant([w for _, _, w in items], tf.float32),
        )
    )
    ds = listed.map(read, num_parallel_calls=parallel, deterministic=True)
    return ds.batch(batch_size, drop_remainder=pad_to_batches is not None)


def _prepare_readers() -> None:
    """Blosc2 decompresses with every core by default; here the parallelism is tf.data's, within the
    trial's CPUs. And a script that ends with an iterator alive must end, not hang: the iterators
    are released at exit, before Blosc2's own exit hook (registered when it was imported) runs."""
    import blosc2

    from distmis.tensorflow_env import release_data_iterators_at_exit

    blosc2.set_nthreads(1)
    release_data_iterators_at_exit()


def _augment_map(augment_config: Any) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """(patch, label patch, element seed) -> the augmented pair (the element's seed + 1, as always)."""

    def apply(image: tf.Tensor, label: tf.Tensor, s: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        if augment_config is None:
            return image, label
        a = augment_config
        image, label = augment(image, label, s + 1, flip=a.flip, intensity=a.intensity, noise=a.noise)
        if getattr(a, "nnunet_intensity", 0) > 0:
            from distmis.data._augment import intensity

            image = intensity(image, s + 3, strength=a.nnunet_intensity)
        return image, label

    return apply


def _patch_reader(
    sampler: PatchSampler, channels: int, augment_config: Any, plane_axis: int | None
) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """(case index, element seed) -> the training patch and its label values, rotated and scaled as
    ``train.augment`` says (nnU-Net's). A patch drawn to move is sampled from the larger box around
    it (:func:`~distmis.data._augment.context_size`), so its corners hold the case's data, as
    nnU-Net's do; the other two thirds are read at the patch's size. Anisotropic data (``plane_axis``,
    its through-plane axis) is rotated and scaled in-plane only."""
    import tensorflow as tf

    size = tuple(int(n) for n in sampler.size)

    def plain(index: tf.Tensor, s: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        image, label = tf.numpy_function(sampler, [index, s[0]], (tf.float32, tf.uint8), stateful=False)
        return tf.ensure_shape(image, [*size, channels]), tf.ensure_shape(label, list(size))

    a = augment_config
    if a is None or (getattr(a, "rotation", 0) <= 0 and tuple(getattr(a, "scale", (1.0, 1.0))) == (1.0, 1.0)):
        return plain
    from distmis.data._augment import context_size, is_moved, resample_from_context, spatial_parameters

    options = {"rotation_degrees": a.rotation, "scale": tuple(a.scale), "plane_axis": plane_axis}
    box = sampler.context_shape(context_size(size, **options))  # type: ignore[arg-type]

    def with_context(index: tf.Tensor, s: tf.Tensor, angles: tf.Tensor, factor: tf.Tensor) -> tuple[tf.Tensor, ...]:
        image, label, centre = tf.numpy_function(
            sampler.with_context, [index, s[0], box], (tf.float32, tf.uint8, tf.float32), stateful=False
        )
        image, label = tf.ensure_shape(image, [*box, channels]), tf.ensure_shape(label, list(box))
        centre = tf.ensure_shape(centre, [3])
        return resample_from_context(image, label, angles, factor, centre, size, plane_axis=plane_axis)  # type: ignore[arg-type]

    def read(index: tf.Tensor, s: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        angles, factor = spatial_parameters(s + 2, **options)  # type: ignore[arg-type]
        return tf.cond(  # type: ignore[no-any-return]
            is_moved(angles, factor), lambda: with_context(index, s, angles, factor), lambda: plain(index, s)
        )

    return read


def eval_batches(n_cases: int, num_workers: int, batch_size_per_worker: int) -> int:
    """Batches every worker must run so that all of its share of ``n_cases`` is seen."""
    return max(1, math.ceil(math.ceil(n_cases / num_workers) / batch_size_per_worker))
