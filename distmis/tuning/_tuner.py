"""Running the trials: Ray Tune's Tuner over the one trainable, with distmis's searcher, scheduler and callbacks.

The searcher is :class:`~distmis.tuning._searcher.OptunaSearcher` (TPE or random, the study in
``optuna.journal``) or, for a grid and fixed configurations, Tune's own grid over one axis of whole
points. The scheduler is ASHA (one bracket, or asynchronous Hyperband with several) on the epoch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distmis.console import quiet_output
from distmis.schema import RunFile
from distmis.space import GRID_KEY, define_by_run, grid_points

if TYPE_CHECKING:
    from ray.tune import ResultGrid, Tuner

    from distmis.config import ExperimentConfig
    from distmis.raysession import RaySession
    from distmis.tracking import SearchTracker
    from distmis.tuning._progress import TrialLabel
    from distmis.tuning._trial import TrialContext


def trial_context(
    config: ExperimentConfig,
    prepared: Path,
    out: Path,
    *,
    base_dir: Path | None = None,
    keep_until: float | None = None,
) -> TrialContext:
    """What every trial of this search needs besides its sampled parameters.

    A relative ``data.source`` is written into the trials' configurations resolved against
    ``base_dir`` (the search file's folder): ``best/config.yaml`` is then read from anywhere, by
    ``evaluate`` and ``predict`` run from another directory, and its data found.
    """
    from distmis.tuning._trial import TrialContext

    par = config.parallelism
    base_config = config.to_yaml_dict()
    source = str(base_config["data"]["source"])
    if base_dir is not None and source != "synthetic" and not Path(source).expanduser().is_absolute():
        base_config["data"]["source"] = str((base_dir / Path(source).expanduser()).resolve())
    return TrialContext(
        base_config=base_config,
        prepared=str(prepared),
        trials_dir=str(out / RunFile.TRIALS_DIR),
        metric=config.search.metric,
        mode=config.search.mode,
        threads=int(config.train.threads or max(1, math.floor(par.cpus_per_worker))),
        workers=par.workers_per_trial,
        cpus_per_worker=par.cpus_per_worker,
        gpus_per_worker=par.gpus_per_worker,
        keep_until=keep_until,
    )


def searcher(config: ExperimentConfig, out: Path, concurrency: int) -> tuple[Any, dict[str, Any] | None, int]:
    """(search_alg, param_space, num_samples) for the configured algorithm."""
    from ray import tune

    s = config.search
    if s.algorithm == "points":
        return None, {GRID_KEY: tune.grid_search([dict(p) for p in s.points or []])}, 1
    if s.algorithm == "grid":
        # each grid point (conditions already applied) is one value of a single grid axis
        return None, {GRID_KEY: tune.grid_search(grid_points(config.space))}, 1
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in Journal ..." is noise here
    from distmis.tuning._searcher import OptunaSearcher, build_sampler

    startup = s.sampler_startup_trials(concurrency)
    optuna_searcher = OptunaSearcher(
        space=define_by_run(config.space),
        metric=s.metric,
        mode=s.mode,
        sampler=build_sampler(s.algorithm, s.seed, startup),
        journal=out / RunFile.JOURNAL,
        study_name=config.name,
        max_epochs=config.train.epochs,
        points_to_evaluate=s.points,
        trials_dir=out / RunFile.TRIALS_DIR,
    )
    return optuna_searcher, None, s.num_samples


def scheduler(config: ExperimentConfig) -> Any:
    """Ray Tune's ASHA on the epoch (several brackets: asynchronous Hyperband), or none."""
    sc = config.search.scheduler
    if sc.type == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr="epoch",
        max_t=config.train.epochs,
        grace_period=min(sc.grace_period, config.train.epochs),
        reduction_factor=sc.reduction_factor,
        brackets=sc.brackets,
    )


