"""``distmis finalize``: from a search to a model to trust, in one tracked, resumable job.

Phases, composed as ``distmis tune`` composes them (:mod:`distmis.tuning`): checks, ownership of
``--out``, a Ray session, tracking, the fold trainings as trials, then what only a finalize does:
out-of-fold predictions, the choice by cross-validation, ``final/``, the report.

The K x F fold trainings are trials of one Tune run on the search's own parallelism (experiment,
data or hybrid) and warm workers: each trial trains one configuration on one fold (``data.fold``),
for every epoch (no scheduler: a fold model is a final model). Fold training is experiment
parallelism by nature: the K x F trainings are independent. ``--resume`` continues an interrupted
finalize (SIGUSR1 under SLURM exits 75 like ``tune``); Tune never reruns a finished fold, and
out-of-fold predictions already on disk are not made again.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distmis.config import ExperimentConfig
from distmis.files import OutputClaim, write_json_atomic
from distmis.finalize._cv import Selection, choose, out_of_fold, raw_cases, single_tables
from distmis.finalize._final import write_final
from distmis.finalize._plan import PLAN_FILE, FinalizeOptions, FinalizePlan, plan_finalize
from distmis.finalize._report import cv_metric, plots, print_cv_table, write_cv_csv, write_reports
from distmis.locks import reader_lock, source_lock
from distmis.raysession import RaySession, probe_address
from distmis.schema import RunFile, Tag
from distmis.space import sampled_params
from distmis.tensorflow_env import apply_tensorflow_env, tensorflow_env
from distmis.tracking import SearchTracker
from distmis.tuning import (
    STOP_REQUESTED,
    Timings,
    alive_nodes,
    build_tuner,
    fail_search_tracking,
    fit_quietly,
    plan_concurrency,
    start_ray_and_tracking,
    stop_on_signals,
    trial_context,
    trial_rows,
    tune_environment,
    unfinished_trials,
)


@dataclass
class FinalizeResult:
    out: Path
    final: Path | None
    selection: Selection | None = None
    tables: dict[str, Any] = field(default_factory=dict)
    failed_folds: list[str] = field(default_factory=list)
    interrupted: bool = False


def fold_config(plan: FinalizePlan) -> ExperimentConfig:
    """The configuration of the fold trainings: the search's, with one fixed point per (configuration, fold)."""
    data = plan.config.to_yaml_dict()
    points = [
        {**c.params, "data.fold": {"index": fold, "folds": plan.folds, "seed": plan.seed}}
        for c in plan.candidates
        for fold in range(plan.folds)
    ]
    data["name"] = f"{plan.config.name}-finalize"
    data["space"] = {}  # the points carry the parameters (and the fold) themselves
    data["search"].update(algorithm="points", points=points, num_samples=1, scheduler={"type": "none"})
    data["tracking"]["experiment"] = plan.search_tracking.experiment or plan.config.tracking.experiment
    data["tracking"]["parent_run_id"] = plan.search_tracking.parent_run_id
    return ExperimentConfig.model_validate(data)


