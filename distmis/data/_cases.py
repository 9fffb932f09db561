"""One prepared case on disk: chunked, compressed arrays read a patch at a time, and its foreground.

Each case is three files in ``cases/`` of a prepared directory:

- ``<id>.image.b2nd``: the preprocessed image ``(X, Y, Z, C)`` float32, a Blosc2 NDArray
  chunked over space (all channels in a chunk), so a patch read decompresses only the chunks
  it overlaps; a whole-volume read is no dearer than a flat file;
- ``<id>.label.b2nd``: the label ``(X, Y, Z)`` uint8 (label values; binary data holds 0/1),
  chunked the same way;
- ``<id>.foreground.npz``: per present label value, a sample of its voxel coordinates, as
  nnU-Net keeps them: foreground oversampling draws a centre from them and never scans a label.

Blosc2 (zstd level 3, byte shuffle) was chosen by measurement at 240 x 240 x 155 x 4 (see
``benchmarks/real_size.py``): the case is as small as its ``.nii.gz`` and a 128³ patch reads in
tens of milliseconds, where a TFRecord of the same case is 3x larger and must be parsed whole.
"""

from __future__ import annotations

import hashlib
import io
import math
import threading
import zlib
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmis.exceptions import DataError

if TYPE_CHECKING:
    from distmis.data._record import CaseFiles

CASES_DIR = "cases"
#: at most this many coordinates per label value, but never under 1 % of its voxels (nnU-Net's rule)
FOREGROUND_SAMPLES = 10_000
FOREGROUND_COVERAGE = 0.01
_CHUNK = 48  # voxels per chunk edge: a 128³ patch touches 4³-5³ chunks
_BLOCK = 16


def case_files(case_id: str) -> dict[str, str]:
    """The file names (relative to the prepared directory) of one case."""
    return {
        "image": f"{CASES_DIR}/{case_id}.image.b2nd",
        "label": f"{CASES_DIR}/{case_id}.label.b2nd",
        "foreground": f"{CASES_DIR}/{case_id}.foreground.npz",
    }


def _compressed(array: np.ndarray) -> bytes:
    """The array as a Blosc2 frame (what a ``.b2nd`` file holds), built in memory: the file is then
    written by distmis itself, atomically and never through a link, and a full disk is an
    ``OSError`` naming it rather than Blosc2's bare "Error while creating the NDArray"."""
    import blosc2

    spatial = tuple(min(_CHUNK, n) for n in array.shape[:3])
    chunks = spatial + tuple(array.shape[3:])
    blocks = tuple(min(_BLOCK, n) for n in spatial) + tuple(array.shape[3:])
    cparams = {"codec": blosc2.Codec.ZSTD, "clevel": 3, "filters": [blosc2.Filter.SHUFFLE], "nthreads": 1}
    frame = blosc2.asarray(np.ascontiguousarray(array), chunks=chunks, blocks=blocks, cparams=cparams).to_cframe()
    return bytes(frame)


