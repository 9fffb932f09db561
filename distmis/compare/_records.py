"""What one mode of a comparison did, read from its search directory or from MLflow.

Both readers produce the same records, so ``distmis compare`` (files) and the notebook
(MLflow only) compute the same figures with the same code.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from distmis.documents import finite_or_none
from distmis.exceptions import TuningError
from distmis.metrics import VAL_DICE
from distmis.schema import RunFile, Tag
from distmis.search_summary import SearchSummaryFile, read_search_summary


@dataclass
class EpochPoint:
    time: float  # Unix seconds at the end of the epoch
    value: float  # the search metric
    samples: float  # training samples processed in the epoch (all workers)


@dataclass
class TrialRecord:
    trial_id: str
    params: dict[str, Any]
    status: str
    stopped_early: bool
    started: float | None
    finished: float | None
    epochs: list[EpochPoint] = field(default_factory=list)
    #: the slot's cold start-up (once per process / worker group), whether this trial found the
    #: slot warm, its own overhead (first epoch's end - trial start - first epoch), the slot's pid
    group_startup: float | None = None
    warm: bool | None = None
    overhead: float | None = None
    slot: str | None = None

    @property
    def samples(self) -> float:
        return sum(e.samples for e in self.epochs)


@dataclass
class ModeRecord:
    name: str
    workers_per_trial: int
    concurrent_trials: int
    cpus_per_worker: float
    gpus_per_worker: float
    started_at: float
    wall_seconds: float
    metric: str
    batch_size_per_replica: int
    lr_scaling: str
    steps_per_epoch: int | None
    max_concurrent_observed: int = 0
    trials: list[TrialRecord] = field(default_factory=list)

    @property
    def global_batch(self) -> int:
        return self.batch_size_per_replica * self.workers_per_trial

    @property
    def scaling(self) -> str:
        """Strong: an epoch is one pass over the training cases whatever the worker count
        (more workers take fewer, larger steps). Weak: a fixed ``steps_per_epoch``, so more
        workers process proportionally more samples per epoch."""
        return "strong" if self.steps_per_epoch is None else "weak"


def _epochs_from_csv(path: Path, metric: str) -> list[EpochPoint]:
    if not path.is_file():
        return []
    points = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            t, v = finite_or_none(row.get("finished_at")), finite_or_none(row.get(metric))
            sps, secs = finite_or_none(row.get("samples_per_second")), finite_or_none(row.get("train_seconds"))
            if t is None or v is None:
                continue
            points.append(EpochPoint(t, v, (sps or 0.0) * (secs or 0.0)))
    return points


def load_mode_dir(name: str, search_dir: Path) -> ModeRecord:
    """A finished search directory (summary.json, search.yaml, trials/<id>/metrics.csv).

    Raises:
        TuningError: its summary or search file is not what ``distmis tune`` writes (damaged, or edited
            by hand), naming the file: the mode is then run again with ``--resume`` once it is removed.
    """
    again = f"remove {search_dir} and run the comparison again with --resume to run this mode again"
    try:
        summary = read_search_summary(search_dir, error=TuningError)
    except TuningError as exc:
        raise TuningError(f"{exc}; {again}") from None
    search_file = search_dir / RunFile.SEARCH_FILE
    try:
        config = yaml.safe_load(search_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TuningError(f"{search_file}: not readable as the search's configuration ({exc})") from None
    try:
        return _mode_record(name, search_dir, summary, config)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TuningError(
            f"{search_file}: not the configuration a finished search ran ({type(exc).__name__}: {exc}); {again}"
        ) from None


def _mode_record(name: str, search_dir: Path, summary: SearchSummaryFile, config: Any) -> ModeRecord:
    par, train = config.get("parallelism", {}), config.get("train", {})
    metric = summary.metric
    trials = [
        TrialRecord(
            trial_id=t.trial_id,
            params=t.params,
            status=t.status,
            stopped_early=t.stopped_early,
            started=t.started_at,
            finished=t.finished_at,
            # only the epochs the search saw: a data-parallel trial's workers may finish the epoch in
            # flight after the scheduler stopped the trial; Tune (and MLflow) never get that result
            epochs=_epochs_from_csv(search_dir / RunFile.TRIALS_DIR / t.trial_id / RunFile.METRICS, metric)[: t.epochs],
            group_startup=finite_or_none(t.group_startup_seconds),
            warm=t.warm,
            overhead=finite_or_none(t.overhead_seconds),
            slot=None if t.pid is None else str(t.pid),
        )
        for t in summary.trials_detail
    ]
    return ModeRecord(
        name=name,
        workers_per_trial=int(par.get("workers_per_trial", 1)),
        concurrent_trials=int(config.get("search", {}).get("max_concurrent_trials") or 1),
        cpus_per_worker=float(par.get("cpus_per_worker", 1)),
        gpus_per_worker=float(par.get("gpus_per_worker", 0)),
        started_at=summary.started_at or 0.0,
        wall_seconds=summary.wall_seconds,
        metric=metric,
        batch_size_per_replica=int(train.get("batch_size_per_replica", 2)),
        lr_scaling=str(train.get("lr_scaling", "none")),
        steps_per_epoch=train.get("steps_per_epoch"),
        max_concurrent_observed=summary.max_concurrent_observed,
        trials=trials,
    )


# --------------------------------------------------------------------------- MLflow
def find_compare_run(client: Any, experiment: str | None = None, run_id: str | None = None) -> Any:
    """The comparison's parent run: ``run_id``, else the newest comparison run in ``experiment``
    (or in any experiment)."""
    if run_id:
        return client.get_run(run_id)
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        ids = [exp.experiment_id] if exp else []
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    runs = (
        client.search_runs(
            ids, "tags.`distmis.kind` = 'compare'", order_by=["attributes.start_time DESC"], max_results=1
        )
        if ids
        else []
    )
    if not runs:
        raise LookupError(f"no distmis comparison run in MLflow ({experiment or 'any experiment'})")
    return runs[0]


def _history(client: Any, run_id: str, key: str) -> dict[int, tuple[float, float]]:
    return {m.step: (m.timestamp / 1000.0, m.value) for m in client.get_metric_history(run_id, key)}


def load_modes_from_mlflow(client: Any, compare_run_id: str) -> dict[str, ModeRecord]:
    """Every mode of a comparison, rebuilt from its nested MLflow runs only."""
    from distmis.config import resolve_param_name

    compare = client.get_run(compare_run_id)
    exp = compare.info.experiment_id
    modes: dict[str, ModeRecord] = {}
    for run in client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{compare_run_id}'"):
        name = run.data.tags.get(Tag.COMPARE_MODE)
        if not name:
            continue
        p, m = run.data.params, run.data.metrics
        trials: list[TrialRecord] = []
        first_params: dict[str, str] = {}
        for child in client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{run.info.run_id}'"):
            tags = child.data.tags
            if Tag.TRIAL_ID not in tags:
                continue
            first_params = first_params or child.data.params
            values = _history(client, child.info.run_id, p.get("search.metric", VAL_DICE))
            sps = _history(client, child.info.run_id, "samples_per_second")
            secs = _history(client, child.info.run_id, "train_seconds")
            epochs = [
                EpochPoint(t, v, sps.get(step, (0, 0))[1] * secs.get(step, (0, 0))[1])
                for step, (t, v) in sorted(values.items())
            ]
            searched = [s.strip() for s in tags.get(Tag.SEARCHED, "").split(",") if s.strip()]
            params = {}
            for s in searched:
                try:
                    params[s] = child.data.params.get(resolve_param_name(s))
                except ValueError:  # not a configuration field (runs logged by older versions)
                    continue
            trials.append(
                TrialRecord(
                    trial_id=tags[Tag.TRIAL_ID],
                    params=params,
                    status=tags.get(Tag.STATUS, "?"),
                    stopped_early=tags.get(Tag.STOPPED_EARLY) == "true",
                    started=finite_or_none(tags.get(Tag.STARTED_AT)),
                    finished=finite_or_none(tags.get(Tag.FINISHED_AT)),
                    epochs=epochs,
                    group_startup=finite_or_none(tags.get(Tag.GROUP_STARTUP_SECONDS)),
                    warm=None if Tag.WARM not in tags else tags[Tag.WARM] == "true",
                    overhead=finite_or_none(tags.get(Tag.OVERHEAD_SECONDS)),
                    slot=tags.get(Tag.SLOT),
                )
            )
        steps = first_params.get("train.steps_per_epoch")
        modes[name] = ModeRecord(
            name=name,
            workers_per_trial=int(p.get("parallelism.workers_per_trial", 1)),
            concurrent_trials=int(finite_or_none(p.get("search.max_concurrent_trials")) or 1),
            cpus_per_worker=float(p.get("parallelism.cpus_per_worker", 1)),
            gpus_per_worker=float(p.get("parallelism.gpus_per_worker", 0)),
            started_at=float(m.get("started_at", run.info.start_time / 1000.0)),
            wall_seconds=float(m.get("wall_seconds", 0.0)),
            metric=p.get("search.metric", VAL_DICE),
            batch_size_per_replica=int(first_params.get("train.batch_size_per_replica", 2)),
            lr_scaling=first_params.get("train.lr_scaling", "none"),
            steps_per_epoch=None if steps in (None, "None") else int(steps),
            max_concurrent_observed=int(m.get("max_concurrent_trials_observed", 0)),
            trials=sorted(trials, key=lambda t: t.trial_id),
        )
    return modes
