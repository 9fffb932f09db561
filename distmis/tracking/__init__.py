"""Tracking: MLflow parent/child runs of a search, plots of its results."""

from distmis.tracking._mlflow import (
    EPOCH_METRICS,
    PENDING_FILE,
    STATE_FILE,
    SearchTracker,
    default_tracking_uri,
    flatten,
    resolve_tracking_uri,
)
from distmis.tracking._plots import learning_curves, optuna_plots, search_plots

__all__ = [
    "EPOCH_METRICS",
    "PENDING_FILE",
    "STATE_FILE",
    "SearchTracker",
    "default_tracking_uri",
    "flatten",
    "learning_curves",
    "optuna_plots",
    "resolve_tracking_uri",
    "search_plots",
]
