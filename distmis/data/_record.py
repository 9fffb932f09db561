"""The prepared dataset's record, ``info.json``: one pydantic model, with a format version.

``prepare`` writes it; the loader, training, finalize, evaluation and inference read it through
:func:`load_manifest`. A directory of an older format is refused with the command that prepares
it again: reading it as the new format would be a silent misread.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, StrictStr, model_validator

from distmis.data._splits import SPLITS, CaseSplits
from distmis.exceptions import DataError
from distmis.schema import RunFile

FORMAT = "distmis-prepared/2"

_FILE_NAME = r"^cases/[^/\\]+$"  # a file inside the prepared directory's cases/, never a path out of it


class FileRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file: StrictStr = Field(pattern=_FILE_NAME)
    sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class CaseFiles(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: FileRecord
    label: FileRecord
    foreground: FileRecord


class CaseRecord(BaseModel):
    """One case: its files and the label values it holds (what fold planning needs, read without the label)."""

    model_config = ConfigDict(extra="forbid")
    files: CaseFiles
    label_values: list[int]


class SplitRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cases: list[StrictStr]
    num_cases: int = Field(ge=0)


class SourceRecord(BaseModel):
    model_config = ConfigDict(extra="allow")
    path: StrictStr
    name: StrictStr | None = None
    description: StrictStr | None = None


class ChannelNormalisation(BaseModel):
    """One channel's normalisation (CT: its clip range, mean and standard deviation)."""

    model_config = ConfigDict(extra="allow")
    scheme: Literal["zscore", "ct", "none"]
    clip: tuple[FiniteFloat, FiniteFloat] | None = None
    mean: FiniteFloat | None = None
    std: FiniteFloat | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ct_complete(self) -> ChannelNormalisation:
        if self.scheme == "ct" and (self.clip is None or self.mean is None or self.std is None):
            raise ValueError("a ct channel needs clip, mean and std")
        return self


class Preprocessing(BaseModel):
    """How every case's image was turned into the prepared grid: what inference redoes to a new scan."""

    model_config = ConfigDict(extra="allow")
    #: ``zscore_nonzero_per_channel`` (every channel z-scored per case over its non-zero voxels)
    #: or ``per_channel`` (each channel as channel_normalisation says: a CT channel among them)
    normalisation: StrictStr
    #: per channel (older models: none, and every channel is z-scored per case)
    channel_normalisation: list[ChannelNormalisation] | None = None
    resize: Literal["crop_pad", "resample"]
    shape: tuple[int, int, int]

    @property
    def normalisation_spec(self) -> list[dict[str, Any]] | None:
        """Each channel's scheme as :func:`~distmis.data.normalize` applies it (``None``: z-score all)."""
        if self.channel_normalisation is None:
            return None
        return [channel.model_dump(exclude_none=True) for channel in self.channel_normalisation]

    @model_validator(mode="after")
    def _positive_shape(self) -> Preprocessing:
        if any(s < 1 for s in self.shape):
            raise ValueError(f"shape must be 3 positive integers, got {list(self.shape)}")
        return self


class LabelledChannels(BaseModel):
    """What a model's inputs and outputs mean: shared by the prepared record and a model's record,
    so that the two cannot disagree on a field's name or type."""

    channels: int = Field(ge=1)
    modalities: list[StrictStr]
    #: value -> name, keyed by the value as a string (JSON's keys are strings)
    labels: dict[str, StrictStr] = {}
    label_mode: Literal["binary", "multiclass", "regions"]
    num_classes: int = Field(ge=1)
    regions: dict[str, list[int]] | None = None

    @property
    def label_names(self) -> dict[int, str]:
        """Label value -> name, in the dataset's numbering: the one place the string keys become values."""
        return {int(value): name for value, name in self.labels.items()}

    @property
    def foreground_values(self) -> list[int]:
        """The declared foreground values (``[1]`` where the record declares none)."""
        return [value for value in self.label_names if value > 0] or [1]

    @property
    def trained_regions(self) -> dict[str, list[int]] | None:
        """The regions the model's channels stand for, where it was trained on regions."""
        return self.regions if self.label_mode == "regions" else None


