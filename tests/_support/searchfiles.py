"""What a finished search leaves, written without running one: for tests of the commands that read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distmis.search_summary import SearchSummaryFile, TrialRow


def finished_trial(trial_id: str, params: dict[str, Any], best: dict[str, float], **fields: Any) -> TrialRow:
    """A trial that ran to its end: one epoch, its best metrics ``best``."""
    values: dict[str, Any] = {
        "status": "TERMINATED",
        "epochs": 1,
        "stopped_early": False,
        "final": best,
        "started_at": 0.0,
        "finished_at": 1.0,
    }
    return TrialRow(trial_id=trial_id, params=params, best=best, **{**values, **fields})


def write_summary(run: Path, prepared: Path, trials: list[TrialRow], *, metric: str = "val_dice") -> None:
    """``run/summary.json`` as ``distmis tune`` writes it, for a search on ``prepared`` with ``trials``."""
    best = max((t for t in trials if metric in t.best), key=lambda t: t.best[metric], default=None)
    record = SearchSummaryFile(
        name=run.name,
        out=str(run),
        metric=metric,
        mode="max",
        wall_seconds=1.0,
        trials=len(trials),
        finished=sum(t.status == "TERMINATED" for t in trials),
        stopped_early=0,
        failed=sum(t.status == "ERROR" for t in trials),
        max_concurrent_observed=1 if trials else 0,
        best_trial_id=best.trial_id if best else None,
        best_value=best.best[metric] if best else None,
        best_params=best.params if best else {},
        prepared=str(prepared),
        trials_detail=trials,
    )
    (run / "summary.json").write_text(json.dumps(record.model_dump(), indent=2) + "\n")
