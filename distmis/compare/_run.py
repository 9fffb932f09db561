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

import contextlib
import csv
import io
import json
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
from distmis.compare._plan import ModePlan, fixed_points, mode_config, plan_modes
from distmis.compare._records import ModeRecord, load_mode_dir
from distmis.compare._report import make_plots, write_reports
from distmis.config import ExperimentConfig, load_config
from distmis.exceptions import TrackingError, TuningError
from distmis.files import check_output, owned_output_directory, write_json_atomic, write_text_atomic
from distmis.preflight import preflight
from distmis.tensorflow_env import tensorflow_env
from distmis.tracking import redact_uri

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
        import ray

        from distmis.tuning._ray import init_ray

        cpus = init_ray(address).get("CPU", 1.0)
        ray.shutdown()
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
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            print(f"[{plan.name}] {line}", end="", flush=True)
        return proc.wait()


class _CompareTracking:
    """The comparison's MLflow parent run; the modes' searches nest under it."""

    def __init__(self, uri: str, experiment: str) -> None:
        from distmis.tracking import experiment_id, mlflow_client

        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.uri, self.experiment = uri, experiment
        self.client = mlflow_client(uri)
        try:
            self.experiment_id = experiment_id(self.client, uri, experiment)
        except Exception as exc:  # noqa: BLE001
            raise TrackingError(
                f"MLflow tracking store {redact_uri(uri)} is unreachable or unusable: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300]}"
            ) from None

    def start(self, name: str, params: dict[str, Any], run_id: str | None) -> str:
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        run = self.client.create_run(
            self.experiment_id, run_name=f"compare-{name}", tags={"distmis.kind": "compare", "distmis.role": "compare"}
        )
        for k, v in params.items():
            self.client.log_param(run.info.run_id, k, v)
        return run.info.run_id

    def tag_mode(self, mode_dir: Path, mode: str) -> None:
        state = mode_dir / "mlflow.json"
        if state.is_file():
            search_run = json.loads(state.read_text())["parent_run_id"]
            self.client.set_tag(search_run, "distmis.compare_mode", mode)

    def finish(self, run_id: str, stats: list[ModeStats], target: float | None, files: list[Path], ok: bool) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
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
                    metrics.append(Metric(f"{s.mode}.{key}", float(value), now, 0))
        if target is not None:
            metrics.append(Metric("target", float(target), now, 0))
        self.client.log_batch(run_id, metrics=metrics)
        for path in files:
            self.client.log_artifact(run_id, str(path), "plots" if path.suffix == ".png" else None)
        self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED")


