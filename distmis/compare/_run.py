"""``distmis compare``: run the same configurations under each parallelism mode and report.

Comparison directory (``--out``, default ``runs/compare-<name>``)::

    compare.json        the plan: modes, slots, the fixed configurations, MLflow run
    configs/<mode>.yaml the search-space file each mode ran (``distmis tune`` accepts it)
    <mode>/             each mode's search directory (results.csv, summary.json, trials/ ...)
    logs/<mode>.log     each mode's console output
    comparison.json     every figure per mode (ModeStats) + the target and the checks
    comparison.csv      the same, one row per mode
    report.md, report.html, plots/{best_so_far,speedup,timeline}.png

Each mode runs as its own ``python -m distmis tune`` process: its own private Ray (or the
cluster at ``--address``/``RAY_ADDRESS``), exactly the code path of a user's search, and no
state carried from one mode to the next. ``--resume`` skips finished modes and resumes an
interrupted one.
"""

from __future__ import annotations

import csv
import io
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from distmis.compare._analysis import BASELINE, ModeStats, analyse, same_configurations
from distmis.compare._plan import MODES, ModePlan, fixed_points, mode_config, plan_modes
from distmis.compare._plan_record import CompareRecord, CompareTracking, ModePlanRecord
from distmis.compare._records import ModeRecord, load_mode_dir
from distmis.compare._report import make_plots, write_reports
from distmis.config import ExperimentConfig, load_config
from distmis.exceptions import TuningError
from distmis.files import OutputClaim, check_location, check_output, open_nofollow, write_json_atomic, write_text_atomic
from distmis.preflight import preflight
from distmis.redact import redact_uri
from distmis.schema import RunFile, Tag
from distmis.tensorflow_env import tensorflow_env
from distmis.tuning import check_resume_config, check_resumed_choices, read_recorded

PLAN_FILE = "compare.json"


@dataclass
class CompareResult:
    out: Path
    target: float | None
    stats: list[ModeStats]
    failed_modes: list[str] = field(default_factory=list)
    same_configurations: bool = True
    mlflow_run_id: str | None = None


def default_slots(cpus_per_worker: float, address: str | None) -> int:
    """Worker slots: the cluster's CPUs (or this machine's) / ``cpus_per_worker``."""
    if address or os.environ.get("RAY_ADDRESS"):
        from distmis.raysession import init_ray, shutdown_ray

        cpus = init_ray(address).get("CPU", 1.0)
        shutdown_ray()
    else:
        cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return max(1, int(math.floor(cpus / cpus_per_worker + 1e-9)))


def _run_mode(
    plan: ModePlan, config_path: Path, mode_dir: Path, log_path: Path, address: str | None, tracking_uri: str
) -> int:
    """Run one mode's search as a child ``distmis tune``; its output goes to the console and the log."""
    cmd = [sys.executable, "-m", "distmis", "tune", str(config_path), "--out", str(mode_dir)]
    if (mode_dir / "tune").exists():
        cmd.append("--resume")
    if address:
        cmd += ["--address", address]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        **tensorflow_env(),
        "MLFLOW_TRACKING_URI": tracking_uri,
    }
    with open_nofollow(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            print(f"[{plan.name}] {line}", end="", flush=True)
        return proc.wait()


class _CompareTracking:
    """The comparison's MLflow parent run; the modes' searches nest under it. Written through the
    tracking package's queue in ``out``, as a search's runs are."""

    def __init__(self, uri: str, experiment: str, out: Path) -> None:
        from distmis.tracking import RunWriter

        self.uri_with_credentials = uri  # given to the modes' searches, never written or printed
        self.uri, self.experiment = uri, experiment
        self.writer = RunWriter(uri, out)

    def start(self, name: str, params: dict[str, Any], run_id: str | None) -> str:
        tags = {Tag.KIND: "compare", Tag.ROLE: "compare"}
        return self.writer.open(self.experiment, f"compare-{name}", tags=tags, params=params, run_id=run_id)

    def tag_mode(self, mode_dir: Path, mode: str) -> None:
        from distmis.console import notify
        from distmis.exceptions import TrackingError
        from distmis.tracking import read_tracking_state

        try:
            state = read_tracking_state(mode_dir)
        except TrackingError as exc:
            notify(f"distmis: warning: the {mode} search's run is not tagged with its mode ({exc})")
            return
        if state is not None and state.parent_run_id:
            self.writer.set_tags({Tag.COMPARE_MODE: mode}, run_id=state.parent_run_id)

    def finish(
        self, stats: list[ModeStats], target: float | None, files: list[Path], ok: bool, wait_seconds: float
    ) -> None:
        metrics = {}
        for s in stats:
            for key in (
                "wall_seconds",
                "speedup",
                "efficiency",
                "trial_phase_speedup",
                "trials_per_hour",
                "samples_per_second",
                "best_value",
                "time_to_target_seconds",
            ):
                value = getattr(s, key)
                if value is not None and math.isfinite(value):
                    metrics[f"{s.mode}.{key}"] = float(value)
        if target is not None:
            metrics["target"] = float(target)
        self.writer.log_metrics(metrics)
        self.writer.log_files([p for p in files if p.suffix == ".png"], "plots")
        self.writer.log_files([p for p in files if p.suffix != ".png"])
        self.writer.close("FINISHED" if ok else "FAILED", wait_seconds)


def _stats_csv(stats: list[ModeStats]) -> str:
    buf = io.StringIO()
    rows = [s.as_dict() for s in stats]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["mode"])
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


