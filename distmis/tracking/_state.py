"""The record an output keeps of its MLflow runs (``<out>/mlflow.json``), as one typed model.

A search writes it, and four other commands read it: ``--resume`` reattaches to the same runs,
``finalize`` and ``evaluate`` nest their runs under the search's, and ``compare`` tags each mode's
search. Reading it through one model means a hand-edited or truncated file is one clear error for
every reader, never a ``KeyError`` deep inside one of them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from distmis.documents import load_json_document
from distmis.exceptions import TrackingError
from distmis.schema import RunFile


class TrackedTrial(BaseModel):
    """One trial's child run: its id once created, the last epoch logged, and whether it is closed."""

    model_config = ConfigDict(extra="allow")

    run_id: str | None = None
    last_step: int = 0
    finished: bool = False


class TrackingState(BaseModel):
    """Where an output's own run is (store, experiment, run) and the runs of its trials.

    The address is stored without credentials: whoever reattaches gives them again.
    """

    model_config = ConfigDict(extra="allow")

    tracking_uri: str | None = None
    experiment: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    trials: dict[str, TrackedTrial] = {}

    @property
    def has_run(self) -> bool:
        """Whether the output's own run was created (a search that never reached MLflow has none)."""
        return bool(self.tracking_uri and self.experiment_id and self.parent_run_id)

    def trial_run_id(self, trial: str) -> str | None:
        """The child run of ``trial``, if it was created."""
        record = self.trials.get(trial)
        return record.run_id if record else None


def read_tracking_state(out: Path) -> TrackingState | None:
    """The tracking record in the output directory ``out``; ``None`` when there is none.

    Raises:
        TrackingError: the file exists but is not a record distmis wrote (unreadable, not JSON,
            or fields of the wrong type), naming the file.
    """
    path = out / RunFile.MLFLOW_STATE
    if not path.is_file():
        return None
    return load_json_document(TrackingState, path, error=TrackingError, what="distmis's record of its MLflow runs")


__all__ = ["TrackedTrial", "TrackingState", "read_tracking_state"]
