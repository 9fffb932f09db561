"""The names distmis writes for another module, command or person to read back.

MLflow tag names and the file names of distmis's directories are contracts: one module writes them,
another parses them, and users filter on them in the MLflow UI and in scripts. Each is spelt here
once, so that a rename is one edit and one search finds every writer and reader of a record.
"""

from __future__ import annotations

from typing import Final


class Tag:
    """MLflow tags set on distmis's runs: searches, trials, compare, finalize and evaluation runs."""

    #: what a parent run is: search, compare, finalize
    ROLE: Final = "distmis.role"
    #: what a run that is not part of a search is: compare, evaluation
    KIND: Final = "distmis.kind"
    #: the run's output directory on disk
    OUT: Final = "distmis.out"
    #: why a run failed, cut to 500 characters
    ERROR: Final = "distmis.error"
    RESUMED_AT: Final = "distmis.resumed_at"
    BEST_TRIAL_ID: Final = "distmis.best_trial_id"
    BEST_PARAMS: Final = "distmis.best_params"
    #: the parallelism mode a compare run's child search ran in
    COMPARE_MODE: Final = "distmis.compare_mode"
    PARALLELISM_MODE: Final = "distmis.parallelism_mode"
    WORKERS_PER_TRIAL: Final = "distmis.workers_per_trial"
    #: the searched parameter names, comma-separated
    SEARCHED: Final = "distmis.searched"
    TRIAL_ID: Final = "distmis.trial_id"
    #: TERMINATED, ERROR or ABANDONED
    STATUS: Final = "distmis.status"
    ABANDONED: Final = "distmis.abandoned"
    EPOCHS: Final = "distmis.epochs"
    STOPPED_EARLY: Final = "distmis.stopped_early"
    STARTED_AT: Final = "distmis.started_at"
    FINISHED_AT: Final = "distmis.finished_at"
    GROUP_STARTUP_SECONDS: Final = "distmis.group_startup_seconds"
    #: whether the trial ran in a worker that an earlier trial had started
    WARM: Final = "distmis.warm"
    OVERHEAD_SECONDS: Final = "distmis.overhead_seconds"
    #: the worker process (slot) the trial ran in
    SLOT: Final = "distmis.slot"
    FINAL_MEMBERS: Final = "distmis.final_members"
    LARGEST_COMPONENT: Final = "distmis.largest_component"
    MODEL_DIR: Final = "distmis.model_dir"
    SPLIT: Final = "distmis.split"
    TRIAL_RUN_ID: Final = "distmis.trial_run_id"
    CASES_SEEN_IN_TRAINING: Final = "distmis.cases_seen_in_training"
    CASES_SEEN_IN_VALIDATION: Final = "distmis.cases_seen_in_validation"


class RunFile:
    """File and folder names inside the directories distmis writes (search, trial, model, finalize, prepared)."""

    #: the search file a search or compare ran, as given (``--resume`` compares against it)
    SEARCH_FILE: Final = "search.yaml"
    #: a search's or an evaluation's outcome, as JSON
    SUMMARY: Final = "summary.json"
    #: one row per trial of a search
    RESULTS: Final = "results.csv"
    #: the best configuration of a search, as a search file
    BEST: Final = "best.yaml"
    #: where a command's time went, phase by phase
    TIMINGS: Final = "timings.json"
    #: a search's wall time spent so far, over every run of it (``search.time_budget`` counts it)
    TIME_SPENT: Final = "time_spent.json"
    #: the search's MLflow run ids (so that ``--resume`` continues the same runs)
    MLFLOW_STATE: Final = "mlflow.json"
    #: MLflow writes queued while the server was unreachable
    MLFLOW_PENDING: Final = "mlflow_pending.json"
    #: Optuna's journal storage: the study itself
    JOURNAL: Final = "optuna.journal"
    #: Ray Tune's experiment directory inside a search
    TUNE_DIR: Final = "tune"
    #: one folder per trial inside a search
    TRIALS_DIR: Final = "trials"
    #: one row per epoch of a trial, or per case of an evaluation
    METRICS: Final = "metrics.csv"
    #: the full configuration a trial or model was trained with
    CONFIG: Final = "config.yaml"
    #: a model's weights
    WEIGHTS: Final = "weights.npz"
    #: how a model's input was prepared, so that inference prepares a new scan the same way
    PREPROCESSING: Final = "preprocessing.json"
    #: an ensemble model's members
    ENSEMBLE: Final = "ensemble.json"
    #: finalize's chosen configurations and why
    SELECTION: Final = "selection.json"
    #: a prepared dataset's record (its format, cases, splits)
    PREPARED_INFO: Final = "info.json"
    #: a human-readable report
    REPORT: Final = "report.md"
    #: what finalize did case by case (its out-of-fold predictions)
    FINALIZE_LOG: Final = "finalize.log"
    #: the best model of a trial and of a search (beside which its evaluations are written)
    BEST_MODEL_DIR: Final = "best"

    @staticmethod
    def evaluation_dir(model_dir: str, split: str) -> str:
        """The folder an evaluation of ``model_dir`` on ``split`` is written to, beside the model:
        ``evaluate-<split>`` for a search's ``best/``, ``evaluate-<model>-<split>`` for any other
        model (a finalize's ``final/``), so that two models of one search never share one."""
        if model_dir == RunFile.BEST_MODEL_DIR:
            return f"evaluate-{split}"
        return f"evaluate-{model_dir}-{split}"


__all__ = ["RunFile", "Tag"]
