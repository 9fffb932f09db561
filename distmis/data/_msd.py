"""Reading an MSD (Medical Segmentation Decathlon) dataset, driven by its ``dataset.json``.

The file list always comes from ``dataset.json`` and never from globbing: the official
tarballs contain macOS AppleDouble files (``._BRATS_001.nii.gz``) next to the real ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictStr

from distmis.exceptions import DataError
from distmis.files import input_problem


@dataclass(frozen=True)
class MsdCase:
    case_id: str
    image: Path
    label: Path | None


@dataclass(frozen=True)
class MsdDataset:
    """The parts of ``dataset.json`` distmis uses."""

    root: Path
    name: str
    description: str
    modalities: tuple[str, ...]
    labels: dict[int, str]
    training: tuple[MsdCase, ...]
    test: tuple[MsdCase, ...]

    @property
    def num_modalities(self) -> int:
        return len(self.modalities)


def case_id_of(path: str | Path) -> str:
    """``imagesTr/BRATS_001.nii.gz`` -> ``BRATS_001`` (the MSD case id of an image or label path)."""
    name = Path(path).name
    for suffix in (".nii.gz", ".nii"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class _TrainingEntry(BaseModel):
    model_config = ConfigDict(extra="allow")
    image: StrictStr
    label: StrictStr


class _DatasetJson(BaseModel):
    """The structure of an MSD ``dataset.json`` (other fields are kept, not checked)."""

    model_config = ConfigDict(extra="allow")
    modality: dict[str, StrictStr]
    labels: dict[str, StrictStr]
    training: list[_TrainingEntry]
    test: list[StrictStr] = []


#: label maps are stored as uint8 in prepared data (and written as uint8 by predict)
MAX_LABEL = 255


def _int_keys(mapping: dict[str, str], field: str, path: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    for key, value in mapping.items():
        try:
            number = int(key)
        except ValueError:
            raise DataError(f"{path}: {field}: keys must be integers written as strings, got {key!r}") from None
        out[number] = value
    return out


def _check_label_names(labels: dict[int, str], path: Path) -> None:
    """Every foreground label must name its own metrics (``val_dice_<name>``) once sanitised."""
    from distmis.labels import metric_name_clash

    clash = metric_name_clash([(f"label {v}", name) for v, name in sorted(labels.items()) if v])
    if clash:
        raise DataError(f"{path}: labels: {clash}; give each label a name of its own")


def _case_path(root: Path, given: str, where: str, path: Path) -> Path:
    """``root / given`` for a relative path that stays inside the dataset directory.

    A shared ``dataset.json`` must not make distmis read (or later overwrite beside) files
    elsewhere: absolute paths and ``..`` escapes are refused.
    """
    if not given.strip():
        raise DataError(f"{path}: {where}: empty path")
    if Path(given).is_absolute() or given.startswith("~"):
        raise DataError(f"{path}: {where}: {given!r} is absolute; paths must be relative to the dataset directory")
    normal = os.path.normpath(given)
    if normal == ".." or normal.startswith(".." + os.sep):
        raise DataError(f"{path}: {where}: {given!r} leaves the dataset directory {root}")
    return root / normal


def read_dataset_json(root: str | Path, *, require_files: bool = True) -> MsdDataset:
    """Parse and check ``root/dataset.json``; every listed file must exist.

    Checked like nnU-Net's dataset integrity check: the structure and types of every field,
    no duplicate keys, relative paths inside the dataset, unique case ids, no label file
    shared by two cases, no test case that is also a training case, label values that fit
    the uint8 label maps distmis stores.

    Raises:
        DataError: naming the file and the field that is missing or wrong.
    """
    from distmis.documents import load_json_document

    root = Path(root)
    path = root / "dataset.json"
    if not path.is_file():
        found = "not a regular file" if path.exists() else "missing"
        raise DataError(f"{path}: {found}; an MSD dataset directory must contain dataset.json")
    meta = load_json_document(_DatasetJson, path, error=DataError, what="an MSD dataset.json object")
    modality_keys = _int_keys(meta.modality, "modality", path)
    if sorted(modality_keys) != list(range(len(modality_keys))):
        raise DataError(f"{path}: modality: keys must be 0..{len(modality_keys) - 1}, got {sorted(meta.modality)}")
    modalities = tuple(modality_keys[k] for k in sorted(modality_keys))
    if not modalities:
        raise DataError(f"{path}: modality: empty; expected at least one modality")
    labels = _int_keys(meta.labels, "labels", path)
    if 0 not in labels:
        raise DataError(f"{path}: labels: must declare 0 (background), got {sorted(labels)}")
    bad = [k for k in labels if not 0 <= k <= MAX_LABEL]
    if bad:
        raise DataError(
            f"{path}: labels: declares {bad}, but label maps are stored as uint8 (0..{MAX_LABEL}); "
            f"{bad[0]} would silently become {bad[0] % 256}"
        )
    _check_label_names(labels, path)
    if not meta.training:
        raise DataError(f"{path}: training: empty; expected at least one case")

    training: list[MsdCase] = []
    for i, entry in enumerate(meta.training):
        image = _case_path(root, entry.image, f"training[{i}].image", path)
        label = _case_path(root, entry.label, f"training[{i}].label", path)
        training.append(MsdCase(case_id_of(image), image, label))
    test = [MsdCase(case_id_of(p), _case_path(root, p, f"test[{i}]", path), None) for i, p in enumerate(meta.test)]

    _check_cases(training, test, path, require_files)
    return MsdDataset(
        root=root,
        name=str(getattr(meta, "name", None) or root.name),
        description=str(getattr(meta, "description", None) or ""),
        modalities=modalities,
        labels=labels,
        training=tuple(training),
        test=tuple(test),
    )


def _check_cases(training: list[MsdCase], test: list[MsdCase], path: Path, require_files: bool) -> None:
    """Unique case ids, a label file per case, no test case that is a training case, every file there
    (``require_files``; a command that reads some cases only checks those itself)."""
    ids: dict[str, int] = {}
    label_owner: dict[Path, str] = {}
    for i, case in enumerate(training):
        if case.case_id in ids:
            raise DataError(
                f"{path}: training[{ids[case.case_id]}] and training[{i}] are both case {case.case_id!r}: "
                "duplicate case ids"
            )
        ids[case.case_id] = i
        assert case.label is not None
        key = Path(os.path.normpath(case.label))
        if key in label_owner:
            raise DataError(
                f"{path}: cases {label_owner[key]!r} and {case.case_id!r} share the label file "
                f"{case.label}; every case needs its own label"
            )
        label_owner[key] = case.case_id
        if Path(os.path.normpath(case.image)) == key:
            raise DataError(f"{path}: case {case.case_id!r} uses {case.image} as both image and label")
    train_images = {Path(os.path.normpath(c.image)): c.case_id for c in training}
    for i, case in enumerate(test):
        clash = train_images.get(Path(os.path.normpath(case.image))) or (case.case_id if case.case_id in ids else None)
        if clash:
            raise DataError(
                f"{path}: test[{i}] ({case.image.name}) is also training case {clash!r}: a test case "
                "must not be trained on"
            )
    if require_files:
        for case in training:
            check_case_files(case, path)


def check_case_files(case: MsdCase, listed_in: Path) -> None:
    """The case's image and label exist and can be read.

    Raises:
        DataError: naming the file and why (missing, a broken link or a link loop, ...).
    """
    for f in (case.image, case.label):
        problem = input_problem(f) if f is not None else None
        if problem:
            raise DataError(f"{f}: listed in {listed_in} but {problem}")


# --------------------------------------------------------------------------- geometry
#: tolerances of the image/label geometry check (nnU-Net compares with np.allclose as well;
#: these absorb the float noise of different writers, not real differences)
SPACING_RTOL = 1e-4
ORIGIN_ATOL_MM = 1e-3
DIRECTION_ATOL = 1e-4


def _geometry(affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(spacing, origin, direction cosines) of a NIfTI affine."""
    linear = np.asarray(affine, dtype=float)[:3, :3]
    spacing = np.linalg.norm(linear, axis=0)
    direction = linear / np.where(spacing > 0, spacing, 1.0)
    return spacing, np.asarray(affine, dtype=float)[:3, 3], direction