def _write(path: Path, data: bytes) -> None:
    from distmis.files import atomic_file

    with atomic_file(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


def foreground_locations(label: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """A sample of voxel coordinates ``(n, 3)`` int32 per non-zero label value present."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for value in np.unique(label):
        if value == 0:
            continue
        where = np.argwhere(label == value)
        n = min(len(where), max(FOREGROUND_SAMPLES, math.ceil(len(where) * FOREGROUND_COVERAGE)))
        pick = rng.choice(len(where), size=n, replace=False) if n < len(where) else slice(None)
        out[str(int(value))] = where[pick].astype(np.int32)
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_case(root: Path, case_id: str, image: np.ndarray, label: np.ndarray) -> dict[str, Any]:
    """Write one case under ``root`` and return its record (files with checksums, label values present).

    The foreground sample is seeded by the case id, so a case prepared again (``--resume``, or on
    another machine) gets the same coordinates.
    """
    from distmis.links import ensure_directory

    ensure_directory(root / CASES_DIR)
    names = case_files(case_id)
    _write(root / names["image"], _compressed(image.astype(np.float32, copy=False)))
    _write(root / names["label"], _compressed(label.astype(np.uint8, copy=False)))
    locations = foreground_locations(label, zlib.crc32(case_id.encode()))
    buffer = io.BytesIO()
    np.savez(buffer, **locations)  # type: ignore[arg-type]
    _write(root / names["foreground"], buffer.getvalue())
    return {
        "files": {
            key: {"file": name, "sha256": sha256_of(root / name), "bytes": (root / name).stat().st_size}
            for key, name in names.items()
        },
        "label_values": sorted(int(v) for v in locations),
    }


class CaseReader:
    """Reads patches and whole volumes of a prepared directory's cases, one handle per file and thread.

    A Blosc2 handle keeps only the array's metadata, so holding one per case costs kilobytes; a
    handle is not shared between threads because tf.data calls the reader from several at once.
    """

    def __init__(self, root: Path, files: dict[str, CaseFiles]) -> None:
        self.root = root
        self.files = files  # case id -> its image, label and foreground files
        self._local = threading.local()

    def _open(self, case_id: str, key: str) -> Any:
        import blosc2

        handles = self._local.__dict__.setdefault("handles", {})
        name = (case_id, key)
        if name not in handles:
            path = self.root / getattr(self.files[case_id], key).file
            try:
                handles[name] = blosc2.open(str(path), mode="r")
            except (RuntimeError, ValueError, OSError) as exc:  # what blosc2 raises on a damaged file
                raise DataError(f"{path}: not a readable Blosc2 array ({exc}); prepare the dataset again") from None
        return handles[name]

    def shape(self, case_id: str) -> tuple[int, ...]:
        return tuple(self._open(case_id, "image").shape)

    def check_layout(self, case_id: str, shape: tuple[int, ...], channels: int) -> None:
        """The case's arrays have the shape, channels and dtype ``info.json`` records (metadata only).

        A case from another preparation (its checksum rewritten to match) would otherwise fail in
        the middle of an epoch, inside TensorFlow.

        Raises:
            DataError: naming the file, what it holds and what was expected.
        """
        expected = {"image": ((*shape, channels), np.float32), "label": (tuple(shape), np.uint8)}
        for key, (want_shape, want_dtype) in expected.items():
            handle = self._open(case_id, key)
            found_shape, found_dtype = tuple(int(s) for s in handle.shape), np.dtype(handle.dtype)
            if found_shape != want_shape or found_dtype != want_dtype:
                path = self.root / getattr(self.files[case_id], key).file
                raise DataError(
                    f"{path}: the {key} of case {case_id} is {list(found_shape)} {found_dtype}, info.json records "
                    f"{list(want_shape)} {np.dtype(want_dtype)}; prepare the dataset again"
                )

    def read(
        self, case_id: str, start: tuple[int, int, int] | None = None, size: tuple[int, int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(image, label) of the box ``start`` + ``size``, or of the whole case."""
        image, label = self._open(case_id, "image"), self._open(case_id, "label")
        if start is None or size is None:
            box: tuple[slice, ...] = (slice(None),) * 3
        else:
            box = tuple(slice(int(s), int(s) + int(n)) for s, n in zip(start, size, strict=True))
        try:
            return np.asarray(image[box]), np.asarray(label[box])
        except (RuntimeError, ValueError, OSError) as exc:  # a damaged chunk
            path = self.root / self.files[case_id].image.file
            raise DataError(f"{path}: a chunk could not be read ({exc}); prepare the dataset again") from None

    def foreground(self, case_id: str) -> dict[int, np.ndarray]:
        """The case's sampled foreground coordinates per label value (small: read on each call)."""
        path = self.root / self.files[case_id].foreground.file
        try:
            with np.load(path) as data:
                return {int(k): data[k] for k in data.files}
        except (OSError, ValueError, zlib.error) as exc:
            raise DataError(f"{path}: not a readable foreground record ({exc}); prepare the dataset again") from None


def check_locations(
    locations: dict[int, np.ndarray], shape: tuple[int, ...], where: Path, labels: Collection[int] | None = None
) -> None:
    """A coordinate outside the volume, or a label value the dataset does not declare (``labels``),
    means a record of another case or version: refuse it (oversampling would fall back to uniform
    patches without a word)."""
    undeclared = sorted(int(v) for v in locations if labels is not None and int(v) not in labels)
    if undeclared:
        raise DataError(
            f"{where}: foreground of label value(s) {undeclared}, which info.json does not declare "
            f"(labels {sorted(labels or [])}); prepare the dataset again"
        )
    for value, coords in locations.items():
        if coords.ndim != 2 or coords.shape[1] != 3:
            raise DataError(f"{where}: foreground of label {value} has shape {coords.shape}, expected (n, 3)")
        if len(coords) and (coords.min() < 0 or np.any(coords.max(axis=0) >= np.asarray(shape[:3]))):
            raise DataError(
                f"{where}: a foreground coordinate of label {value} lies outside the volume {list(shape[:3])}; "
                "prepare the dataset again"
            )


__all__ = [
    "CASES_DIR",
    "CaseReader",
    "case_files",
    "check_locations",
    "foreground_locations",
    "sha256_of",
    "write_case",
]
