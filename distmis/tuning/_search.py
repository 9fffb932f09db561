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
    timings.json       where the wall time went, phase by phase

A search is a sequence of phases (:mod:`distmis.tuning._phases`): checks, ownership of ``--out``,
data, a Ray session, tracking, trials, results, and one ending for every way it ends.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from distmis.config import ExperimentConfig
from distmis.exceptions import TuningError
from distmis.files import (
    OutputClaim,
    check_location,
    check_output,
    marker_info,
    refuse_link,
    write_json_atomic,
    write_text_atomic,
)
from distmis.locks import reader_lock
from distmis.preflight import preflight
from distmis.raysession import RaySession, probe_address
from distmis.schema import RunFile
from distmis.search_summary import SearchSummary
from distmis.tensorflow_env import apply_tensorflow_env, tensorflow_env
from distmis.tracking import SearchTracker
from distmis.tuning._deadline import epochs_kept_until, time_spent
from distmis.tuning._interrupt import STOP_REQUESTED
from distmis.tuning._phases import (
    Timings,
    alive_nodes,
    prepared_data,
    search_inputs,
    start_ray_and_tracking,
    tune_environment,
)
from distmis.tuning._results import summarise
from distmis.tuning._resume import (
    check_resume_config,
    check_resume_target,
    check_search_state,
    check_tune_state,
    mend_journal,
)
from distmis.tuning._tracking import fail_search_tracking, finish_search_tracking, start_search_tracking
from distmis.tuning._tuner import build_tuner, fit_quietly, trial_context, unfinished_trials

if TYPE_CHECKING:
    from ray.tune import ResultGrid


def experiment_dir(config: ExperimentConfig, out: str | os.PathLike[str] | None) -> Path:
    return Path(out or Path("runs") / config.name).resolve()


@dataclass
class SearchPlan:
    """A search that passed its checks: where it writes, what it reads, and whether it resumes."""

    config: ExperimentConfig
    out: Path
    base_dir: Path
    space_file: Path | None
    resume: bool

    @property
    def resume_command(self) -> str:
        return f"distmis tune {self.space_file or '<file>'} --out {self.out} --resume"


def check_search(
    config: ExperimentConfig,
    space_file: str | os.PathLike[str] | None,
    out: str | os.PathLike[str] | None,
    resume: bool,
    tracking_uri: str | None = None,
) -> SearchPlan:
    """Everything that can be checked before work starts, before anything is written.

    Raises:
        ConfigError / DataError: what preflight finds. OutputError: an ``--out`` over an input.
        TuningError: an empty space, an existing search without ``resume``, nothing to resume, a
            resume of another kind of directory or with another configuration.
    """
    if not config.space:
        raise TuningError("space: the search space is empty")
    out_dir = experiment_dir(config, out)
    given = Path(space_file) if space_file else None
    base_dir = given.resolve().parent if given else Path.cwd()
    preflight(config, path=given or "configuration", base_dir=base_dir)
    check_output(out_dir, option="--out", inputs=search_inputs(config, given, base_dir))
    refuse_link(out_dir / RunFile.JOURNAL, what="Optuna journal")
    if resume:
        check_resume_target(out_dir, given)
    resume = _resumes(out_dir, resume)
    if resume:
        check_location(
            out_dir, what="search", resume_command=f"distmis tune {given or '<file>'} --out <original> --resume"
        )
        check_resume_config(out_dir, config, given, tracking_uri)
        time_spent(out_dir)  # the budget already spent: a damaged record is refused before anything starts
        check_tune_state(out_dir / RunFile.TUNE_DIR, command="the search")
        check_search_state(out_dir, journal=RunFile.JOURNAL, tune_dir=RunFile.TUNE_DIR, command="the search")
    return SearchPlan(config, out_dir, base_dir, given, resume)


def _resumes(out: Path, resume: bool) -> bool:
    """Whether to resume; refuses an existing search without ``resume`` and nothing to resume with it.

    A directory this command created for a search that was stopped before Tune started (a
    wall-time warning during start-up) has nothing to resume: it is started afresh.
    """
    started = (out / RunFile.TUNE_DIR).exists() or (out / RunFile.JOURNAL).exists()
    if resume and not started:
        info = marker_info(out) if out.is_dir() else None
        if info is not None and info.get("written_by") == "distmis tune":
            print(f"distmis: {out}: the search had not started yet; starting it", flush=True)
            return False
        raise TuningError(
            f"{out}: no search to resume here (no {RunFile.TUNE_DIR}/ or {RunFile.JOURNAL}); run without --resume"
        )
    if not resume and started:
        raise TuningError(
            f"{out}: a search already exists here; pass --resume to continue it, or choose another --out "
            "(nothing was overwritten)"
        )
    return resume


@contextlib.contextmanager
def claimed(plan: SearchPlan) -> Iterator[OutputClaim]:
    """``--out`` for this search alone, from here to its end (:class:`~distmis.files.OutputClaim`):
    a new search's directory is created, marked and locked; a resumed one is locked."""
    with OutputClaim(plan.out, command="tune", option="--out", new=not plan.resume) as claim:
        if plan.resume:
            mend_journal(plan.out / RunFile.JOURNAL)
        if not plan.resume and plan.space_file is not None:
            with claim.setting_up():
                write_text_atomic(plan.out / RunFile.SEARCH_FILE, plan.space_file.read_text(encoding="utf-8"))
        yield claim


