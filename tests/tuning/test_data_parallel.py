"""Data-parallel and hybrid trials: resource planning, warm worker groups, failures, a real 2-node Ray cluster."""

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
from _support.processes import processes_under
from _support.raycluster import RayHead, clean_env, stop_group
from test_search import read_results, space_file

from distmis.config import ExperimentConfig
from distmis.exceptions import TuningError
from distmis.tuning import plan_concurrency


def _cfg(mode: str, workers: int, cpus: float = 1, gpus: float = 0, concurrent: int | None = None) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "parallelism": {
                "mode": mode,
                "workers_per_trial": workers,
                "cpus_per_worker": cpus,
                "gpus_per_worker": gpus,
            },
            "search": {"max_concurrent_trials": concurrent},
        }
    )


def test_plan_concurrency() -> None:
    cluster = {"CPU": 8.0, "GPU": 2.0}
    assert plan_concurrency(_cfg("hybrid", 2, cpus=2), cluster)[1] == 2
    assert plan_concurrency(_cfg("data", 4, cpus=2), cluster)[1] == 1
    assert plan_concurrency(_cfg("experiment", 1, cpus=1), cluster)[1] == 8
    assert plan_concurrency(_cfg("experiment", 1, cpus=1, gpus=1), cluster)[1] == 2
    assert plan_concurrency(_cfg("hybrid", 2, cpus=1, concurrent=3), cluster)[1] == 3
    with pytest.raises(TuningError, match=r"one trial needs 4 GPU .*the cluster has 2; it could never start"):
        plan_concurrency(_cfg("data", 4, cpus=1, gpus=1), cluster)
    with pytest.raises(TuningError, match=r"one worker needs 6 CPU, the largest node has 4"):
        plan_concurrency(_cfg("data", 1, cpus=6), cluster, nodes=[{"CPU": 4.0}, {"CPU": 4.0}])


def data_parallel_file(
    tmp_path: Path,
    prepared: Path,
    *,
    name: str,
    mode: str = "data",
    workers: int = 2,
    concurrency: int = 1,
    **kwargs: object,
) -> Path:
    path = space_file(tmp_path, prepared, name=name, concurrency=concurrency, **kwargs)  # type: ignore[arg-type]
    doc = (
        path.read_text()
        .replace("mode: experiment", f"mode: {mode}")
        .replace("workers_per_trial: 1", f"workers_per_trial: {workers}")
    )
    doc = doc.replace("batch_size_per_replica: 2", "batch_size_per_replica: 1")
    doc = doc.replace("  filters: 8\n", "  filters: 8\n  norm: group\n")  # batch norm is noise at batch 1
    path.write_text(doc)
    return path


def first_epochs(out: Path) -> list[dict]:
    """The first reported result of every trial, in the order the trials started."""
    firsts = []
    for result in (out / "tune").glob("*/result.json"):
        lines = result.read_text().splitlines()
        if lines:
            firsts.append(json.loads(lines[0]))
    return sorted(firsts, key=lambda r: r["trial_started_at"])


def wait_free(head: RayHead, cpus: float) -> None:
    deadline = time.monotonic() + 60
    while True:
        res = head.available()
        if res["free"].get("CPU", 0) == res["total"]["CPU"] == cpus:
            return
        assert time.monotonic() < deadline, f"CPUs still held after the search: {res}"
        time.sleep(1)


@pytest.fixture
def two_nodes(tmp_path: Path):
    head = RayHead(tmp_path, host="127.0.0.11", num_cpus=1)
    head.add_node("127.0.0.12", num_cpus=1)
    deadline = time.monotonic() + 60
    while head.alive_nodes() < 2:
        assert time.monotonic() < deadline, "worker node 127.0.0.12 did not join within 60 s"
        time.sleep(1)
    yield head
    head.stop()


