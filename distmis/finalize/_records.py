"""What a finalize records for a later command: its plan (``finalize.json``, read back by
``--resume``) and its choice (``final/selection.json``, read back to tell its own model from an
earlier one).

Each file is written and read through one model, so a plan torn by a kill or edited by hand is one
error naming the file and the field before a fold trains, not a ``KeyError`` after one has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from distmis.data import CaseSplits
from distmis.documents import read_json
from distmis.exceptions import DistmisError
from distmis.schema import RunFile


class Candidate(BaseModel):
    """A configuration of the search: its rank by the search metric, its parameters, its value there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0)
    trial_id: str
    params: dict[str, Any]
    search_value: float

    @property
    def name(self) -> str:
        return f"c{self.rank}"


class FinalizeRecord(BaseModel):
    """``finalize.json``: the choices a resumed finalize must keep, and the folds it trains."""

    model_config = ConfigDict(extra="forbid")

    run: str
    #: the data's splits as the finalize saw them (checked against the search's)
    splits: CaseSplits | None
    candidates: list[Candidate] = Field(min_length=1)
    folds: int = Field(ge=2)
    seed: int
    #: the validation cases of each fold
    groups: list[list[str]]
    tta: bool
    pairs: bool
    postprocess: bool


class SelectionMember(BaseModel):
    model_config = ConfigDict(extra="forbid")

    configuration: str
    trial_id: str
    params: dict[str, Any]


class SelectionRecord(BaseModel):
    """``final/selection.json``: what cross-validation chose and why."""

    model_config = ConfigDict(extra="forbid")

    search: str
    #: the finalize directory that wrote this model
    finalize: str
    folds: int
    fold_seed: int
    members: list[SelectionMember]
    #: metric -> {"folds": [...], "mean", "std"} of the choice
    cv: dict[str, dict[str, Any]]
    #: "c0+c1" -> the CV mean Dice of that pair
    pairs_tried: dict[str, float]
    #: mask -> the CV Dice with the post-processing minus without
    postprocess_gain: dict[str, float]
    candidates: list[Candidate]


def read_selection(final: Path) -> SelectionRecord | None:
    """``final/selection.json``, or None where there is none or it is not one a finalize wrote (then the
    directory is treated as another's model: replaced only with ``--overwrite``)."""
    path = final / RunFile.SELECTION
    if path.is_symlink() or not path.is_file():  # a link or a FIFO there is not a record a finalize wrote
        return None
    try:
        return SelectionRecord.model_validate(read_json(path, error=DistmisError))
    except (DistmisError, ValidationError):
        return None


__all__ = [
    "Candidate",
    "FinalizeRecord",
    "SelectionMember",
    "SelectionRecord",
    "read_selection",
]