def geometry_difference(image_affine: np.ndarray, label_affine: np.ndarray) -> str | None:
    """How two voxel grids differ (spacing, origin, axis direction), or ``None`` if they agree."""
    si, oi, di = _geometry(image_affine)
    sl, ol, dl = _geometry(label_affine)
    if not np.allclose(si, sl, rtol=SPACING_RTOL, atol=0):
        return f"spacing {np.round(si, 4).tolist()} mm vs {np.round(sl, 4).tolist()} mm"
    if not np.allclose(di, dl, atol=DIRECTION_ATOL):
        flipped = [ax for ax in range(3) if np.allclose(di[:, ax], -dl[:, ax], atol=DIRECTION_ATOL)]
        if flipped:
            names = ", ".join("xyz"[ax] + (" (left-right)" if ax == 0 else "") for ax in flipped)
            return f"axis direction: the label's {names} axis is flipped"
        return f"axis direction: {np.round(di, 3).tolist()} vs {np.round(dl, 3).tolist()}"
    if not np.allclose(oi, ol, atol=ORIGIN_ATOL_MM):
        return f"origin {np.round(oi, 3).tolist()} mm vs {np.round(ol, 3).tolist()} mm"
    return None


def check_case_headers(case: MsdCase, num_modalities: int, *, expected_by: str = "dataset.json") -> None:
    """Check one case from the NIfTI headers alone (no voxel data read): modality count,
    image/label shape and geometry. Cheap enough to run on every case before any work starts.
    ``expected_by``: who declares the modality count, for the message (a model, or dataset.json).

    Raises:
        DataError: naming both files and the difference.
    """
    image_affine, shape = load_nifti_header(case.image)
    if len(shape) == 3:
        shape = (*shape, 1)
    if len(shape) != 4:
        raise DataError(f"{case.image}: expected a 3D or 4D image, got shape {shape}")
    if shape[-1] != num_modalities:
        raise DataError(
            f"{case.image}: expected {num_modalities} modalities as declared in {expected_by}, got "
            f"{shape[-1]} (shape {shape})"
        )
    if case.label is None:
        return
    label_affine, lshape = load_nifti_header(case.label)
    if len(lshape) == 4 and lshape[-1] == 1:
        lshape = lshape[:3]
    if lshape != shape[:3]:
        raise DataError(f"{case.label}: label shape {lshape} does not match image shape {shape[:3]} of {case.image}")
    diff = geometry_difference(image_affine, label_affine)
    if diff:
        raise DataError(
            f"{case.label}: not aligned with its image {case.image}: {diff}; a misaligned label would "
            "be trained on and scored as if it matched"
        )


