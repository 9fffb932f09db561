"""Real Ray Tune searches on this machine: results, concurrency, grid, resume after kill -9, ray job submit."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _support.processes import descendants, processes_under, stop_tree
from _support.raycluster import RayHead, clean_env, stop_group
from _support.studies import journal_study

from distmis.config import ExperimentConfig, load_config
from distmis.data import load_manifest
from distmis.files import TEMPORARY_PREFIX, temporary_sibling
from distmis.space import grid_points
from distmis.training import Trainer
from distmis.tuning import run_search

pytestmark = pytest.mark.slow


def space_file(
    tmp: Path,
    prepared: Path,
    *,
    name: str,
    algorithm: str = "optuna",
    samples: int = 4,
    epochs: int = 3,
    scheduler: dict | None = None,
    space: dict | None = None,
    concurrency: int = 2,
    steps_per_epoch: int | None = None,
    points: list[dict] | None = None,
) -> Path:
    doc = {
        "name": name,
        "data": {"source": str(prepared)},
        "train": {
            "epochs": epochs,
            "batch_size_per_replica": 2,
            "augment": {"flip": False, "intensity": 0.0},
            "steps_per_epoch": steps_per_epoch,
        },
        "model": {"depth": 3, "filters": 8},
        "search": {
            "algorithm": algorithm,
            "metric": "val_dice",
            "mode": "max",
            "num_samples": samples,
            "max_concurrent_trials": concurrency,
            "seed": 0,
            "scheduler": scheduler or {"type": "none"},
            **({"points": points} if points else {}),
        },
        "space": space
        or {
            "lr": {"loguniform": [3.0e-3, 2.0e-2]},
            "norm": {"choice": ["batch", "group", "none"]},
            "groups": {"choice": [2, 4], "when": {"norm": "group"}},
            "amsgrad": {"choice": [True, False]},
        },
        "parallelism": {"mode": "experiment", "workers_per_trial": 1, "cpus_per_worker": 1},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def read_results(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def local_ray():
    yield
    from distmis.raysession import shutdown_ray

    shutdown_ray()


def test_search_completes_concurrently_and_beats_untrained(prepared16: Path, tmp_path: Path, local_ray: None) -> None:
    path = space_file(
        tmp_path,
        prepared16,
        name="qs",
        samples=4,
        epochs=3,
        scheduler={"type": "asha", "grace_period": 2, "reduction_factor": 2},
    )
    config = load_config(path, require_space=True)
    out = tmp_path / "out"
    summary = run_search(config, space_file=path, out=out, verbose=0)

    rows = read_results(out)
    assert len(rows) == 4 and summary.trials == 4 and summary.failed == 0
    assert all(r["status"] == "TERMINATED" for r in rows)
    # concurrency is real: two 1-CPU trials ran at the same time on 2 CPUs (Ray PR #63770)
    assert summary.max_concurrent_observed >= 2, rows
    intervals = sorted((float(r["started_at"]), float(r["finished_at"])) for r in rows)
    assert any(b[0] < a[1] for a, b in zip(intervals, intervals[1:], strict=False))
    # conditional parameter only where its condition holds
    for r in rows:
        assert (r["groups"] != "") == (r["norm"] == "group")
    # better than an untrained model on the same validation cases
    untrained = Trainer(
        ExperimentConfig.model_validate({**config.to_yaml_dict(), "space": {}}), load_manifest(prepared16)
    ).evaluate()[0]["val_dice"]
    assert summary.best_value is not None and summary.best_value > untrained + 0.05, (summary.best_value, untrained)
    # outputs a user looks at
    best = load_config(out / "best.yaml")
    assert best.optimizer.lr == pytest.approx(summary.best_params["lr"])
    assert (out / "best" / "weights.npz").is_file() and (out / "optuna.journal").is_file()
    assert (out / "search.yaml").read_text() == path.read_text()
    timings = json.loads((out / "timings.json").read_text())  # what validation cost the search
    assert timings["summed_trial_validation_seconds"] > 0 and timings["summed_trial_train_seconds"] > 0, timings
    for r in rows:
        epochs = [int(x["epoch"]) for x in csv.DictReader(open(out / "trials" / r["trial_id"] / "metrics.csv"))]
        assert epochs == list(range(1, int(r["epochs"]) + 1))


def test_grid_runs_exactly_the_grid(prepared16: Path, tmp_path: Path, local_ray: None) -> None:
    space = {"norm": {"choice": ["batch", "none"]}, "amsgrad": {"choice": [True, False]}}
    path = space_file(tmp_path, prepared16, name="grid", algorithm="grid", samples=1, epochs=1, space=space)
    config = load_config(path, require_space=True)
    run_search(config, space_file=path, out=tmp_path / "out", verbose=0)
    rows = read_results(tmp_path / "out")
    got = sorted((r["norm"], r["amsgrad"]) for r in rows)
    expected = sorted((p["norm"], str(p["amsgrad"])) for p in grid_points(config.space))
    assert got == expected and len(got) == 4


def _distmis(*args: str, env: dict[str, str], **kw: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distmis", *args], env=env, start_new_session=True, **kw)


def test_resume_after_kill_9(prepared16: Path, tmp_path: Path) -> None:
    path = space_file(
        tmp_path,
        prepared16,
        name="rs",
        algorithm="random",
        samples=4,
        epochs=3,
        concurrency=1,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "out"
    env = clean_env(PYTHONUNBUFFERED="1")
    log = open(tmp_path / "first.log", "w")
    proc = _distmis("tune", str(path), "--out", str(out), env=env, stdout=log, stderr=subprocess.STDOUT)
    finished: dict[str, float] = {}
    tree: set[int] = set()
    deadline = time.monotonic() + 240
    try:
        # wait until one trial has finished all its epochs and a later one has started
        while time.monotonic() < deadline and proc.poll() is None:
            runs = sorted((out / "trials").glob("*/metrics.csv")) if (out / "trials").exists() else []
            done = [m for m in runs if len(list(csv.DictReader(open(m)))) == 3]
            if done and len(runs) >= 2:
                finished = {str(m): m.read_text() for m in done}
                break
            time.sleep(0.3)
        assert finished, f"no trial finished in time; see {log.name}"
        tree = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the driver dies without any cleanup
        proc.wait(timeout=30)
    finally:
        stop_group(proc, timeout=5)  # then the orphaned local Ray of that driver
        stop_tree(tree)  # and its workers, each in a process group of its own
        log.close()

    # without --resume: refused, nothing overwritten
    refused = subprocess.run(
        [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--resume" in refused.stderr
    # what a kill in the middle of one of Tune's writes leaves beside the state (see test_storage)
    orphan = temporary_sibling(out / "tune" / "experiment_state-2026-11-25_00-00-00.json")
    orphan.write_bytes(b'{"cut sh')

    with open(tmp_path / "resume.log", "w") as log2:
        resumed = _distmis(
            "tune", str(path), "--out", str(out), "--resume", env=env, stdout=log2, stderr=subprocess.STDOUT
        )
        try:
            assert resumed.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()[-3000:]
        finally:
            stop_group(resumed, timeout=5)
    rows = read_results(out)
    assert len(rows) == 4 and all(r["status"] == "TERMINATED" and r["epochs"] == "3" for r in rows), rows
    assert not orphan.exists() and not list((out / "tune").rglob(f"{TEMPORARY_PREFIX}*"))
    for m, text in finished.items():  # finished trials were not re-run
        assert Path(m).read_text() == text
    for r in rows:  # no epoch lost or logged twice
        epochs = [int(x["epoch"]) for x in csv.DictReader(open(out / "trials" / r["trial_id"] / "metrics.csv"))]
        assert epochs == [1, 2, 3], (r["trial_id"], epochs)
    # MLflow (default local store beside the experiment): the resume reattached to the same
    # parent and child runs, no duplicate run and no epoch logged twice
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rs")
    runs = client.search_runs([exp.experiment_id])
    parents = [x for x in runs if x.data.tags.get("distmis.role") == "search"]
    # a trial started in the instant before the kill, not yet in Tune's snapshot, is re-sampled
    # on resume; its run (if any) is closed as KILLED and tagged abandoned, not counted twice
    abandoned = [x for x in runs if x.data.tags.get("distmis.abandoned") == "true"]
    assert all(x.info.status == "KILLED" for x in abandoned)
    children = [x for x in runs if "mlflow.parentRunId" in x.data.tags and x not in abandoned]
    assert len(parents) == 1 and len(children) == 4 and len(runs) == 5 + len(abandoned)
    assert {c.data.tags["distmis.trial_id"] for c in children} == {r["trial_id"] for r in rows}
    for c in children:
        assert sorted(m.step for m in client.get_metric_history(c.info.run_id, "val_dice")) == [1, 2, 3]
    # the searcher came back with Tune's state: the trial cut short by the kill went on reporting into
    # the same Optuna trial, and the sampler went on from its saved random state (a sampler started
    # again from its seed would draw trial 0's learning rate once more)
    study = journal_study(out / "optuna.journal")
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 4, [(t.number, t.state.name) for t in study.trials]
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in study.trials)  # FAIL: a trial Tune never saved
    for t in done:
        assert sorted(t.intermediate_values) == [1, 2, 3], (t.number, t.intermediate_values)
    lrs = sorted(round(float(r["lr"]), 12) for r in rows)
    assert sorted(round(t.params["lr"], 12) for t in done) == lrs and len(set(lrs)) == 4


def test_ray_job_submit_to_existing_cluster(prepared16: Path, tmp_path: Path) -> None:
    head = RayHead(tmp_path, host="127.0.0.11", num_cpus=2)
    try:
        path = space_file(
            tmp_path,
            prepared16,
            name="job",
            algorithm="random",
            samples=2,
            epochs=1,
            space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
        )
        out = tmp_path / "out"
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "ray"),
                "job",
                "submit",
                "--address",
                head.dashboard,
                "--",
                sys.executable,
                "-m",
                "distmis",
                "tune",
                str(path),
                "--out",
                str(out),
            ],
            env=head.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "succeeded" in result.stdout + result.stderr
        rows = read_results(out)
        assert len(rows) == 2 and all(r["status"] == "TERMINATED" for r in rows)
        # the trials ran on the existing cluster (its node address), not on a new local one
        detail = yaml.safe_load((out / "summary.json").read_text())
        assert detail["trials"] == 2
    finally:
        head.stop()
    assert not Path(head.temp_dir).exists()


def _trial_actor_pids(search: subprocess.Popen) -> list[int]:
    """The trial actors of the search ``search`` started (Tune names them after the wrapper)."""
    return processes_under(search.pid, b"ray::distmis_trial", b"ray::ResourceTrainable")


def test_failed_trial_restarts_from_its_last_checkpoint(prepared16: Path, tmp_path: Path) -> None:
    """kill -9 the trial's process after a registered checkpoint: Tune restarts it from that checkpoint."""
    path = space_file(
        tmp_path,
        prepared16,
        name="fail",
        algorithm="random",
        samples=1,
        epochs=4,
        concurrency=1,
        steps_per_epoch=40,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "out"
    log = open(tmp_path / "search.log", "w")
    proc = _distmis(
        "tune", str(path), "--out", str(out), env=clean_env(PYTHONUNBUFFERED="1"), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 240
        killed = False
        while time.monotonic() < deadline and proc.poll() is None and not killed:
            runs = list((out / "trials").glob("*/metrics.csv")) if (out / "trials").exists() else []
            # two epochs written: Tune schedules a trial's next step only once it has processed
            # the save that follows a result, so epoch 1's checkpoint is registered (after one
            # epoch a kill could land before it was, and the trial restarted from scratch)
            if runs and len(list(csv.DictReader(open(runs[0])))) >= 2 and _trial_actor_pids(proc):
                for pid in _trial_actor_pids(proc):
                    os.kill(pid, signal.SIGKILL)  # the trial's worker process dies mid-training
                killed = True
            time.sleep(0.2)
        assert killed, f"never saw a trial epoch; see {log.name}"
        assert proc.wait(timeout=300) == 0, (tmp_path / "search.log").read_text()[-3000:]
    finally:
        stop_group(proc, timeout=5)
        log.close()
    rows = read_results(out)
    assert len(rows) == 1 and rows[0]["status"] == "TERMINATED" and rows[0]["epochs"] == "4"
    epochs = [int(x["epoch"]) for x in csv.DictReader(open(out / "trials" / rows[0]["trial_id"] / "metrics.csv"))]
    assert epochs == [1, 2, 3, 4]  # resumed after the failure, no epoch repeated or lost
    # the console shows the live view; the trials' own output is in tune.log
    text = (tmp_path / "search.log").read_text() + (out / "tune.log").read_text()
    assert f"trial {rows[0]['trial_id']} resumes from epoch" in text  # not from scratch


# Ray objects left in garbage cycles (as a killed trial's RayActorError leaves them), with the
# collector made to run at almost every allocation, the shutdown's own included; weak references
# tell which are still there.
_COLLECTED_DURING_SHUTDOWN = """
import gc
import weakref
import ray
from distmis.raysession import ray_session

class Cycle:
    pass

for round in range(2):
    with ray_session(None, num_cpus=1) as session:
        gc.disable()
        cycles = []
        for _ in range(200):
            cycle = Cycle()
            cycle.ref, cycle.self = ray.put(round), cycle
            cycles.append(weakref.ref(cycle))
            del cycle
        gc.set_threshold(1)
        gc.enable()
        session.close()
        assert not ray.is_initialized() and gc.isenabled()
        print("closed", round, flush=True)
    gc.collect()
    assert all(c() is None for c in cycles)  # freed after the core worker is gone, without harm
    gc.set_threshold(700)
print("done", flush=True)
"""


def test_objects_of_ray_freed_while_it_shuts_down_do_not_kill_the_search(tmp_path: Path) -> None:
    """Ray 2.60 marks the driver disconnected before it shuts the core worker down; an ObjectRef
    freed in between made Ray quick-exit the process with 1 (a finished search, seen in CI, with
    no summary). Ray's shutdown runs with the collector off, so nothing is freed in between,
    even with the collector made to run at every allocation; the cycles are freed after."""
    done = subprocess.run(
        [sys.executable, "-c", _COLLECTED_DURING_SHUTDOWN],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout.split()) == (0, ["closed", "0", "closed", "1", "done"]), done.stderr[-2000:]


def _ray_processes_of(parent: int) -> dict[int, str]:
    """Ray's processes below ``parent`` (pid -> command line), read from the process table: its
    binaries and scripts live under ``.../ray/``, its workers name themselves ``ray::...``; other
    children of the test process (multiprocessing's resource tracker) are not Ray's."""
    import psutil

    found = {}
    for child in psutil.Process(parent).children(recursive=True):
        try:
            line = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "/ray/" in line or line.startswith("ray::"):
            found[child.pid] = line
    return found


def test_a_private_local_ray_starts_without_an_api_server_and_stops_whole(local_ray: None) -> None:
    """A private Ray starts without Ray's head API server (the dashboard process, which
    ``ray.init`` would wait for) and runs work; ``shutdown_ray`` leaves no process of it behind,
    its autoscaler monitor included. Observed from the process table, not from Ray's internals."""
    import psutil
    import ray

    from distmis.raycompat import private_code_usable
    from distmis.raysession import init_ray, shutdown_ray

    init_ray(None, num_cpus=1)
    assert ray.get(ray.remote(lambda: 6 * 7).remote(), timeout=120) == 42
    processes = _ray_processes_of(os.getpid())
    assert any("gcs_server" in line for line in processes.values()), processes
    assert any("/monitor.py" in line for line in processes.values()), processes  # the autoscaler monitor
    if private_code_usable():  # on an untested Ray, Ray starts as it does by itself
        assert not [line for line in processes.values() if "dashboard/dashboard.py" in line], processes
    shutdown_ray()
    assert not ray.is_initialized()
    # a bound, not a speed: on a busy CI machine Ray's GCS took more than 30 s to exit
    gone, alive = psutil.wait_procs([psutil.Process(pid) for pid in processes if psutil.pid_exists(pid)], timeout=120)
    assert not alive, [processes[p.pid] for p in alive]


def test_a_local_rays_start_asks_for_its_raylet_again_until_the_bound() -> None:
    """Ray's "not registered yet" (a RuntimeError) is asked again until the bound, then raised;
    an answer ends the wait at once, and any other error is never retried."""
    from distmis.waits import retried_until

    asks: list[float] = []

    def registers_on_third(node: str) -> str:
        asks.append(time.monotonic())
        if len(asks) < 3:
            raise RuntimeError(f"{node} not registered")
        return node

    assert retried_until(60.0, registers_on_third, interval=0.01)("n1") == "n1" and len(asks) == 3

    def never(node: str) -> str:
        raise RuntimeError(f"{node} not registered")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="n2 not registered"):
        retried_until(0.3, never, interval=0.01)("n2")
    assert time.monotonic() - start >= 0.3  # a lower bound only: the bound was waited out

    def broken(node: str) -> str:
        asks.append(time.monotonic())
        raise ValueError(node)

    asks.clear()
    with pytest.raises(ValueError):
        retried_until(60.0, broken, interval=0.01)("n3")
    assert len(asks) == 1


def test_the_private_ray_code_runs_only_on_a_tested_ray() -> None:
    """On any Ray minor release that the compatibility module was not tested with, distmis uses
    Ray's public behaviour only (so opening the version bound cannot break a start)."""
    from distmis.raycompat import TESTED_MINORS, is_tested

    assert is_tested(f"{TESTED_MINORS[0]}.0") and is_tested(f"{TESTED_MINORS[0]}.3")
    assert not is_tested("2.61.0") and not is_tested("3.60.0") and not is_tested("2.6.0")


def test_configuration_failure_is_reported_once_not_retried(prepared16: Path, tmp_path: Path, local_ray: None) -> None:
    """A trial whose configuration cannot be trained ends at once with the reason; Tune's
    max_failures retries (which would repeat the same failure) are not spent on it."""
    from ray import tune

    from distmis.metrics import FAILURE
    from distmis.raysession import init_ray
    from distmis.tuning import TrialContext, trainable_for

    init_ray(None, num_cpus=2)
    base = ExperimentConfig.model_validate({"data": {"source": str(prepared16)}, "train": {"epochs": 2}})
    context = TrialContext(
        base_config=base.to_yaml_dict(),
        prepared=str(prepared16),
        trials_dir=str(tmp_path / "t"),
        metric="val_dice",
        mode="max",
        threads=1,
    )
    tuner = tune.Tuner(
        tune.with_resources(trainable_for(context), {"cpu": 1}),
        param_space={"depth": 11},  # refused by model.depth (le=6) when the trial builds its configuration
        tune_config=tune.TuneConfig(metric="val_dice", mode="max", num_samples=1),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "tune"), verbose=0, failure_config=tune.FailureConfig(max_failures=3)
        ),
    )
    grid = tuner.fit()
    result = grid[0]
    assert result.error is None
    assert "model.depth" in result.metrics[FAILURE] and "less than or equal to 6" in result.metrics[FAILURE]
    assert result.metrics["training_iteration"] == 1
    trial = grid._experiment_analysis.trials[0]
    assert trial.run_metadata.num_failures == 0  # ended once, not retried 3 times
