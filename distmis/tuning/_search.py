"""``distmis tune``: a Ray Tune search over one search-space file, resumable.

Experiment directory (``--out``, default ``runs/<name>``)::

    search.yaml        the search-space file as given (the search's single source of truth)
    optuna.journal     the Optuna study (JournalStorage): survives a killed driver
    tune/              Ray Tune's experiment state, trial checkpoints and logs
    trials/<id>/       each trial's run directory (metrics.csv, checkpoint/, best/)
    results.csv        one row per trial: params, final and best metrics, epochs, early stop, seconds
    best.yaml          the best trial's configuration, accepted by `distmis train`
    best/              the best trial's weights and preprocessing record
    summary.json       best trial, counts, wall time, observed concurrency
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from pathlib import Path

from distmis.config import ExperimentConfig
from distmis.console import quiet_output
from distmis.exceptions import TuningError
from distmis.files import check_output, marker_info, owned_output_directory, write_json_atomic, write_text_atomic
from distmis.preflight import preflight
from distmis.tensorflow_env import apply_tensorflow_env, tensorflow_env
from distmis.tracking import PENDING_FILE, STATE_FILE, SearchTracker
from distmis.tuning._keys import GRID_KEY, STOP_REQUESTED
from distmis.tuning._results import SearchSummary, summarise
from distmis.tuning.space import define_by_run, grid_points

TUNE_DIR = "tune"
JOURNAL = "optuna.journal"


def experiment_dir(config: ExperimentConfig, out: str | os.PathLike[str] | None) -> Path:
    return Path(out or Path("runs") / config.name).resolve()


def _check_out(out: Path, resume: bool) -> bool:
    """Whether to resume; refuses an existing search without ``resume`` and nothing to resume with it.

    A directory this command created for a search that was stopped before Tune started (a
    wall-time warning during start-up) has nothing to resume: it is started afresh.
    """
    started = (out / TUNE_DIR).exists() or (out / JOURNAL).exists()
    if resume and not started:
        info = marker_info(out) if out.is_dir() else None
        if info is not None and info.get("written_by") == "distmis tune":
            print(f"distmis: {out}: the search had not started yet; starting it", flush=True)
            return False
        raise TuningError(f"{out}: no search to resume here (no {TUNE_DIR}/ or {JOURNAL}); run without --resume")
    if not resume and started:
        raise TuningError(
            f"{out}: a search already exists here; pass --resume to continue it, or choose another --out "
            "(nothing was overwritten)"
        )
    return resume


def plan_concurrency(
    config: ExperimentConfig, cluster: dict[str, float], nodes: list[dict[str, float]] | None = None
) -> tuple[dict[str, float], int]:
    """Resources of one trial and how many trials can run at once on ``cluster``.

    A multi-worker trial's trainable holds an empty bundle (it only coordinates its workers), so
    ``max_concurrent_trials x workers x cpus_per_worker`` is what must fit. Mode ``data`` runs
    one trial at a time unless ``max_concurrent_trials`` says otherwise; ``hybrid`` and
    ``experiment`` run as many as fit.

    Raises:
        TuningError: when one trial (or one of its workers) can never fit on the cluster,
            instead of letting Ray wait forever.
    """
    par = config.parallelism
    per_trial = {"CPU": par.cpus_per_worker * par.workers_per_trial, "GPU": par.gpus_per_worker * par.workers_per_trial}
    per_worker = {"CPU": par.cpus_per_worker, "GPU": par.gpus_per_worker}
    fits = []
    for key, need in per_trial.items():
        if need <= 0:
            continue
        have = cluster.get(key, 0.0)
        if need > have + 1e-9:
            raise TuningError(
                f"parallelism: one trial needs {need:g} {key} ({par.workers_per_trial} worker(s) x "
                f"{per_worker[key]:g}), the cluster has {have:g}; it could never start"
            )
        if nodes:
            biggest = max(n.get(key, 0.0) for n in nodes)
            if per_worker[key] > biggest + 1e-9:
                raise TuningError(
                    f"parallelism: one worker needs {per_worker[key]:g} {key}, the largest node has {biggest:g}; "
                    "a worker must fit on one node"
                )
        fits.append(int(math.floor(have / need + 1e-9)))
    possible = max(1, min(fits)) if fits else 1
    wanted = config.search.max_concurrent_trials
    if wanted is None and par.mode == "data":
        wanted = 1
    return per_trial, min(possible, wanted) if wanted else possible


def _searcher(config: ExperimentConfig, out: Path):  # noqa: ANN202
    """(search_alg, param_space, num_samples) for the configured algorithm."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in Journal ..." is noise here
    from ray import tune

    s = config.search
    if s.algorithm == "points":
        return None, {GRID_KEY: tune.grid_search([dict(p) for p in s.points or []])}, 1
    if s.algorithm == "grid":
        # each grid point (conditions already applied) is one value of a single grid axis
        return None, {GRID_KEY: tune.grid_search(grid_points(config.space))}, 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if s.algorithm == "random":
            sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=s.seed)
        else:
            # constant_liar: concurrent trials see each other as pending, so TPE does not
            # propose the same point to every free worker; group=True handles conditional spaces.
            sampler = optuna.samplers.TPESampler(
                seed=s.seed,
                n_startup_trials=min(10, max(2, s.num_samples // 2)),
                multivariate=True,
                group=True,
                constant_liar=True,
            )
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from distmis.tuning._optuna_search import EpochReportingOptunaSearch

    storage = JournalStorage(JournalFileBackend(str(out / JOURNAL)))
    searcher = EpochReportingOptunaSearch(
        space=define_by_run(config.space),
        metric=s.metric,
        mode=s.mode,
        sampler=sampler,
        study_name=config.name,
        storage=storage,
    )
    return searcher, None, s.num_samples


def run_search(
    config: ExperimentConfig,
    *,
    space_file: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    address: str | None = None,
    tracking_uri: str | None = None,
    verbose: int = 0,
) -> SearchSummary:
    """Run (or resume) the search described by ``config``; returns its summary.

    Raises:
        TuningError: an existing search without ``resume``, nothing to resume, a trial that
            can never fit on the cluster.
        TrackingError: the MLflow store is unreachable at start (before any training).
    """
    from distmis.tuning._ray import init_ray, use_private_token

    use_private_token(address)  # before Ray is imported anywhere in this process
    from ray import tune

    from distmis.data import load_manifest, resolve_prepared, verify_shards
    from distmis.tracking._callback import MlflowTrialCallback
    from distmis.tuning._interrupt import InterruptWatch
    from distmis.tuning._progress import LiveProgress
    from distmis.tuning._trial import TrialContext, trainable_for, trial_resources

    if not config.space:
        raise TuningError("space: the search space is empty")
    phases = _Phases()
    out = experiment_dir(config, out)
    base_dir = Path(space_file).resolve().parent if space_file else Path.cwd()
    # everything that can be checked before work starts, before anything is written
    preflight(config, path=Path(space_file) if space_file else "configuration", base_dir=base_dir)
    source = None if config.data.source == "synthetic" else (base_dir / Path(config.data.source).expanduser())
    check_output(out, option="--out", inputs={"data source": source, "search-space file": space_file})
    resume = _check_out(out, resume)
    phases.mark("checks")
    start = time.time()
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "5")  # experiment state saved often: resumable after kill -9
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    # checkpointing every epoch is deliberate (resume loses at most one epoch): no warning for it
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    apply_tensorflow_env()
    setup = contextlib.nullcontext(out) if resume else owned_output_directory(out, command="tune", option="--out")
    with setup:  # a new search that fails here (bad data, no cluster room, MLflow down) leaves no directory
        if space_file is not None and not resume:
            write_text_atomic(out / "search.yaml", Path(space_file).read_text(encoding="utf-8"))
        prepared = resolve_prepared(config.data, base_dir=base_dir)
        manifest = load_manifest(prepared)
        for split in ("train", "val"):  # a damaged shard is named now, not in every trial
            verify_shards(manifest, split)
        phases.mark("data")
        cluster = init_ray(address, env_vars={**tensorflow_env(), "PYTHONWARNINGS": "ignore::DeprecationWarning"})
        import ray

        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        per_trial, concurrency = plan_concurrency(config, cluster, nodes)
        phases.mark("ray_start")
        tracker = _start_tracking(config, out, tracking_uri, resume)  # fails fast, before any training
        phases.mark("tracking_start")

    context = TrialContext(
        base_config=config.to_yaml_dict(),
        prepared=str(prepared),
        trials_dir=str(out / "trials"),
        metric=config.search.metric,
        mode=config.search.mode,
        threads=int(config.train.threads or max(1, math.floor(config.parallelism.cpus_per_worker))),
        workers=config.parallelism.workers_per_trial,
        cpus_per_worker=config.parallelism.cpus_per_worker,
        gpus_per_worker=config.parallelism.gpus_per_worker,
    )
    trainable = tune.with_resources(
        trainable_for(context), trial_resources(context.workers, context.cpus_per_worker, context.gpus_per_worker)
    )
    if resume:
        tuner = tune.Tuner.restore(str(out / TUNE_DIR), trainable, resume_unfinished=True, resume_errored=True)
    else:
        searcher, param_space, num_samples = _searcher(config, out)
        scheduler = None
        sc = config.search.scheduler
        if sc.type == "asha":
            from ray.tune.schedulers import ASHAScheduler

            scheduler = ASHAScheduler(
                time_attr="epoch",
                max_t=config.train.epochs,
                grace_period=min(sc.grace_period, config.train.epochs),
                reduction_factor=sc.reduction_factor,
            )
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(
                metric=config.search.metric,
                mode=config.search.mode,
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=num_samples,
                max_concurrent_trials=concurrency,
                reuse_actors=True,  # warm trial processes, and warm worker groups for data-parallel trials
            ),
            run_config=tune.RunConfig(
                name=TUNE_DIR,
                storage_path=str(out),
                failure_config=tune.FailureConfig(max_failures=config.search.max_failures),
                # every mode checkpoints through Tune every epoch (a group's chief writes the files)
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_frequency=1, checkpoint_at_end=True),
                callbacks=[
                    MlflowTrialCallback(tracker, base_config=context.base_config, epochs=config.train.epochs),
                    InterruptWatch(),
                    *(
                        [
                            LiveProgress(
                                name=config.name,
                                metric=config.search.metric,
                                mode=config.search.mode,
                                epochs=config.train.epochs,
                                trials=_planned_trials(config),
                                concurrency=concurrency,
                            )
                        ]
                        if not verbose
                        else []
                    ),
                ],
                verbose=verbose,
            ),
        )
    print(
        f"distmis: search '{config.name}' -> {out}  ({config.search.algorithm}, "
        f"{'resuming' if resume else f'{config.search.num_samples} samples'}, up to {concurrency} concurrent trial(s) of "
        f"{per_trial['CPU']:g} CPU / {per_trial['GPU']:g} GPU, {config.parallelism.mode} parallelism, "
        f"{config.parallelism.workers_per_trial} worker(s) per trial)",
        flush=True,
    )
    if STOP_REQUESTED.is_set():  # the wall-time warning came during start-up
        tracker.channel.wait_empty(config.tracking.final_flush_seconds)
        print("distmis: stop requested before the trials started; --resume starts the search", flush=True)
        return SearchSummary(
            name=config.name,
            out=str(out),
            metric=config.search.metric,
            mode=config.search.mode,
            wall_seconds=time.time() - start,
            trials=0,
            finished=0,
            stopped_early=0,
            failed=0,
            max_concurrent_observed=0,
            started_at=start,
            interrupted=True,
        )
    # while the trials run, Ray's and TensorFlow's output goes to tune.log; the console gets the live view
    phases.mark("tuner_setup")
    with quiet_output(out / "tune.log", verbose=bool(verbose)) as log_path:
        grid = tuner.fit()
        if log_path is not None:
            # Ray forwards the trials' last lines to this process a moment later: disconnect
            # while they still go to the log (the results are read from disk from here on)
            ray.shutdown()
    phases.mark("trials")
    if log_path is not None:
        print(f"distmis: Ray Tune's and the trials' output: {log_path}", flush=True)
    unfinished = _unfinished_trials(grid)
    if STOP_REQUESTED.is_set() or unfinished:  # stopped on request (SIGUSR1, Ctrl-C): Tune saved its state
        tracker.channel.wait_empty(config.tracking.final_flush_seconds)  # MLflow runs stay open for --resume
        print(
            f"distmis: search interrupted; unfinished trials continue from their last checkpoint with: "
            f"distmis tune {space_file or '<file>'} --out {out} --resume",
            flush=True,
        )
        return SearchSummary(
            name=config.name,
            out=str(out),
            metric=config.search.metric,
            mode=config.search.mode,
            wall_seconds=time.time() - start,
            trials=0,
            finished=0,
            stopped_early=0,
            failed=0,
            max_concurrent_observed=0,
            started_at=start,
            interrupted=True,
        )
    summary = summarise(config, grid, out, wall_seconds=time.time() - start, prepared=prepared, started_at=start)
    phases.mark("results")
    _finish_tracking(tracker, config, out, summary)
    phases.mark("plots_and_tracking_flush")
    phases.write(out / "timings.json")
    summary.print()
    return summary


