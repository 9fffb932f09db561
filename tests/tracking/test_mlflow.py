"""MLflow tracking against a real `mlflow server` on 127.0.0.1 and the default local SQLite store."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _support.mlflowserver import MlflowServer
from _support.processes import processes_under
from _support.raycluster import clean_env, free_port, stop_group
from mlflow.tracking import MlflowClient

from distmis.config import load_config
from distmis.exceptions import TrackingError
from distmis.schema import RunFile
from distmis.tuning import run_search

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))
from test_search import read_results, space_file

pytestmark = pytest.mark.slow


def runs_of(uri: str, experiment: str) -> tuple[object, list]:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("distmis.role") == "search"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    return parents[0], children


def check_tracked(uri: str, experiment: str, out: Path, epochs: int) -> None:
    """1 parent, one child per trial nested under it, right params, one point per epoch, artifacts."""
    client = MlflowClient(tracking_uri=uri)
    parent, children = runs_of(uri, experiment)
    rows = {r["trial_id"]: r for r in read_results(out)}
    assert len(children) == len(rows)
    assert {c.data.tags["distmis.trial_id"] for c in children} == set(rows)
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        row = rows[child.data.tags["distmis.trial_id"]]
        assert float(child.data.params["optimizer.lr"]) == pytest.approx(float(row["lr"]))
        assert child.data.params["train.epochs"] == str(epochs)
        assert child.data.tags["distmis.parallelism_mode"] == "experiment"
        assert child.info.status == "FINISHED"
        history = client.get_metric_history(child.info.run_id, "val_dice")
        assert sorted(m.step for m in history) == list(range(1, int(row["epochs"]) + 1))
        assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["best_model"]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["search.algorithm"] in ("random", "optuna")
    assert "best_val_dice" in parent.data.metrics
    plots = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"learning_curves.png", "optimization_history.png"} <= plots
    top = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"search.yaml", "results.csv", "best.yaml"} <= top


def test_search_tracked_on_a_real_server(prepared16: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    server = MlflowServer(tmp_path / "server").start()
    try:
        path = space_file(
            tmp_path,
            prepared16,
            name="tracked",
            algorithm="random",
            samples=2,
            epochs=2,
            space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}, "amsgrad": {"choice": [True, False]}},
        )
        out = tmp_path / "runs" / "tracked"
        secret_uri = server.uri.replace("http://", "http://alice:s3cret-pw@")  # the server ignores them
        run_search(load_config(path, require_space=True), space_file=path, out=out, tracking_uri=secret_uri, verbose=0)
        check_tracked(server.uri, "tracked", out, epochs=2)
        assert not (tmp_path / "runs" / "mlflow.db").exists()  # nothing went to the default store
        assert not (out / RunFile.MLFLOW_PENDING).exists()
        # the password is neither printed nor written to disk nor stored as a tag
        printed = capfd.readouterr()
        assert "s3cret-pw" not in printed.out + printed.err
        assert not [p for p in out.rglob("*") if p.is_file() and b"s3cret-pw" in p.read_bytes()]
        parent, children = runs_of(server.uri, "tracked")
        for run in [parent, *children]:
            assert "s3cret-pw" not in str(run.data.tags) + str(run.data.params)
    finally:
        server.stop()
        import ray

        ray.shutdown()


def test_default_local_store(prepared16: Path, tmp_path: Path) -> None:
    path = space_file(
        tmp_path,
        prepared16,
        name="local",
        algorithm="random",
        samples=2,
        epochs=2,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "runs" / "local"
    try:
        run_search(load_config(path, require_space=True), space_file=path, out=out, verbose=0)
    finally:
        import ray

        ray.shutdown()
    db = tmp_path / "runs" / "mlflow.db"
    assert db.is_file()
    check_tracked(f"sqlite:///{db}", "local", out, epochs=2)
    # artifacts beside the database, not in ./mlruns
    assert (tmp_path / "runs" / "mlartifacts" / "local").is_dir()


def test_unreachable_server_fails_before_training(prepared16: Path, tmp_path: Path) -> None:
    path = space_file(
        tmp_path,
        prepared16,
        name="down",
        algorithm="random",
        samples=1,
        epochs=1,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "out"
    start = time.monotonic()
    with pytest.raises(TrackingError, match=r"MLflow tracking store http://127\.0\.0\.1:\d+ is unreachable"):
        run_search(
            load_config(path, require_space=True),
            space_file=path,
            out=out,
            tracking_uri=f"http://127.0.0.1:{free_port()}",
            verbose=0,
        )
    assert time.monotonic() - start < 60
    assert not (out / "trials").exists() and not (out / "tune").exists()


def test_server_killed_mid_search_loses_no_metric(prepared16: Path, tmp_path: Path) -> None:
    """Kill the server after the first epoch, bring it back later: every epoch still reaches MLflow.

    Training must go on while it is down (epochs reported between the kill and the restart),
    a whole trial runs without it (its child run is created only on the server's return), and
    the search must not end before its queue is sent (it waits for the server).
    """
    server = MlflowServer(tmp_path / "server").start()
    path = space_file(
        tmp_path,
        prepared16,
        name="flaky",
        algorithm="random",
        samples=3,
        epochs=4,
        concurrency=1,
        steps_per_epoch=40,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "runs" / "flaky"
    log = open(tmp_path / "search.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out), "--tracking-uri", server.uri],
        env=clean_env(PYTHONUNBUFFERED="1"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def trial_processes() -> list[int]:  # this search's trial actors (Tune names them after the wrapper)
        return processes_under(proc.pid, b"ray::distmis_trial", b"ray::ResourceTrainable")

    def epochs_done() -> int:
        return sum(len(list(csv.DictReader(open(m)))) for m in out.glob("trials/*/metrics.csv"))

    def wait_for(cond, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; see {log.name}")

    try:
        wait_for(lambda: epochs_done() >= 1 and trial_processes(), "first epoch")
        # the tracking server dies mid-search. The trials are paused (SIGSTOP) while it stops, so
        # however long stopping takes on a busy machine, the search cannot finish meanwhile: the
        # epochs counted at the kill are the ones before it, whatever the relative speeds
        paused = trial_processes()
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            server.stop()
            down_at = time.time()
            done_at_down = epochs_done()
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        wait_for(lambda: (out / RunFile.MLFLOW_PENDING).exists(), "tracking queued to disk")
        trials_at_down = {m.parent.name for m in out.glob("trials/*/metrics.csv")}

        def whole_trial_while_down() -> bool:  # a trial that started after the kill has finished all epochs
            return any(
                m.parent.name not in trials_at_down and len(list(csv.DictReader(open(m)))) >= 4
                for m in out.glob("trials/*/metrics.csv")
            )

        wait_for(lambda: epochs_done() >= done_at_down + 2, "more epochs without the server")
        wait_for(whole_trial_while_down, "a whole trial without the server", timeout=300)
        up_at = time.time()
        server.start()  # back, same port, same database
        wait_for(lambda: proc.poll() is not None, "search end", timeout=300)
        assert proc.returncode == 0, (tmp_path / "search.log").read_text()[-3000:]
    finally:
        stop_group(proc, timeout=5)
        log.close()
    try:
        assert "unreachable" in (tmp_path / "search.log").read_text()
        check_tracked(server.uri, "flaky", out, epochs=4)
        assert not (out / RunFile.MLFLOW_PENDING).exists()
        client = MlflowClient(tracking_uri=server.uri)
        _, children = runs_of(server.uri, "flaky")
        stamps = [m.timestamp / 1000 for c in children for m in client.get_metric_history(c.info.run_id, "val_dice")]
        assert any(down_at < t < up_at for t in stamps), "no epoch was trained while the server was down"
    finally:
        server.stop()


def test_trial_run_wholly_during_an_outage_reaches_mlflow_when_it_returns(tmp_path: Path) -> None:
    """A whole trial (start, every epoch, end) while the server is down, and the search ending
    while the sender sits in its longest back-off: the server's return must be noticed at once,
    and the child run arrive complete, not be abandoned by the end-of-search wait."""
    from distmis.tracking import BACKOFF_MAX, SearchTracker

    server = MlflowServer(tmp_path / "server").start()
    out = tmp_path / "out"
    out.mkdir()
    try:
        tracker = SearchTracker(server.uri, "outage", out)
        tracker.start(params={"search.algorithm": "random"}, tags={}, artifacts=[])
        server.stop()
        tracker.trial_started("t1", "t1", {"optimizer.lr": "0.01"}, {"distmis.trial_id": "t1"})
        for epoch in (1, 2, 3):
            tracker.trial_result("t1", epoch, {"val_dice": 0.1 * epoch}, time.time())
        tracker.trial_finished("t1", status="FINISHED", tags={"distmis.status": "TERMINATED"}, best_dir=None)
        assert (out / RunFile.MLFLOW_PENDING).exists()
        deadline = time.monotonic() + 180
        while tracker.channel.backoff < BACKOFF_MAX:  # the sender has given up retrying for a while
            assert time.monotonic() < deadline, "the sender never backed off"
            time.sleep(0.2)
        server.start()
        started = time.monotonic()
        done = tracker.finish(metrics={"trials": 1}, tags={}, plots=[], files=[], status="FINISHED", wait_seconds=60)
        waited = time.monotonic() - started
        assert done and not (out / RunFile.MLFLOW_PENDING).exists()
        assert waited < BACKOFF_MAX / 2, f"waited {waited:.1f} s for a server that was back"
        client = MlflowClient(tracking_uri=server.uri)
        parent, children = runs_of(server.uri, "outage")
        assert len(children) == 1 and children[0].data.tags["mlflow.parentRunId"] == parent.info.run_id
        child = children[0]
        assert child.data.params == {"optimizer.lr": "0.01"}
        assert child.info.status == "FINISHED" and parent.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(child.info.run_id, "val_dice")] == [1, 2, 3]
    finally:
        server.stop()


def test_child_run_created_before_an_outage_gets_its_params_once(tmp_path: Path) -> None:
    """The server went away between creating a child run and sending its params: the retry
    sends the params to that run and creates no second one."""
    from distmis.tracking import SearchTracker

    server = MlflowServer(tmp_path / "server").start()
    out = tmp_path / "out"
    out.mkdir()
    try:
        tracker = SearchTracker(server.uri, "half", out)
        tracker.start(params={}, tags={}, artifacts=[])
        client = MlflowClient(tracking_uri=server.uri)
        # the state a failed log_batch leaves: the run exists and is recorded, the op still queued
        made = client.create_run(
            tracker.state["experiment_id"], tags={"mlflow.parentRunId": tracker.state["parent_run_id"]}
        )
        tracker.state["trials"]["t1"] = {"run_id": made.info.run_id, "last_step": 0}
        tracker.queue.append(
            {"op": "create_child", "trial": "t1", "name": "t1", "params": {"model.depth": "3"}, "tags": {}}
        )
        assert tracker.flush()
        _, children = runs_of(server.uri, "half")
        assert [c.info.run_id for c in children] == [made.info.run_id]
        assert children[0].data.params == {"model.depth": "3"}
    finally:
        server.stop()


def test_hung_server_does_not_slow_the_search(
    prepared16: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A tracking host that accepts connections and never answers (a real socket) must not
    delay a single epoch: tracking is sent by a background thread, never on Tune's path."""
    from _support.blackhole import BlackholeProxy

    from distmis.tracking import SearchTracker

    server = MlflowServer(tmp_path / "server").start()
    proxy = BlackholeProxy(server.port, hang_after_requests=3)  # hangs right after the parent run is created
    path = space_file(
        tmp_path,
        prepared16,
        name="hung",
        algorithm="random",
        samples=4,
        epochs=3,
        concurrency=2,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    path.write_text(path.read_text() + "tracking: {final_flush_seconds: 2}\n")
    out = tmp_path / "runs" / "hung"
    try:
        summary = run_search(
            load_config(path, require_space=True), space_file=path, out=out, tracking_uri=proxy.uri, verbose=0
        )
        assert proxy.hanging.is_set() and proxy.hung_at is not None
        assert summary.trials == 4 and summary.failed == 0
        rows = read_results(out)
        assert all(float(r["started_at"]) > proxy.hung_at - 30 for r in rows)
        # every epoch followed the previous one by about its own duration: no 10 s HTTP timeout in between
        for r in rows:
            history = list(csv.DictReader(open(out / "trials" / r["trial_id"] / "metrics.csv")))
            for prev, cur in zip(history, history[1:], strict=False):
                gap = float(cur["finished_at"]) - float(prev["finished_at"]) - float(cur["epoch_seconds"])
                assert gap < 5.0, (r["trial_id"], cur["epoch"], gap)
        tracker = SearchTracker(proxy.uri, "hung", out)
        assert tracker.channel.blocked_seconds < 1.0, tracker.channel.blocked_seconds
        assert (out / RunFile.MLFLOW_PENDING).exists()  # nothing lost: kept for --resume
        # one warning, not one per call; it comes when the sender's first call to the hung host
        # times out (MLflow's 10 s and one retry), which a short search may outlast: waited for
        err, deadline = capfd.readouterr().err, time.monotonic() + 120
        while "is unreachable" not in err and time.monotonic() < deadline:
            time.sleep(0.5)
            err += capfd.readouterr().err
        assert err.count("is unreachable") == 1
    finally:
        proxy.stop()
        server.stop()
        import ray

        ray.shutdown()


#: what turns MLflow 3's telemetry off besides MLFLOW_DISABLE_TELEMETRY (mlflow.telemetry.utils)
_TELEMETRY_SWITCHES = {
    "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "CI", "CIRCLECI",
    "GITLAB_CI", "JENKINS_URL", "TRAVIS", "TF_BUILD", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN",
    "BUILDKITE", "TEAMCITY_VERSION", "CLOUD_RUN_EXECUTION", "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME", "RUNBOT_WORKER_ID",
}  # fmt: skip


@pytest.mark.parametrize(("setting", "off"), [(None, True), ("false", False)])
def test_mlflows_telemetry_is_off_unless_the_user_turns_it_on(tmp_path: Path, setting: str | None, off: bool) -> None:
    """MLflow's telemetry thread removes a variable from os.environ when its configuration
    cannot be fetched, which breaks a request reading os.environ on another thread at that
    moment: distmis's MLflow client has it off, unless the user's environment says otherwise."""
    env = {k: v for k, v in clean_env().items() if k not in _TELEMETRY_SWITCHES}
    if setting is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = setting
    code = (
        "from distmis.tracking import mlflow_client; import sys; "
        "mlflow_client(sys.argv[1]).search_experiments(); "
        "from mlflow.telemetry.client import get_telemetry_client; print('TELEMETRY', get_telemetry_client() is None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, f"sqlite:///{tmp_path / 'mlflow.db'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"TELEMETRY {off}" in done.stdout


def test_credentials_never_leave_the_uri(tmp_path: Path) -> None:
    from distmis.tracking import reattach_uri, redact_uri

    uri = "https://alice:s3cret@mlflow.example.org:5000/path"
    assert redact_uri(uri) == "https://***@mlflow.example.org:5000/path"
    assert redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert redact_uri("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    # --resume completes the recorded (redacted) address from the one given again
    assert reattach_uri(redact_uri(uri), uri, None, tmp_path) == uri
    assert reattach_uri("http://127.0.0.1:5000", None, None, tmp_path) == "http://127.0.0.1:5000"


def test_a_run_that_is_not_a_search_keeps_what_an_outage_withheld_and_sends_it_later(tmp_path: Path) -> None:
    """An evaluation's or a comparison's run (``RunWriter``): metrics, a tag on another run and a
    file logged while the server is down stay queued in ``out``; the run's end waits a bounded time
    and says so; the same output taken up again after the server is back delivers all of it once."""
    from distmis.tracking import RunWriter, SearchTracker

    server = MlflowServer(tmp_path / "server").start()
    out, search_out = tmp_path / "out", tmp_path / "search"
    out.mkdir()
    search_out.mkdir()
    try:
        search_run = SearchTracker(server.uri, "writer", search_out).start(params={}, tags={}, artifacts=[])
        writer = RunWriter(server.uri, out)
        run_id = writer.open("writer", "evaluate-test", tags={"distmis.kind": "evaluation"}, params={"p": 1})
        server.stop()
        (out / "summary.json").write_text("{}")
        writer.log_metrics({"dice_mean": 0.81, "cases_scored": 4})
        writer.set_tags({"distmis.compare_mode": "data"}, run_id=search_run)
        writer.log_files([out / "summary.json"])
        assert not writer.close("FINISHED", wait_seconds=1)
        assert (out / RunFile.MLFLOW_PENDING).is_file()
        server.start()
        code = (
            "import sys; from distmis.tracking import RunWriter; w = RunWriter(sys.argv[1], sys.argv[2]); "
            "print(w.run_id, w.deliver(60))"
        )
        done = subprocess.run(  # another process: only what is on disk
            [sys.executable, "-c", code, server.uri, str(out)], capture_output=True, text=True, timeout=120
        )
        assert done.stdout.split() == [run_id, "True"], done.stdout + done.stderr
        assert not (out / RunFile.MLFLOW_PENDING).exists()
        client = MlflowClient(tracking_uri=server.uri)
        run = client.get_run(run_id)
        assert run.data.metrics == {"dice_mean": 0.81, "cases_scored": 4.0}
        assert run.data.params == {"p": "1"} and run.info.status == "FINISHED"
        assert [a.path for a in client.list_artifacts(run_id)] == ["summary.json"]
        assert client.get_run(search_run).data.tags["distmis.compare_mode"] == "data"
    finally:
        server.stop()