def max_volume_bytes() -> int:
    """The most memory one volume may claim (its float32 array): half of this machine's memory.

    A header is checked against it before any voxel is read: a 1 kB file that claims 10000^3
    voxels is an error naming the claim, not a MemoryError after minutes of decompression.
    """
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def check_declared_size(path: Path, shape: tuple[int, ...], itemsize: int = 4) -> None:
    """Refuse a header whose shape implies more memory than :func:`max_volume_bytes`.

    Raises:
        DataError: naming the file, the claimed shape and the bytes it implies.
    """
    import math

    claimed = math.prod(int(s) for s in shape) * itemsize
    limit = max_volume_bytes()
    if claimed > limit:
        raise DataError(
            f"{path}: the header claims shape {tuple(int(s) for s in shape)}, {claimed / 2**30:.1f} GiB as float32; "
            f"more than half of this machine's memory ({limit / 2**30:.1f} GiB): a damaged or wrong header"
        )


def _unreadable(path: Path, exc: BaseException, what: str = "NIfTI") -> DataError:
    """nibabel's message as one line (some span two: "... from X\n - could the file be damaged?")."""
    text = " ".join(str(exc).split())
    return DataError(f"{path}: cannot read {what} ({type(exc).__name__}: {text})")


#: DEFLATE's largest possible expansion (a 258-byte match per 2 bits, about 1032:1): a .nii.gz
#: can never hold more voxel bytes than this times its own size
MAX_GZIP_RATIO = 1032


