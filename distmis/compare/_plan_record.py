"""``compare.json``: the comparison a ``--resume`` continues, written and read through one model.

A resumed comparison runs exactly what the interrupted one planned, so its plan is read before
anything runs; one cut short or edited by hand is one error naming the file and the field, where
a bare dictionary gave a ``KeyError`` traceback.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModePlanRecord(_Record):
    """How one mode runs the configurations."""

    name: str
    trials_at_once: int = Field(ge=1)
    workers_per_trial: int = Field(ge=1)
    configurations: int = Field(ge=0)


class CompareTracking(_Record):
    """The comparison's MLflow run, reattached on ``--resume``."""

    tracking_uri: str
    experiment: str
    run_id: str


class CompareRecord(_Record):
    """``compare.json``: the options the comparison was planned with, its configurations and modes."""

    name: str
    space_file: str
    modes: list[str] = Field(min_length=1)
    slots: int = Field(ge=1)
    cpus_per_worker: float = Field(gt=0)
    gpus_per_worker: float = Field(ge=0)
    hybrid_workers: int | None
    baseline_trials: int = Field(ge=0)
    target: float | None
    #: the fixed configurations every mode runs
    points: list[dict[str, Any]] = Field(min_length=1)
    lr_scaling: str = "none"
    plans: list[ModePlanRecord]
    mlflow: CompareTracking


__all__ = ["CompareRecord", "CompareTracking", "ModePlanRecord"]
