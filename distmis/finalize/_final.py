"""``RUN/final/``: the model a finalize hands over, accepted by ``predict`` and ``evaluate`` as ``best/`` is.

It is self-describing::

    ensemble.json       the members, the post-processing, mirroring at prediction (format distmis-ensemble/1)
    selection.json      what cross-validation chose and why (the CV table of the choice, the pairs tried)
    config.yaml         the chosen configuration (its first member's)
    preprocessing.json  what prediction redoes to a raw scan (the same for every member)
    members/<c>-fold<i>/ each fold model as training wrote it: config.yaml, weights.npz, preprocessing.json

Written into a temporary sibling and renamed into place (an earlier ``final/`` is replaced only if
distmis wrote it).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from distmis.files import atomic_directory, write_json_atomic
from distmis.finalize._cv import Selection
from distmis.finalize._plan import FinalizePlan
from distmis.finalize._records import SelectionMember, SelectionRecord
from distmis.schema import RunFile


def write_final(plan: FinalizePlan, selection: Selection, fold_models: dict[tuple[str, int], Path]) -> Path:
    """Write ``plan.final`` from the chosen configurations' fold models."""
    from distmis.inference import read_model_record

    members = [(name, fold) for name in selection.members for fold in range(plan.folds)]
    with atomic_directory(plan.final, command="finalize", overwrite=True, option="final/") as tmp:
        names = []
        for name, fold in members:
            target = tmp / "members" / f"{name}-fold{fold}"
            shutil.copytree(fold_models[(name, fold)], target)
            (target / ".distmis-output").unlink(missing_ok=True)  # part of final/, not an output of its own
            names.append(str(target.relative_to(tmp)))
        first = tmp / names[0]
        for shared in (RunFile.CONFIG, RunFile.PREPROCESSING):
            shutil.copy2(first / shared, tmp / shared)
        write_json_atomic(
            tmp / RunFile.ENSEMBLE,
            {
                "format": "distmis-ensemble/1",
                "members": names,
                "tta": plan.tta,
                "largest_component": [{"name": n, "values": list(v)} for n, v in selection.largest_component],
            },
        )
        write_json_atomic(tmp / RunFile.SELECTION, selection_record(plan, selection))
        read_model_record(tmp)  # what predict will read: checked before it is handed over
    return plan.final


def selection_record(plan: FinalizePlan, selection: Selection) -> dict[str, Any]:
    """``final/selection.json`` (:class:`SelectionRecord`)."""
    by_name = {c.name: c for c in plan.candidates}
    return SelectionRecord(
        search=str(plan.run),
        finalize=str(plan.out),
        folds=plan.folds,
        fold_seed=plan.seed,
        members=[
            SelectionMember(configuration=name, trial_id=by_name[name].trial_id, params=by_name[name].params)
            for name in selection.members
        ],
        cv=selection.cv,
        pairs_tried=selection.pair_cv,
        postprocess_gain=selection.postprocess_gain,
        candidates=plan.candidates,
    ).model_dump()


__all__ = ["selection_record", "write_final"]