def run_finalize(
    options: FinalizeOptions, *, address: str | None = None, tracking_uri: str | None = None, verbose: int = 0
) -> FinalizeResult:
    """Cross-validate the ``top`` configurations of the search in ``options.run`` on ``folds`` folds and
    write ``run/final/``; see the module docstring. A choice left as ``None`` takes
    :data:`~distmis.finalize._plan.DEFAULTS`, or on ``resume`` the recorded finalize's.

    Raises:
        TuningError: see :func:`plan_finalize`. TrackingError: MLflow unreachable at the start.
    """
    timings = Timings()
    with contextlib.ExitStack() as session:
        # the search is read under its own lock: a tune still writing it (or resumed meanwhile)
        # would hand finalize half its trials
        session.enter_context(source_lock(Path(options.run), command="finalize (reading the search)", option="RUN"))
        with timings.phase("checks"):
            plan = plan_finalize(options)
            config = fold_config(plan)
            check_finalize_store(plan, tracking_uri)
            probe_address(address)  # a dead address is named before the output is touched
            session.enter_context(reader_lock(plan.prepared, option="the search's data"))  # not replaced meanwhile
        tune_environment()
        apply_tensorflow_env()
        claim = session.enter_context(OutputClaim(plan.out, command="finalize", option="--out", new=not plan.resume))
        with claim.setting_up():
            if not plan.resume:
                write_json_atomic(plan.out / PLAN_FILE, plan.as_json())
            with timings.phase("ray_and_tracking_start"):
                ray_here, tracker, (_, concurrency) = start_ray_and_tracking(
                    session,
                    address,
                    env_vars={**tensorflow_env(), "PYTHONWARNINGS": "ignore::DeprecationWarning"},
                    open_tracking=lambda: start_finalize_tracking(plan, config, tracking_uri),
                    config=config,
                    check=lambda ray: plan_concurrency(config, ray.resources, alive_nodes()),
                )
        try:
            return _finalize(plan, config, tracker, ray_here, timings, concurrency, verbose)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            fail_search_tracking(tracker, config, f"{type(exc).__name__}: {exc}")
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def check_finalize_store(plan: FinalizePlan, tracking_uri: str | None) -> None:
    """Before anything trains: the finalize's run goes under the search's parent run, so into the
    search's own store; a ``--tracking-uri`` naming another store is refused, and so is a search
    whose local SQLite store is gone (a new, empty one would hold a run whose parent is nowhere).

    Raises:
        TrackingError: naming the store.
    """
    from distmis.exceptions import TrackingError
    from distmis.redact import redact_uri, without_redacted

    recorded = plan.search_tracking.tracking_uri
    if not recorded:
        return
    if tracking_uri and redact_uri(tracking_uri) != recorded:
        raise TrackingError(
            f"--tracking-uri {redact_uri(tracking_uri)}: the search's runs are in {recorded}, and the finalize's run "
            "nests under the search's; leave --tracking-uri out, or give the same store (with its credentials)"
        )
    if recorded.startswith("sqlite:///"):
        database = Path(without_redacted(recorded).removeprefix("sqlite:///"))
        if not database.is_file():
            raise TrackingError(
                f"{database}: the search's MLflow store is gone, so the finalize's run cannot go under the search's "
                "run; restore it, or finalize a search whose store exists"
            )


def start_finalize_tracking(plan: FinalizePlan, config: ExperimentConfig, tracking_uri: str | None) -> SearchTracker:
    """The finalize's MLflow run, nested under the search's parent run; its fold trainings nest under it."""
    from distmis.redact import redact_uri
    from distmis.tracking import reattach_uri, resolve_tracking_uri

    recorded = plan.search_tracking.tracking_uri
    uri = (
        reattach_uri(recorded, tracking_uri, config.tracking.uri, plan.run)
        if recorded
        else resolve_tracking_uri(tracking_uri, config.tracking.uri, plan.run)
    )
    tracker = SearchTracker(uri, config.tracking.experiment or plan.config.name, plan.out)
    tags = {Tag.ROLE: "finalize", Tag.OUT: str(plan.out)}
    if config.tracking.parent_run_id:
        tags["mlflow.parentRunId"] = config.tracking.parent_run_id
    params = {
        "finalize.top": str(len(plan.candidates)),
        "finalize.folds": str(plan.folds),
        "finalize.seed": str(plan.seed),
        "finalize.tta": str(plan.tta),
        "finalize.pairs": str(plan.pairs),
        "finalize.postprocess": str(plan.postprocess),
        "finalize.search": str(plan.run),
    }
    run_id = tracker.start(params=params, tags=tags, artifacts=[], run_name="finalize")
    print(f"distmis: tracking to MLflow {redact_uri(uri)} (finalize run {run_id}, under the search's run)", flush=True)
    return tracker


