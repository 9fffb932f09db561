"""Tuning: search spaces and Ray Tune searches (Optuna TPE, random, grid; ASHA; resume)."""

from distmis.tuning._results import SearchSummary, max_overlap
from distmis.tuning._search import experiment_dir, plan_concurrency, run_search
from distmis.tuning.space import define_by_run, describe_space, grid_points, ordered_params

__all__ = [
    "SearchSummary",
    "define_by_run",
    "describe_space",
    "experiment_dir",
    "grid_points",
    "max_overlap",
    "ordered_params",
    "plan_concurrency",
    "run_search",
]
