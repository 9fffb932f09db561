"""Tracking: MLflow parent/child runs of a search, plots of its results."""

from distmis.tracking._callback import MlflowTrialCallback, PlottingPreload, tracked_metrics, trial_end_tags
from distmis.tracking._mlflow import BACKOFF_MAX, START_SECONDS, RunWriter, SearchTracker
from distmis.tracking._plots import search_plots
from distmis.tracking._state import TrackingState, read_tracking_state
from distmis.tracking._uri import (
    experiment_id,
    mlflow_client,
    reattach_uri,
    redact_uri,
    resolve_tracking_uri,
    start_run,
)

__all__ = [
    "BACKOFF_MAX",
    "PlottingPreload",
    "RunWriter",
    "MlflowTrialCallback",
    "tracked_metrics",
    "trial_end_tags",
    "START_SECONDS",
    "SearchTracker",
    "TrackingState",
    "experiment_id",
    "mlflow_client",
    "reattach_uri",
    "read_tracking_state",
    "redact_uri",
    "resolve_tracking_uri",
    "search_plots",
    "start_run",
]