def _finalize(
    plan: FinalizePlan,
    config: ExperimentConfig,
    tracker: SearchTracker,
    ray_here: RaySession,
    timings: Timings,
    concurrency: int,
    verbose: int,
) -> FinalizeResult:
    print(
        f"distmis: finalize {plan.run} -> {plan.out}: {len(plan.candidates)} configuration(s) x {plan.folds} folds, "
        f"up to {concurrency} at once ({config.parallelism.mode} parallelism)",
        flush=True,
    )
    with timings.phase("tuner_setup"):
        context = trial_context(config, plan.prepared, plan.out)
        # a finalize stopped before Tune started has no experiment to restore: its trials start now
        restore = plan.resume and (plan.out / RunFile.TUNE_DIR).is_dir()
        tuner = build_tuner(
            config,
            plan.out,
            context,
            concurrency=concurrency,
            tracker=tracker,
            resume=restore,
            verbose=verbose,
            trial_label=FoldLabel.of_plan(plan),
        )
    grid = None
    if not STOP_REQUESTED.is_set():
        with timings.phase("trials"):
            grid = fit_quietly(tuner, plan.out / "tune.log", verbose=verbose, ray_here=ray_here)
    stop_on_signals()
    if grid is None or STOP_REQUESTED.is_set() or unfinished_trials(grid):
        tracker.channel.wait_empty(config.tracking.final_flush_seconds)  # the runs stay open for --resume
        print(f"distmis: finalize interrupted; continue it with: distmis finalize {plan.run} --resume", flush=True)
        timings.write(plan.out / RunFile.TIMINGS)
        return FinalizeResult(plan.out, None, interrupted=True)
    fold_models, failed = _fold_models(plan, grid, config)
    if failed:
        tracker.finish(metrics={}, tags={Tag.ERROR: f"fold trainings failed: {failed}"}, plots=[], files=[],
                       status="FAILED", wait_seconds=config.tracking.final_flush_seconds)  # fmt: skip
        return FinalizeResult(plan.out, None, failed_folds=failed)
    try:
        return _conclude(plan, config, tracker, timings, fold_models)
    except _StopRequested:
        tracker.channel.wait_empty(config.tracking.final_flush_seconds)  # the runs stay open for --resume
        print(f"distmis: finalize interrupted; continue it with: distmis finalize {plan.run} --resume", flush=True)
        timings.write(plan.out / RunFile.TIMINGS)
        return FinalizeResult(plan.out, None, interrupted=True)


class _StopRequested(Exception):
    """Ctrl-C or the wall-time warning after the folds trained: stop between two steps (what is
    done is on disk, and ``--resume`` goes on from there)."""


def _unless_stopped() -> None:
    if STOP_REQUESTED.is_set():
        raise _StopRequested


def _fold_models(
    plan: FinalizePlan, grid: Any, config: ExperimentConfig
) -> tuple[dict[tuple[str, int], Path], list[str]]:
    """(configuration, fold) -> the fold model's ``best/``; and the fold trainings without a model."""
    label = FoldLabel.of_plan(plan)
    models: dict[tuple[str, int], Path] = {}
    failed: dict[tuple[str, int], str] = {}
    for row in trial_rows(grid, config):
        name, fold = label.key(row.params)
        if fold is None:
            raise KeyError(f"trial {row.trial_id} has no data.fold")  # every finalize trial is one fold's
        key = (name, fold)
        best = plan.out / RunFile.TRIALS_DIR / row.trial_id / "best"
        if row.status == "TERMINATED" and (best / RunFile.WEIGHTS).is_file():
            models[key] = best
        else:
            failed[key] = f"{key[0]} fold {fold} ({row.trial_id}: {row.error or 'no model written'})"
    for name, fold in sorted({(c.name, f) for c in plan.candidates for f in range(plan.folds)} - set(models)):
        failed.setdefault((name, fold), f"{name} fold {fold} (never trained)")
    return models, sorted(failed.values())


def _conclude(
    plan: FinalizePlan,
    config: ExperimentConfig,
    tracker: SearchTracker,
    timings: Timings,
    fold_models: dict[tuple[str, int], Path],
) -> FinalizeResult:
    """Out-of-fold predictions, the choice, ``final/``, the report, the MLflow run's end."""
    from distmis.inference import read_model_record

    _unless_stopped()
    with timings.phase("out_of_fold"):
        cases = raw_cases(plan)
        oof = _out_of_fold_shown(plan, fold_models, cases)
    _unless_stopped()
    with timings.phase("selection"):
        record = read_model_record(next(iter(fold_models.values())))
        tables, per_case = single_tables(plan, record, cases, oof)
        selection = choose(plan, record, cases, oof, tables)
        final = write_final(plan, selection, fold_models)
    with timings.phase("reports"):
        csv_path = write_cv_csv(plan, per_case)
        pictures = plots(plan, tables, per_case)
        md, html = write_reports(plan, tables, selection, pictures)
    with timings.phase("tracking_flush"):
        _finish_tracking(
            plan, config, tracker, tables, selection, [md, html, csv_path, final / RunFile.SELECTION], pictures
        )
    timings.write(plan.out / RunFile.TIMINGS)
    print_cv_table(plan, tables, selection)
    return FinalizeResult(plan.out, final, selection, tables)