def _stats_csv(stats: list[ModeStats]) -> str:
    buf = io.StringIO()
    rows = [s.as_dict() for s in stats]
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["mode"])
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _start(
    config: ExperimentConfig,
    space_file: Path,
    out: Path,
    plan_data: dict[str, Any],
    plans: list[ModePlan],
    modes: list[str],
    points: list[dict[str, Any]],
    slots: int,
    cpus: float,
    gpus: float,
    hybrid_workers: int | None,
    baseline_trials: int,
    target: float | None,
    tracking_uri: str | None,
    lr_scaling: str,
) -> tuple[_CompareTracking, str, dict[str, Any], str, str]:
    """Open (or reattach to) the comparison's MLflow run and write the plan (``compare.json``)."""
    from distmis.tracking import reattach_uri, resolve_tracking_uri

    recorded = plan_data.get("mlflow", {}).get("tracking_uri")
    uri = (
        reattach_uri(recorded, tracking_uri, config.tracking.uri, out)
        if recorded
        else resolve_tracking_uri(tracking_uri, config.tracking.uri, out)
    )
    experiment = plan_data.get("mlflow", {}).get("experiment") or f"{config.tracking.experiment or config.name}-compare"
    tracking = _CompareTracking(uri, experiment)  # fails fast, before anything runs
    run_id = tracking.start(
        config.name,
        {
            "modes": ",".join(modes),
            "slots": slots,
            "cpus_per_worker": cpus,
            "gpus_per_worker": gpus,
            "budget": len(points),
            "baseline_trials": min(baseline_trials, len(points)),
            "hybrid_workers": next((p.workers_per_trial for p in plans if p.name == "hybrid"), ""),
            "target": "" if target is None else target,
            "space_file": str(space_file.resolve()),
            "lr_scaling": lr_scaling,
        },
        plan_data.get("mlflow", {}).get("run_id"),
    )
    plan_data = {
        "name": config.name,
        "space_file": str(space_file.resolve()),
        "modes": modes,
        "slots": slots,
        "cpus_per_worker": cpus,
        "gpus_per_worker": gpus,
        "hybrid_workers": hybrid_workers,
        "baseline_trials": baseline_trials,
        "target": target,
        "points": points,
        "lr_scaling": lr_scaling,
        "plans": [
            {
                "name": p.name,
                "trials_at_once": p.concurrent_trials,
                "workers_per_trial": p.workers_per_trial,
                "configurations": len(p.points),
            }
            for p in plans
        ],
        "mlflow": {"tracking_uri": redact_uri(uri), "experiment": experiment, "run_id": run_id},
    }
    write_json_atomic(out / PLAN_FILE, plan_data)
    print(
        f"distmis compare '{config.name}' -> {out}: {len(points)} configurations, {slots} worker slots of "
        f"{cpus:g} CPU / {gpus:g} GPU; MLflow {redact_uri(uri)} (experiment '{experiment}', run {run_id})",
        flush=True,
    )
    return tracking, run_id, plan_data, uri, experiment