def check_declared_bytes(path: Path, img: Any) -> None:
    """Refuse a header whose shape needs more voxel bytes than the file can hold, before reading.

    nibabel allocates the whole array the header declares and only then finds the data short
    ("Expected 2000000000 bytes, got 1024"): a 1 kB file claiming 1000^3 voxels cost 2 GB of
    memory for an error that names no size. An uncompressed file must hold the header's bytes
    exactly after its offset; a gzip one cannot expand beyond :data:`MAX_GZIP_RATIO`.

    Raises:
        DataError: naming the file, the claimed shape and the bytes it implies.
    """
    import math

    shape = tuple(int(s) for s in img.shape)
    try:
        itemsize = int(img.get_data_dtype().itemsize)
        offset = int(getattr(img.dataobj, "offset", 0) or 0)
        data_file = Path(img.file_map["image"].filename or path)  # the .img of a .hdr/.img pair
        size = data_file.stat().st_size
    except (AttributeError, KeyError, TypeError, ValueError, OSError):
        return  # not a NIfTI array proxy nibabel describes: reading it names what is wrong
    needed = math.prod(shape) * itemsize
    suffix = data_file.suffix.lower()
    if suffix in (".bz2", ".zst"):
        return  # no useful bound: bzip2's and zstd's run-length stages expand far beyond 1032:1
    compressed = suffix == ".gz"
    available = size * MAX_GZIP_RATIO if compressed else size - offset
    if needed > available:
        held = (
            f"at most {available} bytes once decompressed"
            if compressed
            else f"{max(available, 0)} bytes after its header"
        )
        raise DataError(
            f"{path}: the header claims shape {shape} of {img.get_data_dtype()}, {needed} bytes of voxels, but the "
            f"{size}-byte {'file' if data_file == Path(path) else data_file.name} holds {held}: a truncated file or a "
            "wrong header"
        )


def check_affine(path: Path, affine: np.ndarray) -> None:
    """Refuse a voxel-to-world map with no 3D geometry: a non-finite entry, a voxel axis of no length
    (a zero column in the sform), or axes that lie in one plane. Spacing, orientation and the
    image-label comparison are all read from it, and a degenerate one has no answer for them.

    Raises:
        DataError: naming the file, its spacing and what to fix.
    """
    linear = np.asarray(affine, dtype=float)[:3, :3]
    if not np.all(np.isfinite(np.asarray(affine, dtype=float))):
        raise DataError(f"{path}: its affine (the header's sform or qform) has NaN/Inf entries; fix the header")
    spacing = np.linalg.norm(linear, axis=0)
    if np.any(spacing <= 0) or abs(float(np.linalg.det(linear))) <= 1e-6 * float(np.prod(spacing)):
        raise DataError(
            f"{path}: its affine (the header's sform or qform) gives voxel axes of length "
            f"{np.round(spacing, 6).tolist()} mm that do not span 3D space (a zero column, or axes in one plane), "
            "so the image has no spacing or orientation; fix the header (its pixdim and sform/qform)"
        )


def load_nifti_header(path: Path) -> tuple[np.ndarray, tuple[int, ...]]:
    """(affine, shape) of a NIfTI file from its header alone.

    Raises:
        DataError: an unreadable header, or a shape past :func:`check_declared_size`.
    """
    import nibabel as nib

    try:
        img = nib.load(str(path))
    except Exception as exc:  # noqa: BLE001 - nibabel raises many types for a damaged header
        raise _unreadable(path, exc, "NIfTI header") from None
    shape = tuple(int(s) for s in img.shape)
    check_declared_size(path, shape)
    check_declared_bytes(path, img)
    check_affine(path, img.affine)
    return np.asarray(img.affine), shape


