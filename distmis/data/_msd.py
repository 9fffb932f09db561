"""Reading an MSD (Medical Segmentation Decathlon) dataset, driven by its ``dataset.json``.

The file list always comes from ``dataset.json`` and never from globbing: the official
tarballs contain macOS AppleDouble files (``._BRATS_001.nii.gz``) next to the real ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distmis.exceptions import DataError


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


def read_dataset_json(root: str | Path) -> MsdDataset:
    """Parse and check ``root/dataset.json``; every listed file must exist.

    Raises:
        DataError: naming the file and the field that is missing or wrong.
    """
    root = Path(root)
    path = root / "dataset.json"
    if not path.is_file():
        raise DataError(f"{path}: missing; an MSD dataset directory must contain dataset.json")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object")
    for key in ("modality", "labels", "training"):
        if key not in meta:
            raise DataError(f"{path}: missing field {key!r} (MSD dataset.json needs modality, labels, training)")
    try:
        modalities = tuple(str(v) for _, v in sorted(meta["modality"].items(), key=lambda kv: int(kv[0])))
        labels = {int(k): str(v) for k, v in meta["labels"].items()}
    except (AttributeError, ValueError) as exc:
        raise DataError(f"{path}: 'modality' and 'labels' must map integer strings to names ({exc})") from None
    if not modalities:
        raise DataError(f"{path}: 'modality' is empty; expected at least one modality")
    if 0 not in labels:
        raise DataError(f"{path}: 'labels' must declare 0 (background), got {sorted(labels)}")

    training: list[MsdCase] = []
    for i, entry in enumerate(meta["training"]):
        if not isinstance(entry, dict) or "image" not in entry or "label" not in entry:
            raise DataError(f"{path}: training[{i}] must be an object with 'image' and 'label'")
        training.append(MsdCase(case_id_of(entry["image"]), root / entry["image"], root / entry["label"]))
    test = [MsdCase(case_id_of(p), root / p, None) for p in meta.get("test", [])]
    if not training:
        raise DataError(f"{path}: 'training' is empty")
    ids = [c.case_id for c in training]
    if len(set(ids)) != len(ids):
        raise DataError(f"{path}: duplicate case ids in 'training'")
    for case in training:
        for f in (case.image, case.label):
            if not f.is_file():
                raise DataError(f"{f}: listed in {path} but missing")
    return MsdDataset(
        root=root,
        name=str(meta.get("name", root.name)),
        description=str(meta.get("description", "")),
        modalities=modalities,
        labels=labels,
        training=tuple(training),
        test=tuple(test),
    )


def load_nifti(path: Path, *, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray, object]:
    """Load a NIfTI file fully into memory: (array, affine, header).

    A truncated ``.nii.gz`` only fails when the data is read, so the data is read here,
    inside the ``try``, to turn every kind of corruption into one ``DataError``.
    """
    import nibabel as nib

    try:
        img = nib.load(str(path))
        data = np.asarray(img.dataobj, dtype=dtype)
    except Exception as exc:  # nibabel raises many types (EOFError, zlib.error, ImageFileError, ...)
        raise DataError(f"{path}: cannot read NIfTI ({type(exc).__name__}: {exc})") from None
    return data, img.affine, img.header


def load_case_image(path: Path, num_modalities: int) -> tuple[np.ndarray, np.ndarray, object]:
    """Load an image as (X, Y, Z, C) float32 and check its modality count and values."""
    data, affine, header = load_nifti(path)
    if data.ndim == 3:
        data = data[..., np.newaxis]
    if data.ndim != 4:
        raise DataError(f"{path}: expected a 3D or 4D image, got shape {data.shape}")
    if data.shape[-1] != num_modalities:
        raise DataError(
            f"{path}: expected {num_modalities} modalities as declared in dataset.json, got {data.shape[-1]} "
            f"(shape {data.shape})"
        )
    if not np.all(np.isfinite(data)):
        raise DataError(f"{path}: contains {int(np.sum(~np.isfinite(data)))} NaN/Inf voxels")
    return data, affine, header


def load_case_label(path: Path, spatial_shape: tuple[int, ...], labels: dict[int, str]) -> np.ndarray:
    """Load a label map as (X, Y, Z) int and check shape and declared label values."""
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