def run_compare(
    space_file: str | Path,
    *,
    modes: list[str],
    budget: int | None = None,
    slots: int | None = None,
    cpus_per_worker: float | None = None,
    gpus_per_worker: float | None = None,
    hybrid_workers: int | None = None,
    baseline_trials: int = 2,
    target: float | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    address: str | None = None,
    tracking_uri: str | None = None,
    lr_scaling: str = "none",
) -> CompareResult:
    """Plan, run every mode, analyse, write the report and log everything under one MLflow run.

    Raises:
        ConfigError: a bad space file or mode plan. TuningError: an existing comparison without
        ``resume``. TrackingError: MLflow unreachable at start (before anything runs).
    """
    space_file = Path(space_file)
    config: ExperimentConfig = load_config(space_file, require_space=True)
    out = Path(out or Path("runs") / f"compare-{config.name}").resolve()
    plan_path = out / PLAN_FILE
    if plan_path.exists() and not resume:
        raise TuningError(
            f"{out}: a comparison already exists here; pass --resume to finish it or choose another --out"
        )
    if resume and not plan_path.exists():
        raise TuningError(f"{out}: no comparison to resume here (no {PLAN_FILE})")
    par = config.parallelism
    cpus = cpus_per_worker if cpus_per_worker is not None else par.cpus_per_worker
    gpus = gpus_per_worker if gpus_per_worker is not None else par.gpus_per_worker

    if resume:
        plan_data = json.loads(plan_path.read_text(encoding="utf-8"))
        points, slots, cpus, gpus = (
            plan_data["points"],
            plan_data["slots"],
            plan_data["cpus_per_worker"],
            plan_data["gpus_per_worker"],
        )
        modes, hybrid_workers, baseline_trials = (
            plan_data["modes"],
            plan_data["hybrid_workers"],
            plan_data["baseline_trials"],
        )
        lr_scaling = plan_data.get("lr_scaling", "none")
        target = plan_data["target"] if target is None else target
    else:
        budget = budget or config.search.num_samples
        points = fixed_points(config, budget)
        slots = slots or default_slots(cpus, address)
        plan_data = {}
    plans = plan_modes(
        modes,
        workers=slots,
        points=points,
        hybrid_workers=hybrid_workers,
        baseline_trials=min(baseline_trials, len(points)),
        lr_scaling=lr_scaling,
    )
    base_dir = space_file.resolve().parent
    if not resume:  # every mode's search checked now, not in a subprocess minutes later
        source = None if config.data.source == "synthetic" else base_dir / Path(config.data.source).expanduser()
        check_output(out, option="--out", inputs={"search-space file": space_file, "data source": source})
        for plan in plans:
            data = mode_config(
                config,
                plan,
                cpus_per_worker=cpus,
                gpus_per_worker=gpus,
                tracking_uri="",
                experiment="",
                parent_run_id=None,
                base_dir=base_dir,
            )
            preflight(ExperimentConfig.model_validate(data), path=f"{space_file} ({plan.name} mode)", base_dir=base_dir)
    with contextlib.nullcontext(out) if resume else owned_output_directory(out, command="compare", option="--out"):
        tracking, run_id, plan_data, uri, experiment = _start(
            config,
            space_file,
            out,
            plan_data,
            plans,
            modes,
            points,
            slots,
            cpus,
            gpus,
            hybrid_workers,
            baseline_trials,
            target,
            tracking_uri,
            lr_scaling,
        )
    records: dict[str, ModeRecord] = {}
    failed: list[str] = []
    for plan in plans:
        mode_dir = out / plan.name
        if not (mode_dir / "summary.json").is_file():
            data = mode_config(
                config,
                plan,
                cpus_per_worker=cpus,
                gpus_per_worker=gpus,
                tracking_uri=uri,
                experiment=experiment,
                parent_run_id=run_id,
                base_dir=base_dir,
            )
            cfg_path = out / "configs" / f"{plan.name}.yaml"
            write_text_atomic(cfg_path, yaml.safe_dump(data, sort_keys=False))
            print(
                f"== {plan.name}: {plan.concurrent_trials} trial(s) at once x {plan.workers_per_trial} worker(s), "
                f"{len(plan.points)} configuration(s)",
                flush=True,
            )
            started = time.time()
            rc = _run_mode(plan, cfg_path, mode_dir, out / "logs" / f"{plan.name}.log", address, uri)
            print(f"== {plan.name}: exit {rc} after {time.time() - started:.1f} s", flush=True)
            if not (mode_dir / "summary.json").is_file():
                failed.append(plan.name)
                continue
        tracking.tag_mode(mode_dir, plan.name)
        records[plan.name] = load_mode_dir(plan.name, mode_dir)

    target_used, stats = analyse(records, slots=slots, target=target)
    same = same_configurations(records)
    plots = make_plots(records, stats, target_used, points, slots, out / "plots") if records else []
    metric = config.search.metric
    target_source = (
        "--target"
        if target is not None
        else "the baseline's best"
        if BASELINE in records
        else "the lowest best over the modes"
    )
    md, html = write_reports(
        out,
        name=config.name,
        stats=stats,
        target=target_used,
        metric=metric,
        info={
            "slots": slots,
            "cpus_per_worker": cpus,
            "gpus_per_worker": gpus,
            "budget": len(points),
            "baseline_trials": min(baseline_trials, len(points)),
            "same_configurations": same,
            "target_source": target_source,
        },
        plots=plots,
    )
    write_json_atomic(
        out / "comparison.json",
        {
            "name": config.name,
            "metric": metric,
            "target": target_used,
            "target_source": target_source,
            "slots": slots,
            "same_configurations": same,
            "failed_modes": failed,
            "configurations": {n: [t.params for t in r.trials] for n, r in records.items()},
            "modes": [s.as_dict() for s in stats],
        },
    )
    write_text_atomic(out / "comparison.csv", _stats_csv(stats))
    tracking.finish(
        run_id,
        stats,
        target_used,
        [md, html, out / "comparison.json", out / "comparison.csv", plan_path, *plots],
        ok=not failed,
    )
    return CompareResult(out, target_used, stats, failed, same, run_id)