@dataclass
class ComparePlan:
    """A comparison to run: the search-space file, the fixed configurations, the slots and modes.

    A new comparison makes it from the options; ``--resume`` reads it back from ``compare.json``,
    so a resumed comparison runs exactly what the interrupted one planned.
    """

    config: ExperimentConfig
    space_file: Path
    out: Path
    modes: list[str]
    points: list[dict[str, Any]]
    slots: int
    cpus: float
    gpus: float
    hybrid_workers: int | None
    baseline_trials: int
    target: float | None
    lr_scaling: str
    resume: bool
    recorded: CompareRecord | None = None  # compare.json of a resumed comparison

    @property
    def base_dir(self) -> Path:
        return self.space_file.resolve().parent

    @property
    def mode_plans(self) -> list[ModePlan]:
        return plan_modes(
            self.modes,
            workers=self.slots,
            points=self.points,
            hybrid_workers=self.hybrid_workers,
            baseline_trials=min(self.baseline_trials, len(self.points)),
            lr_scaling=self.lr_scaling,
        )

    def mode_config(self, plan: ModePlan, *, tracking_uri: str, experiment: str, parent: str | None) -> dict:
        return mode_config(
            self.config,
            plan,
            cpus_per_worker=self.cpus,
            gpus_per_worker=self.gpus,
            tracking_uri=tracking_uri,
            experiment=experiment,
            parent_run_id=parent,
            base_dir=self.base_dir,
        )

    def as_json(self, mlflow: CompareTracking) -> dict[str, Any]:
        """``compare.json`` (:class:`CompareRecord`)."""
        return CompareRecord(
            name=self.config.name,
            space_file=str(self.space_file.resolve()),
            modes=self.modes,
            slots=self.slots,
            cpus_per_worker=self.cpus,
            gpus_per_worker=self.gpus,
            hybrid_workers=self.hybrid_workers,
            baseline_trials=self.baseline_trials,
            target=self.target,
            points=self.points,
            lr_scaling=self.lr_scaling,
            plans=[
                ModePlanRecord(
                    name=p.name,
                    trials_at_once=p.concurrent_trials,
                    workers_per_trial=p.workers_per_trial,
                    configurations=len(p.points),
                )
                for p in self.mode_plans
            ],
            mlflow=mlflow,
        ).model_dump()


