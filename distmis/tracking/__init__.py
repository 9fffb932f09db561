"""Tracking: MLflow parent/child runs of a search, plots of its results."""

from distmis.tracking._callback import MlflowTrialCallback, PlottingPreload
from distmis.tracking._mlflow import BACKOFF_MAX, PENDING_FILE, START_SECONDS, STATE_FILE, SearchTracker, flatten
from distmis.tracking._plots import import_plotting, learning_curves, optuna_plots, search_plots
from distmis.tracking._uri import (
    default_tracking_uri,
    experiment_id,
    mlflow_client,
    reattach_uri,
    redact_uri,
    resolve_tracking_uri,
)

__all__ = [
    "BACKOFF_MAX",
    "PENDING_FILE",
    "PlottingPreload",
    "MlflowTrialCallback",
    "START_SECONDS",
    "STATE_FILE",
    "SearchTracker",
    "default_tracking_uri",
    "experiment_id",
    "flatten",
    "import_plotting",
    "learning_curves",
    "mlflow_client",
    "optuna_plots",
    "reattach_uri",
    "redact_uri",
    "resolve_tracking_uri",
    "search_plots",
]
