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
#: formats an older distmis wrote: refused, naming the command that prepares the data again
OLD_FORMATS = ("distmis-prepared/1",)

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
    #: ``zscore`` (every channel z-scored per case) or ``per_channel`` (see channel_normalisation)
    normalisation: StrictStr
    #: per channel (older models: none, and every channel is z-scored per case)
    channel_normalisation: list[ChannelNormalisation] | None = None
    resize: Literal["crop_pad", "resample"]
    shape: tuple[int, int, int]

    @model_validator(mode="after")
    def _positive_shape(self) -> Preprocessing:
        if any(s < 1 for s in self.shape):
            raise ValueError(f"shape must be 3 positive integers, got {list(self.shape)}")
        return self


class ModelPreprocessing(Preprocessing):
    """A model's ``preprocessing.json``: its data's channels and labels, the preprocessing to redo,
    and the cases it trained on, chose its best epoch on, and never saw (``evaluate`` says so).

    Training writes it from the prepared data's record (:meth:`of_prepared`); inference reads it.
    """

    channels: int = Field(ge=1)
    modalities: list[StrictStr]
    labels: dict[str, StrictStr] = {}
    label_mode: Literal["binary", "multiclass", "regions"]
    num_classes: int = Field(ge=1)
    regions: dict[str, list[int]] | None = None
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
    def of_prepared(cls, info: dict[str, Any]) -> ModelPreprocessing:
        """The record of a model trained on the prepared data whose ``info.json`` is ``info``."""
        prepared = PreparedInfo.model_validate(info)
        return cls(
            **prepared.preprocessing.model_dump(),
            channels=prepared.channels,
            modalities=prepared.modalities,
            labels=prepared.labels,
            label_mode=prepared.label_mode,
            num_classes=prepared.num_classes,
            regions=prepared.regions,
            splits=CaseSplits.of_manifest(info),
        )


class PreparedInfo(BaseModel):
    """The structure of ``info.json``."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["distmis-prepared/2"]
    source: SourceRecord
    shape: tuple[int, int, int]
    channels: int = Field(ge=1)
    modalities: list[StrictStr]
    labels: dict[str, StrictStr]
    label_mode: Literal["binary", "multiclass", "regions"]
    regions: dict[str, list[int]] | None = None
    num_classes: int = Field(ge=1)
    image_dtype: Literal["float32"] = "float32"
    label_dtype: Literal["uint8"] = "uint8"
    preprocessing: Preprocessing
    split: dict[str, Any] = {}
    splits: dict[Literal["train", "val", "test"], SplitRecord]
    cases: dict[StrictStr, CaseRecord]
    fingerprint: dict[str, Any] | None = None
    fold: dict[str, int] | None = None  # set on a cross-validation fold's view, never on disk


@dataclass(frozen=True)
class Manifest:
    """A prepared directory and its checked record (``info`` is the record as a dict)."""

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

    def cases(self, split: str) -> list[str]:
        return list(self.info["splits"].get(split, {}).get("cases", []))

    def num_cases(self, split: str) -> int:
        return len(self.cases(split))

    def case_files(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Case id -> its files (``image``, ``label``, ``foreground``), as the reader wants them."""
        return {cid: record["files"] for cid, record in self.info["cases"].items()}


def reprepare_command(info: dict[str, Any], root: Path) -> str:
    """The ``distmis prepare`` command that makes ``root`` again from its recorded source and options."""
    source = (info.get("source") or {}).get("path", "SRC")
    pre = info.get("preprocessing") or {}
    words = ["distmis", "prepare", str(source), str(root), "--overwrite"]
    if isinstance(pre.get("shape"), list):
        words += ["--shape", ",".join(str(s) for s in pre["shape"])]
    if pre.get("resize"):
        words += ["--resize", str(pre["resize"])]
    if info.get("label_mode"):
        words += ["--label-mode", str(info["label_mode"])]
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
    if found in OLD_FORMATS:
        raise DataError(
            f"{path}: prepared by an older distmis (format {found!r}); this version reads {FORMAT!r}, "
            f"which reads patches on demand. Prepare it again: {reprepare_command(info, root)}"
        )
    if found != FORMAT:
        raise DataError(f"{path}: format {found!r}, expected {FORMAT!r} (written by distmis prepare)")
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
    return Manifest(root=root, info=checked.model_dump(mode="json"))


__all__ = [
    "FORMAT",
    "OLD_FORMATS",
    "SPLITS",
    "CaseRecord",
    "ChannelNormalisation",
    "ModelPreprocessing",
    "Preprocessing",
    "Manifest",
    "PreparedInfo",
    "load_manifest",
    "reprepare_command",
]
