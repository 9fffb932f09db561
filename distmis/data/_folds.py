"""Cross-validation folds of a prepared dataset: a view of its records, nothing copied.

The folds split the *training and validation* cases (the test split is never touched): sorted
case ids, shuffled by the fold seed, dealt round-robin into ``folds`` groups, so the folds are
disjoint, cover every train + validation case, differ in size by at most one, and are the same
for the same ids, count and seed. Fold ``i`` validates on group ``i`` and trains on the others.

A fold is a :class:`~distmis.data.Manifest` whose ``train`` and ``val`` splits list its case
ids; every case is its own file, so the loader reads them where they are. Preparing each fold
again would copy the dataset ``folds`` times.
"""

from __future__ import annotations

import numpy as np

from distmis.data._record import Manifest, SplitRecord
from distmis.exceptions import DataError

CV_SPLITS = ("train", "val")


def cv_cases(manifest: Manifest) -> list[str]:
    """Every case cross-validation may use: the train and validation splits, sorted."""
    return sorted(c for split in CV_SPLITS for c in manifest.cases(split))


def fold_groups(case_ids: list[str], folds: int, seed: int) -> list[list[str]]:
    """The validation cases of every fold (see the module docstring).

    Raises:
        DataError: fewer cases than folds.
    """
    ids = sorted(case_ids)
    if folds < 2:
        raise DataError(f"--folds {folds}: cross-validation needs at least 2 folds")
    if folds > len(ids):
        raise DataError(
            f"--folds {folds}: the training and validation splits hold {len(ids)} case(s); each fold needs at "
            "least one validation case"
        )
    order = np.random.default_rng(seed).permutation(len(ids))
    shuffled = [ids[i] for i in order]
    return [sorted(shuffled[i::folds]) for i in range(folds)]


def fold_view(manifest: Manifest, index: int, folds: int, seed: int) -> Manifest:
    """The dataset as fold ``index`` of ``folds`` sees it: its group validates, the rest trains."""
    groups = fold_groups(cv_cases(manifest), folds, seed)
    if not 0 <= index < folds:
        raise DataError(f"data.fold.index {index}: expected 0..{folds - 1}")
    val = groups[index]
    train = sorted(c for i, g in enumerate(groups) if i != index for c in g)
    splits = {**manifest.info.splits}
    for name, cases in (("train", train), ("val", val)):
        splits[name] = SplitRecord(cases=cases, num_cases=len(cases))  # type: ignore[index]
    fold = {"index": index, "folds": folds, "seed": seed}
    return Manifest(root=manifest.root, info=manifest.info.model_copy(update={"splits": splits, "fold": fold}))


def label_presence(manifest: Manifest, cases: list[str]) -> dict[str, set[int]]:
    """The label values present in each of ``cases`` (recorded by prepare; region and binary data
    keep their label values too), background included."""
    records = manifest.info.cases
    missing = sorted(set(cases) - set(records))
    if missing:
        raise DataError(f"{manifest.root}: cases {missing[:5]} are not in its info.json")
    return {case: {0, *records[case].label_values} for case in cases}


__all__ = ["CV_SPLITS", "cv_cases", "fold_groups", "fold_view", "label_presence"]
