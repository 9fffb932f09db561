"""Tuning: Ray Tune searches (Optuna TPE, random, grid; ASHA; resume) over the one trainable of every mode."""

from distmis.search_summary import SearchSummary, TrialRow
from distmis.tuning._deadline import SearchDeadline, deadline_reached, time_spent
from distmis.tuning._interrupt import STOP_REQUESTED, stop_on_signals, stop_on_walltime_warning
from distmis.tuning._phases import (
    Timings,
    alive_nodes,
    start_ray_and_tracking,
    tune_environment,
)
from distmis.tuning._progress import LiveProgress
from distmis.tuning._results import summarise as summarise_search
from distmis.tuning._results import trial_rows, unreported_epochs
from distmis.tuning._resume import (
    check_resume_config,
    check_resumed_choices,
    check_tune_state,
    mend_journal,
    read_recorded,
)
from distmis.tuning._search import plan_concurrency, run_search
from distmis.tuning._searcher import OptunaSearcher, build_sampler
from distmis.tuning._storage import WholeFileLocalHandler, remove_partials, tune_storage
from distmis.tuning._tracking import fail_search_tracking, finish_search_tracking
from distmis.tuning._trial import TrialContext, trainable_for
from distmis.tuning._tuner import (
    build_tuner,
    fit_quietly,
    scheduler,
    searcher,
    trial_context,
    unfinished_trials,
)
from distmis.tuning._workers import TrialSession, TrialStart, WorkerGroup

__all__ = [
    "STOP_REQUESTED",
    "SearchDeadline",
    "deadline_reached",
    "time_spent",
    "read_recorded",
    "mend_journal",
    "stop_on_walltime_warning",
    "stop_on_signals",
    "Timings",
    "TrialRow",
    "alive_nodes",
    "build_tuner",
    "scheduler",
    "searcher",
    "fail_search_tracking",
    "finish_search_tracking",
    "fit_quietly",
    "start_ray_and_tracking",
    "trial_context",
    "remove_partials",
    "tune_storage",
    "WholeFileLocalHandler",
    "trial_rows",
    "summarise_search",
    "unreported_epochs",
    "tune_environment",
    "unfinished_trials",
    "LiveProgress",
    "OptunaSearcher",
    "SearchSummary",
    "TrialContext",
    "TrialSession",
    "TrialStart",
    "WorkerGroup",
    "build_sampler",
    "check_resume_config",
    "check_resumed_choices",
    "check_tune_state",
    "plan_concurrency",
    "run_search",
    "trainable_for",
]
