"""What a finished search leaves behind: results.csv, best.yaml, best/, summary.json, a printed summary."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distmis.config import ExperimentConfig, apply_params, dump_config
from distmis.files import atomic_directory, write_json_atomic, write_text_atomic
from distmis.metrics import (
    FAILURE,
    GROUP_STARTUP,
    NODE,
    PID,
    REPORTED_AT,
    STARTED_AT,
    WARM,
    is_class_metric,
    is_divergence,
    result_metrics,
)
from distmis.schema import RunFile
from distmis.space import sampled_params

if TYPE_CHECKING:
    from ray.tune import ResultGrid


@dataclass
class TrialRow:
    trial_id: str
    status: str
    params: dict[str, Any]
    epochs: int
    stopped_early: bool
    final: dict[str, float]
    best: dict[str, float]
    started_at: float | None
    finished_at: float | None
    error: str | None = None
    node_ip: str | None = None
    # where the time before training went: once per slot (a warm trial reuses it) and per trial
    group_startup_seconds: float | None = None  # the slot's cold start (its process, or its worker group)
    warm: bool | None = None  # ran on a slot that had already run a trial
    overhead_seconds: float | None = None  # first epoch's end - trial start - the first epoch's own time
    pid: int | None = None

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


@dataclass
class SearchSummary:
    name: str
    out: str
    metric: str
    mode: str
    wall_seconds: float
    trials: int
    finished: int
    stopped_early: int
    failed: int
    max_concurrent_observed: int
    best_trial_id: str | None = None
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None  # Unix time the search command started (resume: the resumed one)
    interrupted: bool = False  # stopped on request before the end; --resume continues it

    @classmethod
    def interrupted_search(cls, config: ExperimentConfig, out: Path, started_at: float) -> SearchSummary:
        """The summary of a search stopped on request (``--resume`` continues it)."""
        import time

        return cls(
            name=config.name,
            out=str(out),
            metric=config.search.metric,
            mode=config.search.mode,
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

    def print(self) -> None:
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
        if self.trials and self.failed == self.trials:
            print(
                f"distmis: every trial failed ({self.failed} of {self.trials}): no best model; the error column of "
                f"{self.out}/results.csv says why",
                flush=True,
            )


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals that overlap at one instant (sweep line)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    best = cur = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best


def trial_rows(grid: ResultGrid, config: ExperimentConfig) -> list[TrialRow]:
    """One row per trial of a finished Tune run: parameters, final and best metrics, timing."""
    metric, mode = config.search.metric, config.search.mode
    rows = []
    for result in grid:
        df = result.metrics_dataframe
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id") or (result.path and Path(result.path).name) or "?"
        params = sampled_params(result.config or {})
        epochs = int(metrics.get("epoch", 0) or 0)
        best: dict[str, float] = {}
        started = finished = None
        timing: dict[str, Any] = {}
        if df is not None and len(df) and metric in df:
            col = df[metric].astype(float)
            idx = col.idxmax() if mode == "max" else col.idxmin()
            if not math.isnan(col[idx]):
                reported = [*result_metrics(config.search.metric), *sorted(c for c in df if is_class_metric(c))]
                best = {k: float(df.loc[idx, k]) for k in ("epoch", *reported) if k in df}
            started = float(df[STARTED_AT].min()) if STARTED_AT in df else None
            finished = float(df[REPORTED_AT].max()) if REPORTED_AT in df else None
            timing = _first_epoch_timing(df)
        failure = metrics.get(FAILURE)
        status = "ERROR" if result.error or failure else "TERMINATED"
        rows.append(
            TrialRow(
                trial_id=str(trial_id),
                status=status,
                params=params,
                epochs=epochs,
                stopped_early=status != "ERROR" and epochs < config.train.epochs,
                final={
                    k: float(metrics[k])
                    for k in (*result_metrics(config.search.metric), *sorted(filter(is_class_metric, metrics)))
                    if k in metrics
                },
                best=best,
                started_at=started,
                finished_at=finished,
                error=(str(result.error).splitlines()[0][:300] if result.error else str(failure) if failure else None),
                node_ip=str(metrics[NODE]) if metrics.get(NODE) else None,
                **timing,
            )
        )
    return sorted(rows, key=lambda r: r.trial_id)


def _first_epoch_timing(df: Any) -> dict[str, Any]:
    """Start-up and per-trial overhead from a trial's first reported epoch (see TrialRow)."""
    first = df.iloc[0]

    def number(key: str) -> float | None:
        try:
            value = float(first[key])
        except (KeyError, TypeError, ValueError):
            return None
        return None if math.isnan(value) else value

    started, finished, seconds = number(STARTED_AT), number("finished_at"), number("epoch_seconds")
    overhead = (
        finished - started - seconds if started is not None and finished is not None and seconds is not None else None
    )
    warm = first.get(WARM) if WARM in df else None
    pid = number(PID)
    return {
        "group_startup_seconds": number(GROUP_STARTUP),
        "warm": None if warm is None else bool(warm),
        "overhead_seconds": overhead,
        "pid": int(pid) if pid is not None else None,
    }


