"""What a finished search leaves behind: results.csv, best.yaml, best/, summary.json, a printed summary."""

from __future__ import annotations

import csv
import io
import math
import shutil
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
    divergence,
    is_class_metric,
    is_divergence,
    result_metrics,
)
from distmis.schema import RunFile
from distmis.search_summary import SearchSummary, SearchSummaryFile, TrialRow
from distmis.space import sampled_params

if TYPE_CHECKING:
    from ray.tune import ResultGrid


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals that overlap at one instant (sweep line)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    best = cur = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best


def unreported_epochs(trial_dir: Path, reported: int) -> list[dict[str, float]]:
    """The epochs after ``reported`` that the trial wrote to its ``metrics.csv``: none, unless Tune
    dropped their reports.

    Why it can happen: a search's deadline stops a trial only once its epoch in progress has ended,
    and Tune drops that epoch's report. Trials keep no epoch that ends within
    :data:`~distmis.tuning._deadline.REPORT_MARGIN_SECONDS` of the deadline, but on a loaded machine
    a report can take longer than that to reach Tune. The trial's own record, written before its
    best/ and checkpoint, is then what those files hold, and the search's records are completed from it.
    """
    path = trial_dir / RunFile.METRICS
    if not path.is_file() or path.is_symlink():
        return []
    late: list[dict[str, float]] = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                values = {k: float(v) for k, v in row.items() if k is not None and v not in (None, "")}
            except ValueError:
                break  # not a row the trial wrote whole: nothing after it is trusted either
            if values.get("epoch", 0.0) > reported:
                late.append(values)
    return late


def began_training(trial_dir: Path) -> bool:
    """Whether a trial's set-up ended and its first epoch began: its first step writes its ``metrics.csv``
    (:meth:`~distmis.training.RunSession.write_history`) before it trains."""
    return (trial_dir / RunFile.METRICS).is_file()


def with_unreported_epochs(
    result: dict[str, Any], late: list[dict[str, float]], metric: str
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """``result`` (a trial's last report to Tune) as the trial would have reported its ``late`` epochs
    (:func:`unreported_epochs`), and the epochs it would have reported: up to a diverged one, which
    ends the trial with its failure as its report would have.

    One function, so that results.csv and the Optuna study count a trial's epochs alike.
    """
    completed = dict(result)
    reported = []
    for row in late:
        completed.update(row)
        reported.append(row)
        reason = divergence(row, metric)
        if reason is not None:
            completed[FAILURE] = reason
            break
    return completed, reported


def trial_rows(grid: ResultGrid, config: ExperimentConfig, out: Path | None = None) -> list[TrialRow]:
    """One row per trial of a finished Tune run: parameters, final and best metrics, timing.

    With ``out`` (the search directory), epochs a trial wrote but Tune never heard of
    (:func:`unreported_epochs`) count as reported: the rows then name the weights in each trial's best/.
    """
    import pandas as pd

    metric, mode = config.search.metric, config.search.mode
    rows = []
    for result in grid:
        df = result.metrics_dataframe
        metrics = dict(result.metrics or {})
        trial_id = metrics.get("trial_id") or (result.path and Path(result.path).name) or "?"
        params = sampled_params(result.config or {})
        epochs = int(metrics.get("epoch", 0) or 0)
        late = unreported_epochs(out / RunFile.TRIALS_DIR / str(trial_id), epochs) if out is not None else []
        if late:
            print(
                f"distmis: trial {trial_id}: epoch(s) {', '.join(str(int(r['epoch'])) for r in late)} written by the "
                "trial but never reported to Tune (the report came after the search's deadline); counted from "
                "its metrics.csv",
                flush=True,
            )
            metrics, late = with_unreported_epochs(metrics, late, metric)
            # a diverged epoch's weights are never a best/ (the trial does not write them): not a candidate
            candidates = [r if divergence(r, metric) is None else {**r, metric: math.nan} for r in late]
            df = (
                pd.concat([df, pd.DataFrame(candidates)], ignore_index=True)
                if df is not None
                else pd.DataFrame(candidates)
            )
            epochs = int(metrics["epoch"])
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
            if late and finished is not None:
                finished = max(finished, late[-1].get("finished_at", finished))
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
    rows = trial_rows(grid, config, out)
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
        began_training=sum(began_training(out / RunFile.TRIALS_DIR / r.trial_id) for r in rows),
    )
    record = SearchSummaryFile(**summary.model_dump(), prepared=str(prepared), trials_detail=rows)
    write_json_atomic(out / RunFile.SUMMARY, record.model_dump())
    return summary