class _Phases:
    """Where a search's wall time went, phase by phase (``timings.json``: read by
    ``benchmarks/tune_overhead.py`` to profile the fixed cost outside the trials)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def write(self, path: Path) -> None:
        write_json_atomic(path, {k: round(v, 3) for k, v in self.seconds.items()})


def _planned_trials(config: ExperimentConfig) -> int | None:
    s = config.search
    if s.algorithm == "points":
        return len(s.points or [])
    if s.algorithm == "grid":
        return len(grid_points(config.space))
    return s.num_samples


def _unfinished_trials(grid) -> int:  # noqa: ANN001 - ray.tune.ResultGrid
    """Trials neither finished nor failed after ``fit()``: only an interruption leaves them."""
    analysis = getattr(grid, "_experiment_analysis", None)
    trials = getattr(analysis, "trials", None) or []
    return sum(1 for t in trials if t.status not in ("TERMINATED", "ERROR"))


def _start_tracking(config: ExperimentConfig, out: Path, tracking_uri: str | None, resume: bool) -> SearchTracker:
    from distmis.tracking import reattach_uri, redact_uri, resolve_tracking_uri

    state = out / STATE_FILE
    if resume and state.is_file():  # the same store and runs as the interrupted search
        recorded = json.loads(state.read_text())
        uri = reattach_uri(recorded["tracking_uri"], tracking_uri, config.tracking.uri, out)
        experiment = recorded["experiment"]
    else:
        uri = resolve_tracking_uri(tracking_uri, config.tracking.uri, out)
        experiment = config.tracking.experiment or config.name
    tracker = SearchTracker(uri, experiment, out)
    s, p = config.search, config.parallelism
    params = {
        "search.algorithm": s.algorithm,
        "search.metric": s.metric,
        "search.mode": s.mode,
        "search.num_samples": s.num_samples,
        "search.max_concurrent_trials": s.max_concurrent_trials,
        "search.seed": s.seed,
        "search.scheduler": s.scheduler.type,
        "search.grace_period": s.scheduler.grace_period,
        "search.reduction_factor": s.scheduler.reduction_factor,
        "parallelism.mode": p.mode,
        "parallelism.workers_per_trial": p.workers_per_trial,
        "parallelism.cpus_per_worker": p.cpus_per_worker,
        "parallelism.gpus_per_worker": p.gpus_per_worker,
        "train.epochs": config.train.epochs,
        "space": ",".join(config.space),
    }
    tags = {"distmis.out": str(out)}
    if config.tracking.parent_run_id:
        tags["mlflow.parentRunId"] = config.tracking.parent_run_id
    if os.environ.get("SLURM_JOB_ID"):
        tags["slurm.job_id"] = os.environ["SLURM_JOB_ID"]
    run_id = tracker.start(
        params={k: str(v) for k, v in params.items()},
        tags=tags,
        artifacts=[out / "search.yaml"] if (out / "search.yaml").is_file() else [],
    )
    print(f"distmis: tracking to MLflow {redact_uri(uri)} (experiment '{experiment}', parent run {run_id})", flush=True)
    return tracker


def _finish_tracking(tracker: SearchTracker, config: ExperimentConfig, out: Path, summary: SearchSummary) -> None:
    from distmis.tracking import search_plots

    tracker = SearchTracker(tracker.uri, tracker.experiment, out)  # fresh: the callback's state is on disk
    import csv

    with open(out / "results.csv") as fh:
        tracker.abandon_unknown({row["trial_id"] for row in csv.DictReader(fh)})
    plots = search_plots(out, config)
    files = [out / "results.csv", out / "best.yaml", out / "summary.json"]
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
            "distmis.best_trial_id": summary.best_trial_id or "",
            "distmis.best_params": json.dumps(summary.best_params),
            "mlflow.note.content": summary.description(),
        },
        plots=plots,
        files=[f for f in files if f.is_file()],
        status="FINISHED" if summary.ok else "FAILED",
        wait_seconds=config.tracking.final_flush_seconds,
    )
    if not done:
        print(
            f"distmis: warning: MLflow still unreachable; tracking kept in {out / PENDING_FILE}, "
            "sent by the next `distmis tune --resume` of this search",
            flush=True,
        )