def _csv(rows: list[TrialRow], metric_names: list[str]) -> str:
    param_names = sorted({k for r in rows for k in r.params})
    header = (
        [
            "trial_id",
            "status",
            *param_names,
            "epochs",
            "stopped_early",
            "seconds",
            "started_at",
            "finished_at",
            "node_ip",
        ]
        + [f"final_{m}" for m in metric_names]
        + [f"best_{m}" for m in metric_names]
        + ["best_epoch", "warm", "group_startup_seconds", "overhead_seconds", "error"]
    )
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for r in rows:
        w.writerow(
            [
                r.trial_id,
                r.status,
                *[r.params.get(p, "") for p in param_names],
                r.epochs,
                r.stopped_early,
                "" if r.seconds is None else f"{r.seconds:.2f}",
                r.started_at or "",
                r.finished_at or "",
                r.node_ip or "",
            ]
            + [r.final.get(m, "") for m in metric_names]
            + [r.best.get(m, "") for m in metric_names]
            + [
                int(r.best["epoch"]) if "epoch" in r.best else "",
                "" if r.warm is None else r.warm,
                "" if r.group_startup_seconds is None else f"{r.group_startup_seconds:.2f}",
                "" if r.overhead_seconds is None else f"{r.overhead_seconds:.2f}",
                r.error or "",
            ]
        )
    return buf.getvalue()


def summarise(
    config: ExperimentConfig,
    grid: ResultGrid,
    out: Path,
    *,
    wall_seconds: float,
    prepared: Path,
    started_at: float | None = None,
) -> SearchSummary:
    """Write results.csv, best.yaml, best/ and summary.json for a finished search."""
    rows = trial_rows(grid, config)
    metric, mode = config.search.metric, config.search.mode
    # the standard metrics, then every per-class and per-region one any trial reported
    columns = result_metrics(config.search.metric)
    columns += sorted({k for r in rows for k in (*r.best, *r.final) if is_class_metric(k) and k not in columns})
    write_text_atomic(out / RunFile.RESULTS, _csv(rows, columns))
    scored = [r for r in rows if metric in r.best and not is_divergence(r.error)]
    best = None
    if scored:
        best = (max if mode == "max" else min)(scored, key=lambda r: r.best[metric])
        dump_config(apply_params(config, best.params), out / RunFile.BEST)
        src = out / RunFile.TRIALS_DIR / best.trial_id / RunFile.BEST_MODEL_DIR
        if src.is_dir():
            with atomic_directory(
                out / RunFile.BEST_MODEL_DIR, command="tune (best model)", inside_own_output=True
            ) as tmp:
                shutil.copytree(src, tmp, dirs_exist_ok=True)
    intervals = [(r.started_at, r.finished_at) for r in rows if r.started_at is not None and r.finished_at is not None]
    summary = SearchSummary(
        name=config.name,
        out=str(out),
        metric=metric,
        mode=mode,
        wall_seconds=wall_seconds,
        trials=len(rows),
        finished=sum(r.status == "TERMINATED" and not r.stopped_early for r in rows),
        stopped_early=sum(r.stopped_early for r in rows),
        failed=sum(r.status == "ERROR" for r in rows),
        max_concurrent_observed=max_overlap(intervals) if intervals else 0,
        best_trial_id=best.trial_id if best else None,
        best_value=best.best[metric] if best else None,
        best_params=best.params if best else {},
        started_at=started_at,
    )
    write_json_atomic(
        out / RunFile.SUMMARY,
        {**asdict(summary), "prepared": str(prepared), "trials_detail": [asdict(r) for r in rows]},
    )
    return summary
