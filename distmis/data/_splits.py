"""Which cases a search, and every model it makes, trained, selected and tested on: fixed when it starts.

``prepare --overwrite`` with another split, then ``finalize`` or ``evaluate`` of an earlier search,
would train folds on the search's old test cases and call its old validation cases the test split,
without a word: the one untouched test score distmis promises would be gone. So a search records its
case ids (``splits.json``), every model records those of its own training (``preprocessing.json``),
and a command that reads prepared data for them compares, naming the cases that moved.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from distmis.exceptions import DataError

SPLITS_FILE = "splits.json"
SPLITS = ("train", "val", "test")


class CaseSplits(BaseModel):
    """The case ids of each split (as ``info.json`` lists them)."""

    model_config = ConfigDict(extra="ignore")
    train: list[str] = []
    val: list[str] = []
    test: list[str] = []

    def split_of(self) -> dict[str, str]:
        return {case: name for name in SPLITS for case in getattr(self, name)}

    def pooled(self) -> dict[str, str]:
        """Each case's part as cross-validation sees it: ``test``, or ``train+val`` (the folds' pool)."""
        return {case: "test" if name == "test" else "train+val" for case, name in self.split_of().items()}

    def moved(self, now: CaseSplits, *, pooled: bool = False) -> list[str]:
        """How each case that is not where it was moved: ``SYNTH_004 test -> train``. ``pooled``:
        only moves between the test split and the train+val pool count (a fold model's own train and
        val are a fold of that pool)."""
        before, after = (self.pooled(), now.pooled()) if pooled else (self.split_of(), now.split_of())
        return [
            f"{case} {before.get(case, 'absent')} -> {after.get(case, 'absent')}"
            for case in sorted(set(before) | set(after))
            if before.get(case) != after.get(case)
        ]


def check_same_splits(
    recorded: CaseSplits, now: CaseSplits, *, recorded_in: str, data: Path | str, pooled: bool = False
) -> None:
    """Refuse prepared data whose splits are not those recorded when the search or model was made
    (``pooled``: see :meth:`CaseSplits.moved`).

    Raises:
        DataError: naming the data, the record and the first cases that moved.
    """
    moved = recorded.moved(now, pooled=pooled)
    if not moved:
        return
    shown = ", ".join(moved[:5]) + (f" and {len(moved) - 5} more" if len(moved) > 5 else "")
    raise DataError(
        f"{data}: its splits are not those of {recorded_in} ({shown}); its test cases would no longer be untouched. "
        "Use the data it was made on (prepare it again with the same --split and --seed into another directory), "
        "or start a new search"
    )


def read_search_splits(run: Path) -> CaseSplits | None:
    """The splits a search recorded when it started (``None``: a search from before they were)."""
    from distmis.documents import load_json_document

    path = Path(run) / SPLITS_FILE
    if not path.is_file():
        return None
    return load_json_document(CaseSplits, path, error=DataError, what="a search's case splits")


__all__ = ["SPLITS_FILE", "CaseSplits", "check_same_splits", "read_search_splits"]