def load_nifti(path: Path, *, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray, object]:
    """Load a NIfTI file fully into memory: (array, affine, header).

    The header's shape is checked first (:func:`check_declared_size`). A truncated ``.nii.gz``
    only fails when the data is read, so the data is read here, inside the ``try``, to turn every
    kind of corruption into one ``DataError``. Floating-point data is checked in its stored
    precision before it becomes ``dtype``: a finite 1e300 is "beyond float32", not "NaN/Inf".
    """
    import nibabel as nib

    try:
        img = nib.load(str(path))
    except Exception as exc:  # noqa: BLE001 - nibabel raises many types (EOFError, zlib.error, ImageFileError, ...)
        raise _unreadable(path, exc) from None
    check_declared_size(path, img.shape, max(4, np.dtype(dtype).itemsize))
    check_declared_bytes(path, img)
    check_affine(path, img.affine)
    try:
        raw = np.asanyarray(img.dataobj)
    except Exception as exc:  # noqa: BLE001 - a truncated or damaged file fails only here
        raise _unreadable(path, exc) from None
    if np.issubdtype(dtype, np.floating) and np.issubdtype(raw.dtype, np.floating) and raw.size:
        if not np.all(np.isfinite(raw)):
            raise DataError(f"{path}: contains {int(np.sum(~np.isfinite(raw)))} NaN/Inf voxels")
        largest = float(np.max(np.abs(raw)))
        if largest > float(np.finfo(dtype).max):
            raise DataError(
                f"{path}: holds values up to {largest:.3g}, beyond {np.dtype(dtype).name}'s range "
                f"({float(np.finfo(dtype).max):.3g}); rescale the image"
            )
    return np.asarray(raw, dtype=dtype), img.affine, img.header


def load_case_image(
    path: Path, num_modalities: int, *, expected_by: str = "dataset.json"
) -> tuple[np.ndarray, np.ndarray, object]:
    """Load an image as (X, Y, Z, C) float32 and check its modality count (declared by
    ``expected_by``, for the message: dataset.json, or the model that will read it) and values."""
    data, affine, header = load_nifti(path)
    if data.ndim == 3:
        data = data[..., np.newaxis]
    if data.ndim != 4:
        raise DataError(f"{path}: expected a 3D or 4D image, got shape {data.shape}")
    if data.shape[-1] != num_modalities:
        raise DataError(
            f"{path}: expected {num_modalities} modalities as declared in {expected_by}, got {data.shape[-1]} "
            f"(shape {data.shape})"
        )
    return data, affine, header  # finite and within float32: load_nifti checked it in the file's precision


def content_warnings(
    image_path: Path,
    image: np.ndarray,
    label_path: Path | None,
    label: np.ndarray | None,
    modalities: tuple[str, ...] | list[str],
) -> list[str]:
    """What is suspicious but not wrong: a constant image channel (z-scoring makes it all
    zeros, so the model sees nothing there) and a label with no foreground at all."""
    found = []
    for c in range(image.shape[-1]):
        channel = image[..., c]
        lo, hi = float(channel.min()), float(channel.max())
        if lo == hi:
            name = modalities[c] if c < len(modalities) else f"channel {c}"
            what = "all zero" if lo == 0 else f"constant ({lo:g})"
            found.append(f"{image_path}: channel {c} ({name}) is {what}; after normalisation it carries no information")
    if label is not None and label_path is not None and not np.any(label):
        found.append(f"{label_path}: all background (no foreground voxel)")
    return found


def load_case_label(path: Path, spatial_shape: tuple[int, ...], labels: dict[int, str]) -> np.ndarray:
    """Load a label map as (X, Y, Z) uint8 and check shape and declared label values.

    Values are checked before the cast, so a value that does not fit uint8 is an error
    instead of wrapping around (300 would become 44).
    """
    data, _, _ = load_nifti(path, dtype=np.float32)
    if data.ndim == 4 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.shape != tuple(spatial_shape):
        raise DataError(f"{path}: label shape {data.shape} does not match image shape {tuple(spatial_shape)}")
    if not np.all(np.isfinite(data)):
        raise DataError(f"{path}: contains NaN/Inf label values")
    values = np.unique(data)
    if np.any(values != np.round(values)):
        raise DataError(f"{path}: label values must be integers, got {values[values != np.round(values)][:5]}")
    undeclared = sorted(set(values.astype(int).tolist()) - set(labels))
    if undeclared:
        raise DataError(f"{path}: label values {undeclared} are not declared in dataset.json labels {sorted(labels)}")
    return data.astype(np.uint8)