class PreparedInfo(LabelledChannels):
    """The prepared dataset's record, ``info.json``."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["distmis-prepared/2"]
    source: SourceRecord
    shape: tuple[int, int, int]
    labels: dict[str, StrictStr]
    image_dtype: Literal["float32"] = "float32"
    label_dtype: Literal["uint8"] = "uint8"
    preprocessing: Preprocessing
    split: dict[str, Any] = {}
    splits: dict[Literal["train", "val", "test"], SplitRecord]
    cases: dict[StrictStr, CaseRecord]
    fingerprint: dict[str, Any] | None = None
    fold: dict[str, int] | None = None  # set on a cross-validation fold's view, never on disk

    def cases_of(self, split: str) -> list[str]:
        """The cases of one split (none where the record has no such split)."""
        record = self.splits.get(split)  # type: ignore[call-overload]
        return list(record.cases) if record is not None else []

    @property
    def through_plane_axis(self) -> int | None:
        """The axis of the prepared grid whose voxels are more than 3 times longer than the finest
        axis's (nnU-Net's anisotropy threshold), about which alone spatial augmentation rotates; ``None``
        for a near-isotropic grid, or one whose spacing was not recorded."""
        from distmis.data._inspect import ANISOTROPY_RATIO

        spacing = (self.fingerprint or {}).get("median_spacing_mm")
        if not isinstance(spacing, list) or len(spacing) != 3 or min(spacing) <= 0:
            return None
        grid = [float(mm) for mm in spacing]
        median_shape = (self.fingerprint or {}).get("median_shape")
        if self.preprocessing.resize == "resample" and isinstance(median_shape, list) and len(median_shape) == 3:
            grid = [mm * source / target for mm, source, target in zip(grid, median_shape, self.shape, strict=True)]
        return grid.index(max(grid)) if max(grid) / min(grid) > ANISOTROPY_RATIO else None

    @property
    def case_splits(self) -> CaseSplits:
        return CaseSplits(**{name: self.cases_of(name) for name in SPLITS})


class ModelPreprocessing(Preprocessing, LabelledChannels):
    """A model's ``preprocessing.json``: its data's channels and labels, the preprocessing to redo,
    and the cases it trained on, chose its best epoch on, and never saw (``evaluate`` says so).

    Derived from the prepared record (:meth:`of_prepared`) when training writes it; inference reads it.
    """

    splits: CaseSplits | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ModelPreprocessing:
        if len(self.modalities) != self.channels:
            raise ValueError(f"channels {self.channels} but {len(self.modalities)} modalities")
        if self.channel_normalisation is not None and len(self.channel_normalisation) != self.channels:
            raise ValueError(
                f"channel_normalisation has {len(self.channel_normalisation)} entries for {self.channels} channels"
            )
        if (self.label_mode == "binary") != (self.num_classes == 1) and self.label_mode != "regions":
            raise ValueError(f"label_mode {self.label_mode!r} does not go with num_classes {self.num_classes}")
        if self.label_mode == "regions" and len(self.regions or {}) != self.num_classes:
            raise ValueError(
                f"label_mode 'regions' needs one region per output channel ({self.num_classes}), "
                f"got regions {self.regions}"
            )
        return self

    @classmethod
    def of_prepared(cls, info: PreparedInfo) -> ModelPreprocessing:
        """The record of a model trained on the prepared data whose record is ``info``."""
        described = {name: getattr(info, name) for name in LabelledChannels.model_fields}
        return cls(**info.preprocessing.model_dump(), **described, splits=info.case_splits)


@dataclass(frozen=True)
class Manifest:
    """A prepared directory (``root``) and its ``info.json``, checked (``info``, a :class:`PreparedInfo`).

    Every fact about the data is read from ``info`` (``manifest.info.shape``): one path to each, so
    the directory's wrapper cannot drift from the record.
    """

    root: Path
    info: PreparedInfo

    def cases(self, split: str) -> list[str]:
        return self.info.cases_of(split)

    def num_cases(self, split: str) -> int:
        return len(self.cases(split))

    def case_files(self) -> dict[str, CaseFiles]:
        """Case id -> its files (``image``, ``label``, ``foreground``), as the reader wants them."""
        return {cid: record.files for cid, record in self.info.cases.items()}


def reprepare_command(document: dict[str, Any], root: Path) -> str:
    """The ``distmis prepare`` command that makes ``root`` again from what an ``info.json`` of any
    format records (read as plain JSON: an older format does not fit the model)."""
    source = (document.get("source") or {}).get("path", "SRC")
    options = document.get("preprocessing") or {}
    words = ["distmis", "prepare", str(source), str(root), "--overwrite"]
    if isinstance(shape := options.get("shape"), list):
        words += ["--shape", ",".join(str(s) for s in shape)]
    if resize := options.get("resize"):
        words += ["--resize", str(resize)]
    if label_mode := document.get("label_mode"):
        words += ["--label-mode", str(label_mode)]
    return shlex.join(words)


def load_manifest(root: str | Path) -> Manifest:
    """Read and check ``info.json`` of a prepared directory.

    Raises:
        DataError: the directory or its record is missing, of an older or unknown format (naming
            the command that prepares it again), malformed (naming the field), or a case file it
            lists is missing.
    """
    from distmis.documents import read_json, validate_document

    root = Path(root)
    path = root / RunFile.PREPARED_INFO
    if not path.is_file():
        raise DataError(f"{path}: missing; run `distmis prepare` first")
    info = read_json(path, error=DataError, what="a distmis info.json object")
    found = info.get("format") if isinstance(info, dict) else type(info).__name__
    if found != FORMAT:
        again = f"; prepare it again: {reprepare_command(info, root)}" if isinstance(info, dict) else ""
        raise DataError(f"{path}: format {found!r}, expected {FORMAT!r} (written by distmis prepare){again}")
    checked = validate_document(PreparedInfo, info, path, error=DataError)
    if any(s <= 0 for s in checked.shape):
        raise DataError(f"{path}: shape: expected 3 positive integers, got {list(checked.shape)}")
    if checked.channels != len(checked.modalities):
        raise DataError(f"{path}: channels {checked.channels} but {len(checked.modalities)} modalities")
    seen_in: dict[str, str] = {}  # a case in two splits (or twice in one) would be trained and tested on
    for name, split in checked.splits.items():
        if split.num_cases != len(split.cases):
            raise DataError(f"{path}: splits.{name}: num_cases {split.num_cases} but {len(split.cases)} cases")
        for case in split.cases:
            if case not in checked.cases:
                raise DataError(f"{path}: splits.{name}: case {case!r} has no entry in cases")
            if case in seen_in:
                where = "twice" if seen_in[case] == name else f"and in splits.{seen_in[case]}"
                raise DataError(
                    f"{path}: splits.{name}: case {case!r} is listed {where}; each case belongs to one split once"
                )
            seen_in[case] = name
    for case, record in checked.cases.items():
        for key in ("image", "label", "foreground"):
            file = getattr(record.files, key).file
            if not (root / file).is_file():
                raise DataError(f"{root / file}: the {key} of case {case}, listed in {path}, is missing")
    return Manifest(root=root, info=checked)


__all__ = [
    "FORMAT",
    "SPLITS",
    "CaseRecord",
    "ChannelNormalisation",
    "ModelPreprocessing",
    "Preprocessing",
    "LabelledChannels",
    "Manifest",
    "PreparedInfo",
    "load_manifest",
    "reprepare_command",
]
