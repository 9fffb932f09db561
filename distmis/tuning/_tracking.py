"""A search's MLflow parent run: opened (or reattached) before any trial, closed by the search's one ending.

The trials' child runs are fed by :class:`distmis.tracking.MlflowTrialCallback` while Tune runs;
here are the two ends of the parent run. Whatever way a search ends, its parent run ends with it:
FINISHED or FAILED with the reason; an interrupted search's runs stay open for ``--resume``.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from distmis.schema import RunFile, Tag
from distmis.tracking import SearchTracker, tracked_metrics, trial_end_tags
from distmis.tuning._results import unreported_epochs

if TYPE_CHECKING:
    from distmis.config import ExperimentConfig
    from distmis.search_summary import SearchSummary


def start_search_tracking(config: ExperimentConfig, out: Path, tracking_uri: str | None, resume: bool) -> SearchTracker:
    """Open the parent run, or on ``--resume`` reattach to the recorded one (same store, same runs).

    Raises:
        TrackingError: the store cannot be reached or used (before any training).
    """
    from distmis.tracking import read_tracking_state, reattach_uri, redact_uri, resolve_tracking_uri

    recorded = read_tracking_state(out) if resume else None
    if recorded is not None and recorded.tracking_uri:
        uri = reattach_uri(recorded.tracking_uri, tracking_uri, config.tracking.uri, out)
        experiment = recorded.experiment or config.tracking.experiment or config.name
    else:
        uri = resolve_tracking_uri(tracking_uri, config.tracking.uri, out)
        experiment = config.tracking.experiment or config.name
    tracker = SearchTracker(uri, experiment, out)
    run_id = tracker.start(
        params={k: str(v) for k, v in search_params(config).items()},
        tags=_search_tags(config, out),
        artifacts=[out / RunFile.SEARCH_FILE] if (out / RunFile.SEARCH_FILE).is_file() else [],
    )
    print(f"distmis: tracking to MLflow {redact_uri(uri)} (experiment '{experiment}', parent run {run_id})", flush=True)
    return tracker


def search_params(config: ExperimentConfig) -> dict[str, object]:
    s, p, sc = config.search, config.parallelism, config.search.scheduler
    return {
        "search.algorithm": s.algorithm,
        "search.metric": s.metric,
        "search.mode": s.mode,
        "search.num_samples": s.num_samples,
        "search.max_concurrent_trials": s.max_concurrent_trials,
        "search.seed": s.seed,
        "search.startup_trials": s.startup_trials,
        "search.scheduler": sc.type,
        "search.grace_period": sc.grace_period,
        "search.reduction_factor": sc.reduction_factor,
        "search.brackets": sc.brackets,
        "parallelism.mode": p.mode,
        "parallelism.workers_per_trial": p.workers_per_trial,
        "parallelism.cpus_per_worker": p.cpus_per_worker,
        "parallelism.gpus_per_worker": p.gpus_per_worker,
        "train.epochs": config.train.epochs,
        "space": ",".join(config.space),
    }


def _search_tags(config: ExperimentConfig, out: Path) -> dict[str, str]:
    tags = {Tag.OUT: str(out)}
    if config.tracking.parent_run_id:
        tags["mlflow.parentRunId"] = config.tracking.parent_run_id
    if os.environ.get("SLURM_JOB_ID"):
        tags["slurm.job_id"] = os.environ["SLURM_JOB_ID"]
    return tags


def finish_search_tracking(tracker: SearchTracker, config: ExperimentConfig, out: Path, summary: SearchSummary) -> None:
    """Close the parent run of a search that ran to its end: metrics, plots, files, FINISHED or FAILED."""
    from distmis.tracking import search_plots

    tracker = SearchTracker(tracker.uri, tracker.experiment, out)  # fresh: the callback's state is on disk
    with open(out / RunFile.RESULTS) as fh:
        rows = list(csv.DictReader(fh))
    tracker.abandon_unknown({row["trial_id"] for row in rows})
    _log_unreported_epochs(tracker, out, rows, config)
    files = [out / RunFile.RESULTS, out / RunFile.BEST, out / RunFile.SUMMARY]
    done = tracker.finish(
        metrics={
            f"best_{summary.metric}": summary.best_value if summary.best_value is not None else float("nan"),
            "trials": summary.trials,
            "finished": summary.finished,
            "stopped_early": summary.stopped_early,
            "failed": summary.failed,
            "wall_seconds": summary.wall_seconds,
            "started_at": summary.started_at or 0.0,
            "max_concurrent_trials_observed": summary.max_concurrent_observed,
        },
        tags={
            Tag.BEST_TRIAL_ID: summary.best_trial_id or "",
            Tag.BEST_PARAMS: json.dumps(summary.best_params),
            "mlflow.note.content": summary.description(),
        },
        plots=search_plots(out, config),
        files=[f for f in files if f.is_file()],
        status="FINISHED" if summary.ok else "FAILED",
        wait_seconds=config.tracking.final_flush_seconds,
    )
    if not done:
        _warn_queued(out)


def _log_unreported_epochs(
    tracker: SearchTracker, out: Path, rows: list[dict[str, str]], config: ExperimentConfig
) -> None:
    """Log the epochs results.csv counts but Tune never reported (:func:`unreported_epochs`) to their
    trials' runs, with the tags that count them, so that MLflow agrees with results.csv."""
    for row in rows:
        logged = tracker.last_logged_epoch(row["trial_id"])
        if logged is None:
            continue
        late = unreported_epochs(out / RunFile.TRIALS_DIR / row["trial_id"], logged)
        for epoch in late:
            tracker.trial_result(
                row["trial_id"], int(epoch["epoch"]), tracked_metrics(epoch), epoch.get("finished_at", time.time())
            )
        if late:
            tags = trial_end_tags(
                failed=row["status"] == "ERROR",
                epochs=int(row["epochs"]),
                planned_epochs=config.train.epochs,
                error=row.get("error") or None,
                finished_at=float(row["finished_at"]) if row.get("finished_at") else None,
            )
            tracker.trial_tags(row["trial_id"], tags)


def fail_search_tracking(tracker: SearchTracker, config: ExperimentConfig, reason: str) -> None:
    """Close the parent run of a search whose ending failed (a full disk, say) as FAILED, with the reason.

    Never raises: it runs while another error is on its way to the user.
    """
    try:
        done = tracker.finish(
            metrics={},
            tags={Tag.ERROR: reason[:500], "mlflow.note.content": f"The search failed: {reason[:500]}"},
            plots=[],
            files=[],
            status="FAILED",
            wait_seconds=config.tracking.final_flush_seconds,
        )
    except Exception:  # noqa: BLE001 - the original error is the one to report
        return
    if not done:
        _warn_queued(tracker.out)


def _warn_queued(out: Path) -> None:
    print(
        f"distmis: warning: MLflow still unreachable; tracking kept in {out / RunFile.MLFLOW_PENDING}, "
        "sent by the next `distmis tune --resume` of this search",
        flush=True,
    )


__all__ = ["fail_search_tracking", "finish_search_tracking", "search_params", "start_search_tracking"]
