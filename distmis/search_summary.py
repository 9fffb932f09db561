"""A finished search's ``summary.json``: what ``distmis tune`` writes, and ``finalize``, ``compare`` and
``simulate`` read back.

One typed model owns the file, so that its writer and its three readers cannot drift apart, and a
summary that was cut short or edited by hand is one error naming the file and the field, where a
reader of a bare dictionary would fail with a ``KeyError`` or, worse, read a missing value as 0.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from distmis.documents import load_json_document
from distmis.exceptions import DistmisError
from distmis.schema import RunFile


class _Record(BaseModel):
    # a summary written by a newer distmis may carry fields this one does not know
    model_config = ConfigDict(extra="ignore")


class TrialRow(_Record):
    """One trial of a search: its parameters, its final and best metrics, and where its time went."""

    trial_id: str
    #: TERMINATED or ERROR
    status: str
    params: dict[str, Any]
    epochs: int = Field(ge=0)
    stopped_early: bool
    final: dict[str, float]
    #: the metrics of its best epoch (``epoch`` among them); empty when it never reported
    best: dict[str, float]
    started_at: float | None
    finished_at: float | None
    error: str | None = None
    node_ip: str | None = None
    #: the slot's cold start (its process, or its worker group); once per slot, a warm trial reuses it
    group_startup_seconds: float | None = None
    #: ran on a slot that had already run a trial
    warm: bool | None = None
    #: first epoch's end - trial start - the first epoch's own time
    overhead_seconds: float | None = None
    pid: int | None = None

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


class SearchSummary(_Record):
    """A search's counts, best trial and wall time: what ``tune`` prints and logs to MLflow."""

    name: str
    out: str
    metric: str
    mode: Literal["min", "max"]
    wall_seconds: float
    trials: int = Field(ge=0)
    finished: int = Field(ge=0)
    stopped_early: int = Field(ge=0)
    failed: int = Field(ge=0)
    max_concurrent_observed: int = Field(ge=0)
    best_trial_id: str | None = None
    best_value: float | None = None
    best_params: dict[str, Any] = Field(default_factory=dict)
    #: Unix time the search command started (resume: the resumed one)
    started_at: float | None = None
    #: stopped on request before the end; ``--resume`` continues it
    interrupted: bool = False
    #: trials whose set-up ended and whose first epoch began: with no epoch reported, it tells a budget
    #: that set-up alone outlasted from one that a first epoch outlasted (None: not counted)
    began_training: int | None = Field(default=None, ge=0)

    @classmethod
    def interrupted_search(
        cls, *, name: str, metric: str, mode: Literal["min", "max"], out: Path, started_at: float
    ) -> SearchSummary:
        """The summary of a search stopped on request (``--resume`` continues it)."""
        return cls(
            name=name,
            out=str(out),
            metric=metric,
            mode=mode,
            wall_seconds=time.time() - started_at,
            trials=0,
            finished=0,
            stopped_early=0,
            failed=0,
            max_concurrent_observed=0,
            started_at=started_at,
            interrupted=True,
        )

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.best_trial_id is not None

    def description(self) -> str:
        """A short summary for the MLflow run's description (Markdown)."""
        best = (
            f"Best trial **{self.best_trial_id}**: {self.metric} = {self.best_value:.4f} with "
            f"{json.dumps(self.best_params)}."
            if self.best_trial_id and self.best_value is not None
            else "No trial reached a value."
        )
        return (
            f"{best}\n\n{self.trials} trials: {self.finished} finished, {self.stopped_early} stopped early, "
            f"{self.failed} failed; wall time {self.wall_seconds:.0f} s. Files: `{self.out}`."
        )

    def print(self, *, time_budget: str | None = None) -> None:
        """The summary table, and one ``distmis:`` line saying why there is no best model when there is
        none; ``time_budget`` is the search's ``search.time_budget`` when it stopped the search."""
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"distmis search '{self.name}'", show_header=False)
        table.add_row(
            "best trial", f"{self.best_trial_id}  {self.metric}={self.best_value:.4f}" if self.best_trial_id else "none"
        )
        table.add_row("best params", json.dumps(self.best_params))
        table.add_row(
            "trials",
            f"{self.trials}: {self.finished} finished, {self.stopped_early} stopped early, {self.failed} failed",
        )
        table.add_row("wall time", f"{self.wall_seconds:.1f} s")
        table.add_row("max concurrent trials seen", str(self.max_concurrent_observed))
        table.add_row("results", f"{self.out}/results.csv" + (", best.yaml, best/" if self.best_trial_id else ""))
        Console().print(table)
        if self.best_trial_id is None:
            print(self._no_best_model(time_budget), flush=True)

    def _no_best_model(self, time_budget: str | None) -> str:
        """Why a search ended without a best model, and what to change: a search that runs out of time
        before any trial ends an epoch looks, in the table alone, like one that never ran."""
        results = f"{self.out}/results.csv"
        if self.trials and self.failed == self.trials:
            return (
                f"distmis: every trial failed ({self.failed} of {self.trials}): no best model; the error column of "
                f"{results} says why"
            )
        failed = (
            f" ({self.failed} of {self.trials} failed: the error column of {results} says why)" if self.failed else ""
        )
        if time_budget is not None:
            said = f"distmis: no trial reported {self.metric} inside search.time_budget {time_budget}{failed}: no best model; "
            longer = "start a new search with a longer search.time_budget (distmis init --budget plans one)"
            if self.began_training == 0:
                # shorter epochs cannot help a search whose trials were still starting at its deadline
                return (
                    f"{said}no trial's set-up (its process, the data, the model) ended inside it either, so fewer "
                    f"train.steps_per_epoch would not help: {longer}"
                )
            return f"{said}{longer} or fewer train.steps_per_epoch, so that a trial's first epoch ends inside it"
        return (
            f"distmis: no trial reported {self.metric}{failed}: no best model; the epochs column of {results} says "
            "how far each got"
        )


class SearchSummaryFile(SearchSummary):
    """``summary.json`` itself: the summary, the prepared data the search ran on, and every trial."""

    prepared: str
    trials_detail: list[TrialRow]


def read_search_summary(search: Path, *, error: type[DistmisError]) -> SearchSummaryFile:
    """The ``summary.json`` of the finished search in ``search``.

    Raises:
        error: the file is missing, not JSON, or not a summary ``distmis tune`` wrote, naming the file
            and the first field that is wrong.
    """
    return load_json_document(SearchSummaryFile, search / RunFile.SUMMARY, error=error, what="a search's summary")


__all__ = ["SearchSummary", "SearchSummaryFile", "TrialRow", "read_search_summary"]