@pytest.mark.slow
def test_trials_after_the_first_reuse_a_warm_group(prepared16: Path, tmp_path: Path) -> None:
    """One worker group for the whole search: later trials pay no process start-up, only their
    own set-up (the model built in the group's strategy)."""
    path = data_parallel_file(
        tmp_path,
        prepared16,
        name="warm",
        algorithm="grid",
        samples=1,
        epochs=2,
        space={"lr": {"choice": [2.0e-2, 1.0e-2]}},
    )
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    firsts = first_epochs(out)
    assert len(firsts) == 2 and [r["warm_start"] for r in firsts] == [False, True]
    assert len({r["trial_pid"] for r in firsts}) == 1  # the same trainable and group throughout
    rows = read_results(out)
    assert [r["warm"] for r in sorted(rows, key=lambda r: float(r["started_at"]))] == ["False", "True"]
    # no process start-up after the first trial, observed as state: every trial ran on the same worker
    # processes in the same placement group (how much time that saves is benchmarks/tune_overhead.py's
    # business; a wall-clock bound here failed on a loaded host: 10.4 s beside make test-stress)
    workers = {
        (w["rank"], w["trial_pid"], w["placement_group"])
        for r in rows
        for w in (json.loads(p.read_text()) for p in (out / "trials" / r["trial_id"]).glob("worker-*.json"))
    }
    assert len(workers) == 2 and {rank for rank, _, _ in workers} == {0, 1}, workers


@pytest.mark.slow
def test_data_parallel_trials_span_two_nodes(prepared16: Path, tmp_path: Path, two_nodes: RayHead) -> None:
    head = two_nodes
    # grid, run in order, one trial at a time: a good lr, then a hopeless one that ASHA stops
    # at its first rung (its val_loss is worse than the first trial's there)
    path = data_parallel_file(
        tmp_path,
        prepared16,
        name="dp",
        algorithm="grid",
        samples=1,
        epochs=3,
        scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
        steps_per_epoch=20,
        space={"lr": {"choice": [2.0e-2, 1.0e-7]}},
    )
    path.write_text(path.read_text().replace("metric: val_dice", "metric: val_loss").replace("mode: max", "mode: min"))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out), "--address", head.address],
        env=head.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rows = read_results(out)
    assert len(rows) == 2 and all(r["status"] == "TERMINATED" for r in rows)
    stopped = [r for r in rows if r["stopped_early"] == "True"]
    assert len(stopped) == 1 and float(stopped[0]["lr"]) < 1e-6, rows  # ASHA stopped the hopeless trial
    for r in rows:  # each trial's two workers ran on the two nodes, in the trial's own placement group
        workers = [json.loads(p.read_text()) for p in (out / "trials" / r["trial_id"]).glob("worker-*.json")]
        group = json.loads((out / "trials" / r["trial_id"] / "group.json").read_text())
        assert sorted(w["rank"] for w in workers) == [0, 1]
        assert {w["node_ip"] for w in workers} == {"127.0.0.11", "127.0.0.12"}
        assert {w["placement_group"] for w in workers} == {group["placement_group"]}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"] == 2 and summary["stopped_early"] == 1
    wait_free(head, 2)  # the trial ASHA stopped mid-run gave its workers back


def _epochs_of(out: Path, trial: str) -> list[int]:
    return [int(x["epoch"]) for x in csv.DictReader(open(out / "trials" / trial / "metrics.csv"))]