def plan_comparison(
    space_file: str | Path,
    *,
    modes: list[str] | None,
    budget: int | None,
    slots: int | None,
    cpus_per_worker: float | None,
    gpus_per_worker: float | None,
    hybrid_workers: int | None,
    baseline_trials: int | None,
    target: float | None,
    out: str | Path | None,
    resume: bool,
    address: str | None,
    lr_scaling: str | None,
) -> ComparePlan:
    """The comparison's plan: new from the options, or read back from ``compare.json`` on ``--resume``.

    An option left as ``None`` takes its default (new) or the recorded value (``resume``); one
    given with ``resume`` must equal the recorded value (``--target`` excepted).

    Raises:
        TuningError: an existing comparison without ``resume``, nothing to resume, an option given
            with ``resume`` that differs from the recorded comparison.
    """
    space_file = Path(space_file)
    config: ExperimentConfig = load_config(space_file, require_space=True)
    out_dir = Path(out or Path("runs") / f"compare-{config.name}").resolve()
    plan_path = out_dir / PLAN_FILE
    if plan_path.exists() and not resume:
        raise TuningError(
            f"{out_dir}: a comparison already exists here; pass --resume to finish it or choose another --out"
        )
    if resume and not plan_path.exists():
        raise TuningError(f"{out_dir}: no comparison to resume here (no {PLAN_FILE})")
    if resume:
        check_location(
            out_dir, what="comparison", resume_command=f"distmis compare {space_file} --out <original> --resume"
        )
        d = read_recorded(plan_path, what="comparison", model=CompareRecord)
        _check_resumed_options(plan_path, d, modes=modes, budget=budget, slots=slots, cpus_per_worker=cpus_per_worker,
                               gpus_per_worker=gpus_per_worker, hybrid_workers=hybrid_workers,
                               baseline_trials=baseline_trials, lr_scaling=lr_scaling)  # fmt: skip
        return ComparePlan(
            config, space_file, out_dir, d.modes, d.points, d.slots, d.cpus_per_worker, d.gpus_per_worker,
            d.hybrid_workers, d.baseline_trials, d.target if target is None else target, d.lr_scaling, resume=True,
            recorded=d,
        )  # fmt: skip
    cpus = cpus_per_worker if cpus_per_worker is not None else config.parallelism.cpus_per_worker
    gpus = gpus_per_worker if gpus_per_worker is not None else config.parallelism.gpus_per_worker
    points = fixed_points(config, budget or config.search.num_samples)
    return ComparePlan(
        config, space_file, out_dir, list(MODES) if modes is None else modes, points,
        slots or default_slots(cpus, address), cpus, gpus, hybrid_workers,
        DEFAULT_BASELINE_TRIALS if baseline_trials is None else baseline_trials, target, lr_scaling or "none",
        resume=False,
    )  # fmt: skip


DEFAULT_BASELINE_TRIALS = 2  # configurations run on one worker to anchor the speed-ups
#: a comparison's choices as typed on the command line, for errors (``--target`` may change on resume)
_OPTIONS = {"modes": "--modes", "budget": "--budget", "slots": "--slots", "cpus_per_worker": "--cpus-per-worker",
            "gpus_per_worker": "--gpus-per-worker", "hybrid_workers": "--hybrid-workers",
            "baseline_trials": "--baseline-trials", "lr_scaling": "--lr-scaling"}  # fmt: skip


def _check_resumed_options(plan_path: Path, recorded: CompareRecord, **given: Any) -> None:
    """Refuse options given with ``--resume`` that differ from ``compare.json``: the modes already run
    were run for the recorded ones. ``--target`` only changes the report, and may."""
    hybrid = next((p.workers_per_trial for p in recorded.plans if p.name == "hybrid"), None)
    chosen = {
        "modes": recorded.modes,
        "budget": len(recorded.points),
        "slots": recorded.slots,
        "cpus_per_worker": recorded.cpus_per_worker,
        "gpus_per_worker": recorded.gpus_per_worker,
        "hybrid_workers": recorded.hybrid_workers if recorded.hybrid_workers is not None else hybrid,
        "baseline_trials": recorded.baseline_trials,
        "lr_scaling": recorded.lr_scaling,
    }

    def spell(key: str, value: Any) -> str:
        if isinstance(value, list):
            return f"{_OPTIONS[key]} {','.join(value)}"
        if value is None:
            return f"{_OPTIONS[key]} not set"
        if isinstance(value, float):
            return f"{_OPTIONS[key]} {value:g}"
        return f"{_OPTIONS[key]} {value}"

    check_resumed_choices(plan_path, given, chosen, spell)


def check_comparison(plan: ComparePlan) -> None:
    """Every mode's search checked now, not in a subprocess minutes later; ``--out`` clear of the inputs."""
    config = plan.config
    source = None if config.data.source == "synthetic" else plan.base_dir / Path(config.data.source).expanduser()
    check_output(plan.out, option="--out", inputs={"search-space file": plan.space_file, "data source": source})
    for mode in plan.mode_plans:
        data = plan.mode_config(mode, tracking_uri="", experiment="", parent=None)
        preflight(
            ExperimentConfig.model_validate(data), path=f"{plan.space_file} ({mode.name} mode)", base_dir=plan.base_dir
        )