def record_splits(out: Path, prepared: Path, *, resume: bool) -> None:
    """A new search records its case splits (``splits.json``); a resumed one must find them unchanged."""
    from distmis.data import SPLITS_FILE, check_same_splits, load_manifest, read_search_splits

    now = load_manifest(prepared).info.case_splits
    recorded = read_search_splits(out) if resume else None
    if recorded is not None:
        check_same_splits(recorded, now, recorded_in=f"the search {out} ({SPLITS_FILE})", data=prepared)
    elif not resume or not (out / SPLITS_FILE).exists():
        write_json_atomic(out / SPLITS_FILE, now.model_dump())


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
    timings = Timings()
    with timings.phase("checks"):
        plan = check_search(config, space_file, out, resume, tracking_uri)
        probe_address(address)  # a dead address is named before tracking or the output is touched
    tune_environment()
    apply_tensorflow_env()
    workers_env = {**tensorflow_env(), "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    with contextlib.ExitStack() as session:
        claim = session.enter_context(claimed(plan))
        with claim.setting_up():
            with timings.phase("data"):
                prepared = prepared_data(config, plan.base_dir)
                session.enter_context(reader_lock(prepared, option="data.source"))  # no prepare replaces it meanwhile
                record_splits(plan.out, prepared, resume=plan.resume)
            with timings.phase("ray_and_tracking_start"):
                ray_here, tracker, (per_trial, concurrency) = start_ray_and_tracking(
                    session,
                    address,
                    env_vars=workers_env,
                    open_tracking=lambda: _start_tracking(plan, tracking_uri),
                    config=config,
                    check=lambda ray: plan_concurrency(config, ray.resources, alive_nodes()),
                )
        try:
            return _run_trials(plan, prepared, tracker, ray_here, timings, per_trial, concurrency, verbose)
        except KeyboardInterrupt:
            raise  # interrupted: the runs stay open for --resume
        except BaseException as exc:
            fail_search_tracking(tracker, config, f"{type(exc).__name__}: {exc}")
            raise
    raise AssertionError("unreachable")  # pragma: no cover - mypy: ExitStack may swallow exceptions


def _start_tracking(plan: SearchPlan, tracking_uri: str | None) -> SearchTracker:
    """The search's parent run (the plots' imports come later: :class:`~distmis.tracking.PlottingPreload`)."""
    return start_search_tracking(plan.config, plan.out, tracking_uri, plan.resume)


def _run_trials(
    plan: SearchPlan,
    prepared: Path,
    tracker: SearchTracker,
    ray_here: RaySession,
    timings: Timings,
    per_trial: dict[str, float],
    concurrency: int,
    verbose: int,
) -> SearchSummary:
    config = plan.config
    with timings.phase("tuner_setup"):
        keep_until = epochs_kept_until(plan.out, config.search.time_budget_seconds(), timings.started)
        context = trial_context(config, prepared, plan.out, base_dir=plan.base_dir, keep_until=keep_until)
        tuner = build_tuner(
            config,
            plan.out,
            context,
            concurrency=concurrency,
            tracker=tracker,
            resume=plan.resume,
            verbose=verbose,
            started=timings.started,
        )
    p = config.parallelism
    print(
        f"distmis: search '{config.name}' -> {plan.out}  ({config.search.algorithm}, "
        f"{'resuming' if plan.resume else f'{config.planned_trials()} trials'}, up to {concurrency} concurrent "
        f"trial(s) of {per_trial['CPU']:g} CPU / {per_trial['GPU']:g} GPU, {p.mode} parallelism, "
        f"{p.workers_per_trial} worker(s) per trial)",
        flush=True,
    )
    grid: ResultGrid | None = None
    if not STOP_REQUESTED.is_set():  # the wall-time warning may come during start-up
        with timings.phase("trials"):
            grid = fit_quietly(tuner, plan.out / "tune.log", verbose=verbose, ray_here=ray_here)
    return _end(plan, prepared, tracker, ray_here, timings, grid)


def _end(
    plan: SearchPlan,
    prepared: Path,
    tracker: SearchTracker,
    ray_here: RaySession,
    timings: Timings,
    grid: ResultGrid | None,
) -> SearchSummary:
    """The one ending of a search: interrupted (before or during the trials) or run to its end."""
    from distmis.tuning._deadline import deadline_reached

    config = plan.config
    budget = config.search.time_budget_seconds()
    out_of_time = grid is not None and deadline_reached(plan.out, budget)
    if grid is None or STOP_REQUESTED.is_set() or (unfinished_trials(grid) and not out_of_time):
        tracker.channel.wait_empty(config.tracking.final_flush_seconds)  # MLflow runs stay open for --resume
        if grid is None:
            print("distmis: stop requested before the trials started; --resume starts the search", flush=True)
        else:
            print(
                f"distmis: search interrupted; unfinished trials continue from their last checkpoint with: "
                f"{plan.resume_command}",
                flush=True,
            )
        summary = SearchSummary.interrupted_search(
            name=config.name,
            metric=config.search.metric,
            mode=config.search.mode,
            out=plan.out,
            started_at=timings.started,
        )
    else:
        if out_of_time:
            print(
                f"distmis: time budget {config.search.time_budget} reached: running trials were stopped and "
                f"kept; {unfinished_trials(grid) if grid is not None else 0} trial(s) did not start",
                flush=True,
            )
        with timings.phase("results"):
            timings.sum_trial_epochs(grid)
            summary = summarise(
                config, grid, plan.out, wall_seconds=_since(timings), prepared=prepared, started_at=timings.started
            )
        ray_here.close()  # the rest is this process's own work
        with timings.phase("plots_and_tracking_flush"):
            finish_search_tracking(tracker, config, plan.out, summary)
        summary.print(time_budget=config.search.time_budget if out_of_time else None)
    timings.write(plan.out / RunFile.TIMINGS)
    return summary


def _since(timings: Timings) -> float:
    return time.time() - timings.started