def _out_of_fold_shown(
    plan: FinalizePlan, fold_models: dict[tuple[str, int], Path], cases: dict[str, Any]
) -> dict[str, dict[str, Path]]:
    """:func:`out_of_fold` with a progress bar on the console and one line per case in ``finalize.log``."""
    from distmis.console import progress_bar
    from distmis.links import open_nofollow

    log = plan.out / RunFile.FINALIZE_LOG
    with progress_bar("out-of-fold predictions") as update, open_nofollow(log, "a", encoding="utf-8") as fh:

        def progress(done: int, total: int, what: str) -> None:
            fh.write(f"out of fold: {what}\n")
            fh.flush()
            update(done, total)
            _unless_stopped()

        oof = out_of_fold(plan, fold_models, cases, progress=progress)
    print(f"distmis: out-of-fold predictions of every case: {log}", flush=True)
    return oof


@dataclass(frozen=True)
class FoldLabel:
    """A finalize trial's name, ``c0/fold1``: its configuration and fold, as the report names them.

    Tune's trial ids (``ce109_00001``) say neither; this names the live view's rows and the
    MLflow runs. Picklable: Tune keeps its callbacks in the experiment state.
    """

    names: dict[str, str]  # the configuration's parameters as sorted JSON -> its name

    @classmethod
    def of_plan(cls, plan: FinalizePlan) -> FoldLabel:
        return cls({json.dumps(c.params, sort_keys=True): c.name for c in plan.candidates})

    def key(self, trial_config: dict[str, Any]) -> tuple[str, int | None]:
        """(configuration name, fold index) of a trial's config or sampled parameters."""
        params = dict(sampled_params(trial_config))
        fold = params.pop("data.fold", None)
        index = int(fold["index"]) if isinstance(fold, dict) and "index" in fold else None
        return self.names.get(json.dumps(params, sort_keys=True), "?"), index

    def __call__(self, trial_config: dict[str, Any]) -> str:
        name, fold = self.key(trial_config)
        return name if fold is None else f"{name}/fold{fold}"


def _finish_tracking(
    plan: FinalizePlan,
    config: ExperimentConfig,
    tracker: SearchTracker,
    tables: dict[str, Any],
    selection: Selection,
    files: list[Path],
    pictures: list[Path],
) -> None:
    key = cv_metric(plan.config.search.metric)
    metrics: dict[str, float] = {}
    for c in plan.candidates:
        for metric, row in tables[c.name].items():
            metrics[f"{c.name}.cv_{metric}_mean"] = row["mean"]
            metrics[f"{c.name}.cv_{metric}_std"] = row["std"]
        if key and key in tables[c.name]:
            metrics[f"{c.name}.selection_bias"] = c.search_value - tables[c.name][key]["mean"]
    for metric, row in selection.cv.items():
        metrics[f"final.cv_{metric}_mean"] = row["mean"]
    tracker = SearchTracker(tracker.uri, tracker.experiment, plan.out)  # fresh: the callback's state is on disk
    done = tracker.finish(
        metrics={k: v for k, v in metrics.items() if math.isfinite(v)},
        tags={
            Tag.FINAL_MEMBERS: "+".join(selection.members),
            Tag.LARGEST_COMPONENT: ",".join(n for n, _ in selection.largest_component),
            "mlflow.note.content": f"Chosen by {plan.folds}-fold cross-validation: {' + '.join(selection.members)}; "
            f"the model is {plan.final}.",
        },
        plots=pictures,
        files=[f for f in files if f.is_file()],
        status="FINISHED",
        wait_seconds=config.tracking.final_flush_seconds,
    )
    if not done:
        print(f"distmis: warning: MLflow still unreachable; tracking kept in {plan.out}", flush=True)


__all__ = ["FinalizeResult", "FoldLabel", "fold_config", "run_finalize"]
