"""The live view of a search: one row per running trial, counts, the best so far, time left.

A Tune callback in the driver (it sees every result, whatever the trial's worker count) that
renders with ``rich``. On a terminal the view refreshes in place; elsewhere (a pipe, a SLURM
log, ``distmis compare``'s prefixed output) nothing refreshes and only one line per ended trial
is written, then the final view.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ray.tune import Callback

from distmis.metrics import FAILURE

#: names a trial from its Tune config (``c0/fold1`` for a finalize's); ``None``: Tune's trial id
TrialLabel = Callable[[dict[str, Any]], str]


class LiveProgress(Callback):
    def __init__(
        self,
        *,
        name: str,
        metric: str,
        mode: str,
        epochs: int,
        trials: int | None,
        concurrency: int,
        label: TrialLabel | None = None,
    ) -> None:
        self.name, self.metric, self.mode, self.epochs = name, metric, mode, epochs
        self.trials, self.concurrency, self.label = trials, concurrency, label
        self._reset()

    def _reset(self) -> None:
        self._live: Any = None
        self._console: Any = None
        self._started = time.time()
        self._names: dict[str, str] = {}  # trial id -> what the view calls it
        self._running: dict[str, dict[str, Any]] = {}
        self._ended: dict[str, str] = {}  # trial id -> finished | stopped | failed
        self._best_of: dict[str, tuple[float, int]] = {}  # trial -> its best value and epoch; failed ones dropped
        self._epoch_seconds: list[float] = []

    # Tune pickles callbacks into its experiment state; the view is rebuilt where it is needed
    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("name", "metric", "mode", "epochs", "trials", "concurrency", "label")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # ------------------------------------------------------------------ Tune hooks
    def setup(self, **info: Any) -> None:
        from rich.live import Live

        from distmis.console import console

        self._reset()
        self._console = console()
        if self._console.is_terminal:  # elsewhere: a line per ended trial, and the view at the end
            self._live = Live(
                self.render(), console=self._console, refresh_per_second=2, transient=False, get_renderable=self.render
            )
            self._live.start()

    def _name(self, trial: Any) -> str:
        if trial.trial_id not in self._names:
            self._names[trial.trial_id] = self.label(trial.config or {}) if self.label else trial.trial_id
        return self._names[trial.trial_id]

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._name(trial)
        self._running.setdefault(trial.trial_id, {"epoch": 0, "value": None, "best": None})

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        row = self._running.setdefault(trial.trial_id, {"epoch": 0, "value": None, "best": None})
        epoch, value = int(result.get("epoch", 0) or 0), result.get(self.metric)
        if epoch <= 0 or value is None or (isinstance(value, float) and math.isnan(value)):
            return
        row.update(epoch=epoch, value=float(value))
        if result.get(FAILURE):  # a diverged epoch's score is no score
            return
        if row["best"] is None or self._better(float(value), row["best"]):
            row["best"] = float(value)
            self._best_of[trial.trial_id] = (float(value), epoch)
        if result.get("epoch_seconds"):
            self._epoch_seconds.append(float(result["epoch_seconds"]))
        self._refresh()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        if last.get(FAILURE):
            self._end(trial, "failed", str(last[FAILURE]))
        else:
            epochs = int(last.get("epoch", 0) or 0)
            self._end(trial, "finished" if epochs >= self.epochs else "stopped", None)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(trial, "failed", str(getattr(trial, "error_file", "") or ""))

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ the view
    def _better(self, a: float, b: float) -> bool:
        return a > b if self.mode == "max" else a < b

    def _leader(self) -> tuple[float, str, int] | None:
        if not self._best_of:
            return None
        pick = max if self.mode == "max" else min
        trial_id = pick(self._best_of, key=lambda t: self._best_of[t][0])
        value, epoch = self._best_of[trial_id]
        return value, trial_id, epoch

    def _end(self, trial: Any, how: str, reason: str | None) -> None:
        row = self._running.pop(trial.trial_id, {})
        self._ended[trial.trial_id] = how
        best = row.get("best")
        if how == "failed":  # a failed trial is never the best, whatever it scored before it failed
            self._best_of.pop(trial.trial_id, None)
            best = None
        text = (
            f"trial {self._name(trial)} {how}"
            + (f" after epoch {row.get('epoch', 0)}" if how == "stopped" else "")
            + (f": best {self.metric} {best:.4f}" if best is not None else "")
            + (f" ({reason})" if reason else "")
        )
        if self._live is None and self._console is not None:
            self._console.print(text, markup=False, highlight=False)
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def counts(self) -> dict[str, int]:
        return {how: sum(1 for v in self._ended.values() if v == how) for how in ("finished", "stopped", "failed")}

    def remaining_seconds(self) -> float | None:
        """Epochs left (running trials' and not-started trials') x mean epoch time / concurrency."""
        if not self._epoch_seconds or self.trials is None:
            return None
        left = sum(self.epochs - r["epoch"] for r in self._running.values())
        left += max(0, self.trials - len(self._ended) - len(self._running)) * self.epochs
        return left * (sum(self._epoch_seconds) / len(self._epoch_seconds)) / max(1, self.concurrency)

    def render(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        c = self.counts()
        elapsed = time.time() - self._started
        left = self.remaining_seconds()
        total = f"/{self.trials}" if self.trials else ""
        title = (
            f"{self.name}: {len(self._ended)}{total} trials done ({c['finished']} finished, {c['stopped']} "
            f"stopped early, {c['failed']} failed), {len(self._running)} running - {elapsed:.0f} s"
            + (f", about {left:.0f} s left" if left is not None and self._running else "")
        )
        table = Table(expand=False)
        for column in ("trial", "epoch", self.metric, f"best {self.metric}"):
            table.add_column(column, justify="right")
        for trial_id, row in sorted(self._running.items(), key=lambda item: self._names.get(item[0], item[0])):
            fmt = lambda v: "-" if v is None else f"{v:.4f}"
            table.add_row(
                self._names.get(trial_id, trial_id),
                f"{row['epoch']}/{self.epochs}",
                fmt(row["value"]),
                fmt(row["best"]),
            )
        leader = self._leader()
        if leader is not None:
            value, trial_id, epoch = leader
            best = Text(
                f"best so far: trial {self._names.get(trial_id, trial_id)}, {self.metric} {value:.4f} at epoch {epoch}"
            )
        else:
            best = Text("best so far: -")
        if not self._running:  # nothing running (the end): no empty table
            return Group(Text(title), best)
        return Group(Text(title), table, best)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif self._console is not None:
            self._console.print(self.render())
        if self._console is not None:
            self._console.file.flush()
            self._console = None


__all__ = ["LiveProgress"]
