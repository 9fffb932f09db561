"""``cases/ID.done.json``: what an interrupted prepare keeps of each case it finished, so that
``prepare --resume`` takes the case over instead of making it again.

It is written last, after the case's arrays and its fingerprint samples (``ID.samples.npy``), so its
presence means they are whole; it is read back through :class:`FinishedCase`, and a record that does
not validate is a case to make again, never an error: it is prepare's own scratch, not a user's file.
Prepare removes both files once ``info.json`` is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from distmis.data._cases import CASES_DIR
from distmis.data._record import CaseRecord


def done_file(work: Path, case_id: str) -> Path:
    return work / CASES_DIR / f"{case_id}.done.json"


def samples_file(work: Path, case_id: str) -> Path:
    """The case's sampled foreground intensities, kept in binary: the fingerprint's percentiles."""
    return work / CASES_DIR / f"{case_id}.samples.npy"


class CaseStats(BaseModel):
    """What the dataset fingerprint needs of one case (:func:`distmis.data._inspect.case_stats`),
    less its intensity samples, which are in :func:`samples_file`."""

    model_config = ConfigDict(extra="forbid")
    case_id: StrictStr
    shape: list[int]
    spacing: list[float]
    orientation: StrictStr
    voxels: int
    label_voxels: dict[int, int]  # JSON writes the label values as strings; they are counted by value


class FinishedCase(BaseModel):
    """One finished case: its record in ``info.json``, the warnings its content raised, its
    statistics, and the identity of the source files it was made from (:func:`source_stamp`)."""

    model_config = ConfigDict(extra="forbid")
    record: CaseRecord
    warnings: list[StrictStr]
    stats: CaseStats
    source: list[tuple[StrictStr, int, int, int]]

    def fingerprint_stats(self, samples: list[np.ndarray]) -> dict[str, Any]:
        """The statistics as :func:`distmis.data._inspect.aggregate` takes them, samples included."""
        return {**self.stats.model_dump(), "samples": samples}


def source_stamp(paths: list[Path]) -> list[tuple[str, int, int, int]]:
    """The identity of a case's source files (path, size, modification time, inode): a resumed
    prepare makes the case again when its source changed after it was first made."""
    stamp = []
    for path in paths:
        st = Path(path).stat()
        stamp.append((str(path), st.st_size, st.st_mtime_ns, st.st_ino))
    return stamp


def read_finished(work: Path, case_id: str) -> FinishedCase | None:
    """The case's record, or None where there is none or it is not whole (a kill while it was written
    leaves only a temporary sibling, but a record edited by hand must not be trusted either)."""
    from distmis.links import read_regular_text

    try:
        return FinishedCase.model_validate_json(read_regular_text(done_file(work, case_id), follow_links=False))
    except (OSError, ValueError, ValidationError):
        return None