def _start(plan: ComparePlan, tracking_uri: str | None) -> tuple[_CompareTracking, str]:
    """Open (or reattach to) the comparison's MLflow run and write the plan (``compare.json``)."""
    from distmis.tracking import reattach_uri, resolve_tracking_uri

    config, recorded = plan.config, plan.recorded.mlflow if plan.recorded is not None else None
    uri = (
        reattach_uri(recorded.tracking_uri, tracking_uri, config.tracking.uri, plan.out)
        if recorded is not None and recorded.tracking_uri
        else resolve_tracking_uri(tracking_uri, config.tracking.uri, plan.out)
    )
    experiment = (recorded.experiment if recorded else "") or f"{config.tracking.experiment or config.name}-compare"
    tracking = _CompareTracking(uri, experiment, plan.out)
    hybrid = next((p.workers_per_trial for p in plan.mode_plans if p.name == "hybrid"), "")
    run_id = tracking.start(  # fails fast, before anything runs
        config.name,
        {
            "modes": ",".join(plan.modes),
            "slots": plan.slots,
            "cpus_per_worker": plan.cpus,
            "gpus_per_worker": plan.gpus,
            "budget": len(plan.points),
            "baseline_trials": min(plan.baseline_trials, len(plan.points)),
            "hybrid_workers": hybrid,
            "target": "" if plan.target is None else plan.target,
            "space_file": str(plan.space_file.resolve()),
            "lr_scaling": plan.lr_scaling,
        },
        recorded.run_id if recorded is not None else None,
    )
    mlflow = CompareTracking(tracking_uri=redact_uri(uri), experiment=experiment, run_id=run_id)
    write_json_atomic(plan.out / PLAN_FILE, plan.as_json(mlflow))
    print(
        f"distmis compare '{config.name}' -> {plan.out}: {len(plan.points)} configurations, {plan.slots} worker "
        f"slots of {plan.cpus:g} CPU / {plan.gpus:g} GPU; MLflow {redact_uri(uri)} (experiment '{experiment}', "
        f"run {run_id})",
        flush=True,
    )
    tracking.uri_with_credentials = uri
    return tracking, run_id


def run_compare(
    space_file: str | Path,
    *,
    modes: list[str] | None = None,
    budget: int | None = None,
    slots: int | None = None,
    cpus_per_worker: float | None = None,
    gpus_per_worker: float | None = None,
    hybrid_workers: int | None = None,
    baseline_trials: int | None = None,
    target: float | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    address: str | None = None,
    tracking_uri: str | None = None,
    lr_scaling: str | None = None,
) -> CompareResult:
    """Plan, run every mode, analyse, write the report and log everything under one MLflow run.

    ``None`` options take their defaults (all modes, 2 baseline trials, no learning-rate scaling),
    or on ``resume`` the recorded comparison's.

    Raises:
        ConfigError: a bad space file or mode plan. TuningError: an existing comparison without
        ``resume``. TrackingError: MLflow unreachable at start (before anything runs).
    """
    plan = plan_comparison(
        space_file,
        modes=modes,
        budget=budget,
        slots=slots,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        hybrid_workers=hybrid_workers,
        baseline_trials=baseline_trials,
        target=target,
        out=out,
        resume=resume,
        address=address,
        lr_scaling=lr_scaling,
    )
    if not plan.resume:
        check_comparison(plan)
    with OutputClaim(plan.out, command="compare", option="--out", new=not plan.resume) as claim:
        with claim.setting_up():
            if plan.resume:  # the same comparison, not another file's, on the same splits
                check_resume_config(plan.out, plan.config, plan.space_file, None)
                check_modes_splits(plan)
            else:
                write_text_atomic(plan.out / RunFile.SEARCH_FILE, plan.space_file.read_text(encoding="utf-8"))
            tracking, run_id = _start(plan, tracking_uri)
        records, failed = _run_modes(plan, tracking, run_id, address)
        return _conclude(plan, records, failed, tracking, run_id)