def build_tuner(
    config: ExperimentConfig,
    out: Path,
    context: TrialContext,
    *,
    concurrency: int,
    tracker: SearchTracker,
    resume: bool,
    verbose: int,
    trial_label: TrialLabel | None = None,
    started: float | None = None,
) -> Tuner:
    """A new Tuner, or on ``--resume`` the interrupted one restored (its searcher and trials included,
    and its deadline, which then counts the time the search spent before)."""
    from ray import tune

    from distmis.tuning._storage import remove_partials, tune_storage
    from distmis.tuning._trial import trainable_for, trial_resources

    trainable = tune.with_resources(
        trainable_for(context), trial_resources(context.workers, context.cpus_per_worker, context.gpus_per_worker)
    )
    if resume:
        remove_partials(out / RunFile.TUNE_DIR)  # what a kill mid-write left; this command holds --out
        return tune.Tuner.restore(
            str(out / RunFile.TUNE_DIR),
            trainable,
            resume_unfinished=True,
            resume_errored=True,
            storage_filesystem=tune_storage(out),
        )
    search_alg, param_space, num_samples = searcher(config, out, concurrency)
    budget = config.search.time_budget_seconds()
    deadline = None
    if budget is not None:
        import time

        from distmis.tuning._deadline import SearchDeadline

        deadline = SearchDeadline(budget, out, started if started is not None else time.time())
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=config.search.metric,
            mode=config.search.mode,
            search_alg=search_alg,
            scheduler=scheduler(config),
            num_samples=num_samples,
            max_concurrent_trials=concurrency,
            reuse_actors=True,  # warm trial processes, and warm worker groups for data-parallel trials
        ),
        run_config=tune.RunConfig(
            name=RunFile.TUNE_DIR,
            storage_path=str(out),
            storage_filesystem=tune_storage(out),  # whole files only: a kill never leaves a part of Tune's state
            failure_config=tune.FailureConfig(max_failures=config.search.max_failures),
            stop=deadline,
            # every mode checkpoints through Tune every epoch (a group's chief writes the files)
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_frequency=1, checkpoint_at_end=True),
            callbacks=_callbacks(config, context, tracker, concurrency, verbose, trial_label),
            verbose=verbose,
        ),
    )


def _callbacks(
    config: ExperimentConfig,
    context: TrialContext,
    tracker: SearchTracker,
    concurrency: int,
    verbose: int,
    label: TrialLabel | None,
) -> list[Any]:
    from distmis.tracking import MlflowTrialCallback, PlottingPreload
    from distmis.tuning._interrupt import InterruptWatch
    from distmis.tuning._progress import LiveProgress

    callbacks: list[Any] = [
        MlflowTrialCallback(tracker, base_config=context.base_config, epochs=config.train.epochs, label=label),
        InterruptWatch(),
        PlottingPreload(),
    ]
    if not verbose:
        s = config.search
        callbacks.append(
            LiveProgress(
                name=config.name,
                metric=s.metric,
                mode=s.mode,
                epochs=config.train.epochs,
                trials=config.planned_trials(),
                concurrency=concurrency,
                label=label,
            )
        )
    return callbacks


def fit_quietly(tuner: Tuner, log: Path, *, verbose: int, ray_here: RaySession) -> ResultGrid:
    """Run the trials; Ray's and TensorFlow's output goes to ``log``, the console gets the live view.

    Ray is no longer needed once they end (the results are read from disk from here on): it
    stops then, while its last forwarded lines still go to the log.
    """
    with quiet_output(log, verbose=bool(verbose)) as log_path:
        grid = tuner.fit()
        if log_path is not None:
            ray_here.close()
    if log_path is not None:
        print(f"distmis: Ray Tune's and the trials' output: {log_path}", flush=True)
    return grid


def unfinished_trials(grid: ResultGrid) -> int:
    """Trials neither finished nor failed after ``fit()``: only an interruption leaves them."""
    return len(grid) - grid.num_terminated - grid.num_errors


__all__ = [
    "build_tuner",
    "fit_quietly",
    "scheduler",
    "searcher",
    "trial_context",
    "unfinished_trials",
]