@pytest.mark.slow
def test_a_killed_worker_restarts_the_trial_from_its_checkpoint(
    prepared16: Path, tmp_path: Path, two_nodes: RayHead
) -> None:
    """kill -9 one worker mid-epoch: the trial fails, gets a new group and continues from its last
    checkpoint; every epoch is trained (and reported) exactly once."""
    head = two_nodes
    path = data_parallel_file(
        tmp_path,
        prepared16,
        name="kill",
        algorithm="random",
        samples=1,
        epochs=4,
        steps_per_epoch=60,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "out"
    log = open(tmp_path / "search.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out), "--address", head.address],
        env={**head.env, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        killed = None
        while killed is None and proc.poll() is None:
            assert time.monotonic() < deadline, f"never saw a first epoch; see {log.name}"
            trials = list((out / "trials").glob("*/metrics.csv")) if (out / "trials").exists() else []
            workers = processes_under([head.proc.pid, *(n.pid for n in head.nodes)], b"ray::TrainingWorker")
            # two epochs written: Tune schedules a trial's next step only once it has processed the save
            # that follows a result, so epoch 1's checkpoint is registered (after one epoch a kill could
            # land first, and the trial would rightly start from scratch)
            if trials and len(_epochs_of(out, trials[0].parent.name)) >= 2 and len(workers) == 2:
                killed = max(workers)
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.2)
        assert proc.wait(timeout=400) == 0, (tmp_path / "search.log").read_text()[-4000:]
    finally:
        stop_group(proc, timeout=5)
        log.close()
    rows = read_results(out)
    assert len(rows) == 1 and rows[0]["status"] == "TERMINATED" and rows[0]["epochs"] == "4"
    assert _epochs_of(out, rows[0]["trial_id"]) == [1, 2, 3, 4]
    text = (tmp_path / "search.log").read_text() + (out / "tune.log").read_text()
    # the failure was seen as a lost worker: the dead one's, or its peer's collective, whichever Ray reports first
    assert "died during step" in text or "lost a peer during step" in text
    assert f"trial {rows[0]['trial_id']} resumes from epoch" in text  # not from scratch
    wait_free(head, 2)


@pytest.mark.slow
def test_data_parallel_search_resumes_after_the_driver_is_killed(prepared16: Path, tmp_path: Path) -> None:
    path = data_parallel_file(
        tmp_path,
        prepared16,
        name="dpresume",
        algorithm="grid",
        samples=1,
        epochs=3,
        steps_per_epoch=20,
        space={"lr": {"choice": [2.0e-2, 1.0e-2]}},
    )
    out = tmp_path / "out"
    env = clean_env(PYTHONUNBUFFERED="1")
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    finished: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            runs = sorted((out / "trials").glob("*/metrics.csv")) if (out / "trials").exists() else []
            done = [m for m in runs if len(list(csv.DictReader(open(m)))) == 3]
            if done and len(runs) >= 2 and len(list(csv.DictReader(open(runs[-1])))) >= 1:
                finished = {str(m): m.read_text() for m in done}
                break
            time.sleep(0.3)
        assert finished, f"no trial finished in time; see {log.name}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        stop_group(proc, timeout=5)
        log.close()
    resumed = subprocess.run(
        [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out), "--resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = read_results(out)
    assert len(rows) == 2 and all(r["status"] == "TERMINATED" and r["epochs"] == "3" for r in rows), rows
    for m, text in finished.items():
        assert Path(m).read_text() == text  # the finished trial was not re-run
    for r in rows:
        assert _epochs_of(out, r["trial_id"]) == [1, 2, 3]


def _started_groups(out: Path) -> dict[str, list[int]]:
    """Trial id -> the PIDs of its workers, for every trial whose whole group has started it."""
    started = {}
    for trial in (out / "trials").glob("*") if (out / "trials").is_dir() else []:
        records = []
        for path in trial.glob("worker-*.json"):
            try:
                records.append(json.loads(path.read_text()))
            except ValueError:  # being written
                continue
        if len(records) == 2:
            started[trial.name] = [int(r["trial_pid"]) for r in records]
    return started


def _wait_for_groups(out: Path, count: int, proc: subprocess.Popen, log: Path, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = _started_groups(out)
        if len(started) >= count:
            return started
        assert proc.poll() is None, f"the search ended before {count} trials started: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} started trials after {timeout:.0f} s; see {log}")


def _epochs_written(trial_dir: Path) -> int | None:
    """Epochs in a trial's metrics.csv (written before the epoch's step returns); None: unreadable."""
    try:
        with open(trial_dir / "metrics.csv", newline="") as fh:
            return sum(1 for _ in csv.DictReader(fh))
    except FileNotFoundError:
        return 0
    except (OSError, csv.Error):
        return None


def _pause_an_unfinished_trial(
    out: Path, proc: subprocess.Popen, log: Path, *, epochs: int, timeout: float = 300
) -> int:
    """SIGSTOP the trainable of a started trial that has not finished; returns its PID.

    The trainable is stopped first and the trial's epochs read after: a trial with fewer than
    ``epochs`` rows then cannot report its last epoch until SIGCONT. One that had finished (or
    whose CSV was mid-write) is let go, and another trial is tried.
    """
    deadline = time.monotonic() + timeout
    tried: set[str] = set()
    while time.monotonic() < deadline:
        for trial in _started_groups(out):
            if trial in tried:
                continue
            trial_dir = out / "trials" / trial
            pid = int(json.loads((trial_dir / "group.json").read_text())["trainable_pid"])
            os.kill(pid, signal.SIGSTOP)
            written = _epochs_written(trial_dir)
            if written is not None and written < epochs:
                return pid
            os.kill(pid, signal.SIGCONT)
            tried.add(trial)
        assert proc.poll() is None, f"the search ended before a trial could be held: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no unfinished trial to hold after {timeout:.0f} s; see {log}")


@pytest.mark.slow
def test_hybrid_trials_overlap_each_in_its_own_placement(prepared16: Path, tmp_path: Path) -> None:
    """2 nodes x 2 CPUs, 2 workers per trial, 2 trials at once: the trials really overlap, every
    worker runs in its own trial's placement group, and everything is free at the end."""
    head = RayHead(tmp_path, host="127.0.0.11", num_cpus=2)
    try:
        head.add_node("127.0.0.12", num_cpus=2)
        deadline = time.monotonic() + 60
        while head.alive_nodes() < 2:
            assert time.monotonic() < deadline
            time.sleep(1)
        path = data_parallel_file(
            tmp_path,
            prepared16,
            name="hybrid",
            mode="hybrid",
            concurrency=2,
            algorithm="grid",
            samples=1,
            epochs=3,
            steps_per_epoch=20,
            space={"lr": {"choice": [2.0e-2, 1.5e-2, 1.0e-2, 5.0e-3]}},
        )
        out = tmp_path / "out"
        log = tmp_path / "search.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out), "--address", head.address],
            env=head.env,
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            # a trial whose group has started is held mid-trial (its trainable gets SIGSTOP; its
            # workers keep running, so TensorFlow's coordination heartbeats between them go on) until
            # a second trial has started on its own group: the trials overlap by construction, not
            # because one happened to outlast the other's start-up
            paused = _pause_an_unfinished_trial(out, proc, log, epochs=3)
            try:
                _wait_for_groups(out, 2, proc, log)
            finally:
                os.kill(paused, signal.SIGCONT)
            assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]
        finally:
            stop_group(proc, timeout=5)
        rows = read_results(out)
        assert len(rows) == 4 and all(r["status"] == "TERMINATED" for r in rows)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["max_concurrent_observed"] >= 2  # trials overlapped
        groups = set()
        for r in rows:
            trial_dir = out / "trials" / r["trial_id"]
            group = json.loads((trial_dir / "group.json").read_text())
            workers = [json.loads(p.read_text()) for p in trial_dir.glob("worker-*.json")]
            assert sorted(w["rank"] for w in workers) == [0, 1]
            assert {w["placement_group"] for w in workers} == {group["placement_group"]}
            groups.add(group["placement_group"])
        assert len(groups) >= 2  # two trials at once: two groups, each its own
        wait_free(head, 4)
    finally:
        head.stop()