def check_modes_splits(plan: ComparePlan) -> None:
    """On ``--resume``: the data must still be split as when the modes' searches started (each
    recorded its ``splits.json``), or the modes would be compared on different validation cases.

    Raises:
        DataError: naming the cases that moved.
    """
    from distmis.data import (
        SPLITS_FILE,
        check_same_splits,
        load_manifest,
        read_search_splits,
        resolve_prepared,
    )

    started = [plan.out / m.name for m in plan.mode_plans if (plan.out / m.name / SPLITS_FILE).is_file()]
    if not started:
        return
    prepared = resolve_prepared(plan.config.data, base_dir=plan.space_file.resolve().parent)
    now = load_manifest(prepared).info.case_splits
    for mode_dir in started:
        recorded = read_search_splits(mode_dir)
        if recorded is not None:
            where = f"the comparison's {mode_dir.name} search ({mode_dir / SPLITS_FILE})"
            check_same_splits(recorded, now, recorded_in=where, data=prepared)


def _run_modes(
    plan: ComparePlan, tracking: _CompareTracking, run_id: str, address: str | None
) -> tuple[dict[str, ModeRecord], list[str]]:
    """Each mode's search as its own ``distmis tune`` (a finished one is not run again)."""
    records: dict[str, ModeRecord] = {}
    failed: list[str] = []
    for mode in plan.mode_plans:
        mode_dir = plan.out / mode.name
        if not (mode_dir / RunFile.SUMMARY).is_file():
            data = plan.mode_config(
                mode, tracking_uri=tracking.uri_with_credentials, experiment=tracking.experiment, parent=run_id
            )
            cfg_path = plan.out / "configs" / f"{mode.name}.yaml"
            write_text_atomic(cfg_path, yaml.safe_dump(data, sort_keys=False))
            print(
                f"== {mode.name}: {mode.concurrent_trials} trial(s) at once x {mode.workers_per_trial} worker(s), "
                f"{len(mode.points)} configuration(s)",
                flush=True,
            )
            started = time.time()
            log = plan.out / "logs" / f"{mode.name}.log"
            rc = _run_mode(mode, cfg_path, mode_dir, log, address, tracking.uri_with_credentials)
            print(f"== {mode.name}: exit {rc} after {time.time() - started:.1f} s", flush=True)
            if not (mode_dir / RunFile.SUMMARY).is_file():
                failed.append(mode.name)
                continue
        tracking.tag_mode(mode_dir, mode.name)
        records[mode.name] = load_mode_dir(mode.name, mode_dir)
    return records, failed


def _conclude(
    plan: ComparePlan,
    records: dict[str, ModeRecord],
    failed: list[str],
    tracking: _CompareTracking,
    run_id: str,
) -> CompareResult:
    """Analyse the modes, write the report and the figures, close the MLflow run."""
    out, metric = plan.out, plan.config.search.metric
    target_used, stats = analyse(records, slots=plan.slots, target=plan.target)
    same = same_configurations(records)
    plots = make_plots(records, stats, target_used, plan.points, plan.slots, out / "plots") if records else []
    target_source = (
        "--target" if plan.target is not None else "the baseline's best" if BASELINE in records
        else "the lowest best over the modes"
    )  # fmt: skip
    setup = {
        "slots": plan.slots,
        "cpus_per_worker": plan.cpus,
        "gpus_per_worker": plan.gpus,
        "budget": len(plan.points),
        "baseline_trials": min(plan.baseline_trials, len(plan.points)),
        "same_configurations": same,
        "target_source": target_source,
    }
    md, html = write_reports(
        out, name=plan.config.name, stats=stats, target=target_used, metric=metric, setup=setup, plots=plots
    )
    write_json_atomic(
        out / "comparison.json",
        {
            "name": plan.config.name,
            "metric": metric,
            "target": target_used,
            "target_source": target_source,
            "slots": plan.slots,
            "same_configurations": same,
            "failed_modes": failed,
            "configurations": {n: [t.params for t in r.trials] for n, r in records.items()},
            "modes": [s.as_dict() for s in stats],
        },
    )
    write_text_atomic(out / "comparison.csv", _stats_csv(stats))
    files = [md, html, out / "comparison.json", out / "comparison.csv", out / PLAN_FILE, *plots]
    tracking.finish(stats, target_used, files, ok=not failed, wait_seconds=plan.config.tracking.final_flush_seconds)
    return CompareResult(out, target_used, stats, failed, same, run_id)
