"""MSD directory -> sharded TFRecords + ``info.json`` manifest.

Cases are read and preprocessed in parallel worker processes (nibabel decompression and
resampling are CPU-bound); the parent process alone imports TensorFlow and writes the
shards, so workers stay light. Everything is written into a temporary sibling of OUT and
renamed at the end: a failure or Ctrl-C leaves no half-written OUT.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from distmis.data._msd import (
    MsdCase,
    check_case_headers,
    content_warnings,
    load_case_image,
    load_case_label,
    read_dataset_json,
)
from distmis.exceptions import DataError
from distmis.files import atomic_directory, check_output, check_replaceable, write_json_atomic
from distmis.tensorflow_env import import_tensorflow

MANIFEST = "info.json"
FORMAT = "distmis-prepared/1"
SPLITS = ("train", "val", "test")


# --------------------------------------------------------------------------- preprocessing (pure numpy)
def zscore_nonzero(image: np.ndarray) -> np.ndarray:
    """Per-channel z-score over the non-zero voxels (the brain); the background stays 0."""
    out = np.zeros_like(image, dtype=np.float32)
    for c in range(image.shape[-1]):
        ch = image[..., c]
        mask = ch != 0
        if mask.sum() < 2:
            continue
        vals = ch[mask]
        std = float(vals.std())
        out[..., c] = np.where(mask, (ch - vals.mean()) / (std if std > 0 else 1.0), 0.0)
    return out


def crop_or_pad(volume: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """Centre-crop or zero-pad the first three axes of ``volume`` to ``shape``."""
    out = volume
    for axis, target in enumerate(shape):
        size = out.shape[axis]
        if size > target:
            start = (size - target) // 2
            out = np.take(out, np.arange(start, start + target), axis=axis)
        elif size < target:
            before = (target - size) // 2
            pad = [(0, 0)] * out.ndim
            pad[axis] = (before, target - size - before)
            out = np.pad(out, pad)
    return out


def resample(volume: np.ndarray, shape: tuple[int, int, int], *, order: int) -> np.ndarray:
    """Resize the spatial axes to ``shape``: order 1 (trilinear) for images, 0 for labels."""
    from scipy.ndimage import zoom

    factors = [t / s for t, s in zip(shape, volume.shape[:3], strict=True)] + [1] * (volume.ndim - 3)
    out = zoom(volume, factors, order=order, mode="nearest", grid_mode=True)
    return crop_or_pad(out, shape)  # zoom may be off by one voxel through rounding


def preprocess_image(image: np.ndarray, shape: tuple[int, int, int], resize: str) -> np.ndarray:
    """The exact preprocessing applied to an image (also used at inference)."""
    image = zscore_nonzero(image)
    return resample(image, shape, order=1) if resize == "resample" else crop_or_pad(image, shape)


def preprocess_label(label: np.ndarray, shape: tuple[int, int, int], resize: str, label_mode: str) -> np.ndarray:
    label = resample(label, shape, order=0) if resize == "resample" else crop_or_pad(label, shape)
    if label_mode == "binary":  # multiclass and regions keep the label values (regions are made when read)
        label = (label > 0).astype(np.uint8)
    return label.astype(np.uint8)


# --------------------------------------------------------------------------- per-case worker
def _prepare_case(
    case: MsdCase,
    modalities: tuple[str, ...],
    labels: dict[int, str],
    shape: tuple[int, int, int],
    resize: str,
    label_mode: str,
) -> tuple[str, np.ndarray, np.ndarray, list[str], dict[str, Any]]:
    from distmis.data._inspect import case_stats

    image, affine, _ = load_case_image(case.image, len(modalities))
    assert case.label is not None
    label = load_case_label(case.label, image.shape[:3], labels)
    warnings = content_warnings(case.image, image, case.label, label, modalities)
    stats = case_stats(case.case_id, image, affine, label)  # the dataset fingerprint, from the same read
    return (
        case.case_id,
        preprocess_image(image, shape, resize),
        preprocess_label(label, shape, resize, label_mode),
        warnings,
        stats,
    )


def _check_regions(regions: dict[str, list[int]] | None, label_mode: str, labels: dict[int, str], where: Path) -> None:
    from distmis.labels import paint_order

    if label_mode == "regions" and not regions:
        raise DataError("--label-mode regions needs --regions (e.g. msd_task01, or WT=1,2,3;TC=2,3;ET=3)")
    for name, values in (regions or {}).items():
        undeclared = sorted(set(values) - set(labels))
        if undeclared:
            raise DataError(
                f"regions: {name} uses label values {undeclared}, which {where} does not declare "
                f"(it has {sorted(labels)})"
            )
    if label_mode == "regions":
        try:
            paint_order(regions or {})
        except ValueError as exc:
            raise DataError(f"regions: {exc}") from None


def _print_warning(text: str) -> None:
    import sys

    print(f"distmis: warning: {text}", file=sys.stderr, flush=True)


def split_cases(case_ids: list[str], fractions: tuple[float, float, float], seed: int) -> dict[str, list[str]]:
    """Deterministic train/val/test split: same ids, fractions and seed give the same split."""
    ids = sorted(case_ids)
    order = np.random.default_rng(seed).permutation(len(ids))
    n = len(ids)
    n_val = int(round(fractions[1] * n))
    n_test = int(round(fractions[2] * n))
    if fractions[1] > 0 and n_val == 0 and n >= 3:
        n_val = 1
    if fractions[2] > 0 and n_test == 0 and n >= 3:
        n_test = 1
    n_train = n - n_val - n_test
    if n_train < 1:
        raise DataError(f"split {list(fractions)} of {n} cases leaves no training case")
    shuffled = [ids[i] for i in order]
    return {
        "train": sorted(shuffled[:n_train]),
        "val": sorted(shuffled[n_train : n_train + n_val]),
        "test": sorted(shuffled[n_train + n_val :]),
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _serialize(case_id: str, image: np.ndarray, label: np.ndarray) -> bytes:
    import_tensorflow()
    import tensorflow as tf

    def _bytes(v: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    feature = {
        "case_id": _bytes(case_id.encode()),
        "image": _bytes(np.ascontiguousarray(image, dtype=np.float32).tobytes()),
        "label": _bytes(np.ascontiguousarray(label, dtype=np.uint8).tobytes()),
        "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(image.shape))),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def prepare_dataset(
    src: str | Path,
    out: str | Path,
    *,
    shape: tuple[int, int, int] = (32, 32, 32),
    resize: str = "crop_pad",
    label_mode: str = "binary",
    split: tuple[float, float, float] = (0.7, 0.15, 0.15),
    shards: int = 4,
    seed: int = 0,
    workers: int | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
    warn: Callable[[str], None] | None = None,
    regions: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    """Preprocess an MSD dataset into ``out`` and return its manifest.

    ``warn`` receives what is suspicious but not wrong (a constant channel, a label without
    foreground); by default it is printed to stderr as ``distmis: warning: ...``.

    Raises:
        DataError: bad ``dataset.json``, missing/corrupt/inconsistent files (a label not
            aligned with its image included), OUT not writable. Nothing is left at ``out``.
        OutputError: OUT is or lies inside the source, or exists and distmis did not write it
            (or ``overwrite`` was not given).
    """
    src, out = Path(src), Path(out)
    dataset = read_dataset_json(src)
    _check_regions(regions, label_mode, dataset.labels, src / "dataset.json")
    check_output(out, option="OUT", inputs={"source dataset": src})
    check_replaceable(out, option="OUT", overwrite=overwrite)
    for case in dataset.training:  # headers only: every misaligned case is found before any work
        check_case_headers(case, dataset.num_modalities)

    splits = split_cases([c.case_id for c in dataset.training], split, seed)
    by_id = {c.case_id: c for c in dataset.training}
    workers = workers or min(len(dataset.training), os.cpu_count() or 1)
    shape = tuple(int(s) for s in shape)  # type: ignore[assignment]
    num_classes = {"binary": 1, "regions": len(regions or {})}.get(label_mode, max(dataset.labels) + 1)

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "source": {"name": dataset.name, "description": dataset.description, "path": str(src.resolve())},
        "shape": list(shape),
        "channels": dataset.num_modalities,
        "modalities": list(dataset.modalities),
        "labels": {str(k): v for k, v in sorted(dataset.labels.items())},
        "label_mode": label_mode,
        "num_classes": num_classes,
        "regions": regions,
        "image_dtype": "float32",
        "label_dtype": "uint8",
        "preprocessing": {"normalisation": "zscore_nonzero_per_channel", "resize": resize, "shape": list(shape)},
        "split": {"fractions": list(split), "seed": seed},
        "splits": {},
    }
    total = len(dataset.training)
    done = 0
    case_stats: list[dict[str, Any]] = []
    try:
        with atomic_directory(out, command="prepare", overwrite=overwrite) as tmp:
            # spawn, not fork: the parent has TensorFlow's thread pools running, and forking those is unsafe
            with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                # submit every case first: workers start reading while TensorFlow is imported here
                futures = {
                    name: [
                        pool.submit(
                            _prepare_case, by_id[cid], dataset.modalities, dataset.labels, shape, resize, label_mode
                        )
                        for cid in splits[name]
                    ]
                    for name in SPLITS
                }
                try:
                    import_tensorflow()
                    import tensorflow as tf

                    for name in SPLITS:
                        ids = splits[name]
                        n_shards = max(1, min(shards, len(ids)))
                        files = [tmp / f"{name}-{i:03d}-of-{n_shards:03d}.tfrecord" for i in range(n_shards)]
                        writers = [tf.io.TFRecordWriter(str(f)) for f in files]
                        counts = [0] * n_shards
                        try:
                            for i, fut in enumerate(futures[name]):  # in order: shard assignment is deterministic
                                case_id, image, label, case_warnings, stats = fut.result()
                                case_stats.append(stats)
                                for text in case_warnings:
                                    (warn or _print_warning)(text)
                                writers[i % n_shards].write(_serialize(case_id, image, label))
                                counts[i % n_shards] += 1
                                done += 1
                                if progress:
                                    progress(done, total)
                        finally:
                            for w in writers:
                                w.close()
                        manifest["splits"][name] = {
                            "cases": ids,
                            "num_cases": len(ids),
                            "shards": [
                                {"file": f.name, "num_cases": c, "sha256": _sha256(f), "bytes": f.stat().st_size}
                                for f, c in zip(files, counts, strict=True)
                                if c > 0
                            ],
                        }
                        for f, c in zip(files, counts, strict=True):
                            if c == 0:
                                f.unlink()
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)  # one bad case: do not process the rest
                    raise
            from distmis.data._inspect import aggregate

            manifest["fingerprint"] = aggregate(
                case_stats, labels=dataset.labels, modalities=dataset.modalities, name=dataset.name
            )
            write_json_atomic(tmp / MANIFEST, manifest)
    except PermissionError as exc:
        raise DataError(f"{out}: not writable ({exc})") from None
    return manifest
