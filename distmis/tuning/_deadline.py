"""``search.time_budget``: a search's deadline, counted over every run of it.

Ray Tune's own ``time_budget_s`` starts afresh when a search is restored, so a search killed after
25 of its 30 minutes would get 30 more on ``--resume``. This stopper (Ray Tune's public ``Stopper``)
keeps the seconds already spent in the search directory (:attr:`RunFile.TIME_SPENT`) and adds the
current run's: once the sum reaches the budget, Tune stops every running trial (their results so
far are kept, and the best of them is the search's best) and starts no new one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray.tune import Stopper

from distmis.documents import load_json_document
from distmis.exceptions import TuningError
from distmis.files import write_json_atomic
from distmis.schema import RunFile

#: how often the spent seconds are written while the search runs (a kill loses at most this)
WRITE_EVERY_SECONDS = 5.0
#: an epoch must end this long before the deadline for a trial to keep it, so that its report
#: normally reaches Tune before Tune stops the search (checked every 0.1 s). A slower report (a
#: loaded machine) is dropped by Tune; the search's records then take that epoch from the trial's
#: own metrics.csv (:func:`distmis.tuning._results.unreported_epochs`), so they still name the
#: weights in its best/ whatever the delay: the margin saves work, correctness does not rest on it
REPORT_MARGIN_SECONDS = 2.0


class TimeSpent(BaseModel):
    """``time_spent.json``: the seconds the search's earlier runs spent, against its budget."""

    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(ge=0, allow_inf_nan=False)
    budget_seconds: float = Field(gt=0)


def time_spent(out: Path) -> float:
    """The seconds a search in ``out`` has spent in its earlier runs (0 for a new one).

    Raises:
        TuningError: the record is there but damaged or edited: read as 0, a resumed search would be
            given its whole budget again, so it is refused naming the file instead.
    """
    path = out / RunFile.TIME_SPENT
    if not os.path.lexists(path):
        return 0.0
    remedy = "remove it to give the resumed search its whole search.time_budget again"
    if path.is_symlink() or not path.is_file():
        raise TuningError(f"{path}: not a regular file; distmis keeps the search's spent seconds there: {remedy}")
    try:
        return load_json_document(TimeSpent, path, error=TuningError, what="the seconds the search has spent").seconds
    except TuningError as exc:
        raise TuningError(f"{exc}; {remedy}") from None


class SearchDeadline(Stopper):
    """Stops the whole search once ``budget_seconds`` of wall time are spent over all its runs.

    Args:
        budget_seconds: ``search.time_budget`` in seconds.
        out: the search directory (where the spent seconds are kept).
        started: when this run of the command started (``time.time()``): set-up counts too.
    """

    def __init__(self, budget_seconds: float, out: Path, started: float) -> None:
        self.budget_seconds = float(budget_seconds)
        self.out = Path(out)
        self._begin(started)

    def _begin(self, started: float) -> None:
        self.before = time_spent(self.out)
        self.started = started
        self.last_write = 0.0
        self.reached = False

    def spent(self) -> float:
        return self.before + max(0.0, time.time() - self.started)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False  # no single trial is stopped for its own sake: stop_all stops them together

    def stop_all(self) -> bool:
        spent = self.spent()
        if time.monotonic() - self.last_write >= WRITE_EVERY_SECONDS:
            self.record()
        if spent >= self.budget_seconds and not self.reached:
            self.reached = True
            self.record()
        return self.reached

    def record(self) -> None:
        """Write the seconds spent so far (the command also calls it at its end)."""
        record = TimeSpent(seconds=round(self.spent(), 3), budget_seconds=self.budget_seconds)
        write_json_atomic(self.out / RunFile.TIME_SPENT, record.model_dump())
        self.last_write = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        return {"budget_seconds": self.budget_seconds, "out": str(self.out)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # restored by Tuner.restore on --resume: this run starts now, after what is recorded
        self.budget_seconds = float(state["budget_seconds"])
        self.out = Path(state["out"])
        self._begin(time.time())


def epochs_kept_until(out: Path, budget_seconds: float | None, started: float) -> float | None:
    """The Unix time by which a trial's epoch must end to be kept (``None``: no budget).

    It is this run's share of the budget, counted from ``started`` after what earlier runs spent
    (as :class:`SearchDeadline` counts it), less :data:`REPORT_MARGIN_SECONDS`. Why the trials need
    it: Tune stops a trial only once its epoch in progress has ended, and drops that epoch's
    report; an epoch that ends after the deadline was trained on time the search did not have.
    """
    if budget_seconds is None:
        return None
    return started + budget_seconds - time_spent(out) - REPORT_MARGIN_SECONDS


def deadline_reached(out: Path, budget_seconds: float | None) -> bool:
    """Whether the search in ``out`` has spent its budget (what makes unstarted trials not an interruption)."""
    return budget_seconds is not None and time_spent(out) >= budget_seconds


__all__ = ["REPORT_MARGIN_SECONDS", "SearchDeadline", "deadline_reached", "epochs_kept_until", "time_spent"]
