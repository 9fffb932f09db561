"""The SLURM bootstrapper on a real SLURM with 2 simulated nodes on this host (127.0.0.11, .12)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _support.raycluster import clean_env
from _support.slurmcluster import SlurmCluster, available

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))
from test_search import read_results, space_file

from distmis.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not available(), reason="SLURM not installed (.ci/run installs it)")]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, cpus=2).start()
    yield cluster
    cluster.stop()


def job_processes(job_id: str) -> list[str]:
    """Processes of this job's Ray, recognised by its temp dir (/tmp/dm-<job>-<node>)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if f"dm-{job_id}-" in cmd:
                found.append(cmd[:200])
    return found


def write_script(
    tmp: Path,
    command: list[str],
    *,
    timeout: int = 120,
    edit=None,
    cpus: int = 2,
    time_limit: str = "00:10:00",
    options: tuple[str, ...] = (),
    name: str = "job.sbatch",
) -> Path:
    script = tmp / name
    (tmp / "jobs").mkdir(exist_ok=True)
    argv = [
        "cluster",
        "sbatch",
        "--nodes",
        "2",
        "--cpus-per-node",
        str(cpus),
        "--time",
        time_limit,
        "--job-dir",
        str(tmp / "jobs" / "slurm-%j"),
        "--timeout",
        str(timeout),
        *options,
        "--",
        *command,
    ]
    out = subprocess.run([sys.executable, "-m", "distmis", *argv], capture_output=True, text=True, check=True)
    text = out.stdout if edit is None else edit(out.stdout)
    script.write_text(text)
    return script


def job_field(slurm: SlurmCluster, job: str, field: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job, "-o"], env=slurm.env, capture_output=True, text=True)
    return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv).get(field, "")


def job_log(tmp: Path, job: str) -> str:
    path = tmp / "jobs" / f"slurm-{job}.out"
    return path.read_text() if path.exists() else ""


def wait_gone(job: str) -> None:
    deadline = time.monotonic() + 30
    while job_processes(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes(job) == []  # nothing of this job's Ray is left on any node


def test_generated_sbatch_is_readable() -> None:
    assert (
        main(
            [
                "cluster",
                "sbatch",
                "--nodes",
                "4",
                "--gpus-per-node",
                "4",
                "--time",
                "12:00:00",
                "--",
                "distmis",
                "tune",
                "my_space.yaml",
            ]
        )
        == 0
    )


def test_search_on_two_slurm_nodes(slurm: SlurmCluster, prepared16: Path, tmp_path: Path) -> None:
    # 4 concurrent 1-CPU trials on 2 nodes x 2 CPUs, long enough that all 4 run at once
    path = space_file(
        tmp_path,
        prepared16,
        name="slurm",
        algorithm="random",
        samples=4,
        epochs=3,
        concurrency=4,
        steps_per_epoch=100,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "out"
    script = write_script(tmp_path, ["distmis", "tune", str(path), "--out", str(out)])
    job = slurm.sbatch(script)
    state, code = slurm.wait_job(job, timeout=400)
    log = (
        (tmp_path / "jobs" / f"slurm-{job}.out").read_text()
        if (tmp_path / "jobs" / f"slurm-{job}.out").exists()
        else ""
    )
    assert (state, code) == ("COMPLETED", "0:0"), log[-4000:]
    rows = read_results(out)
    assert len(rows) == 4 and all(r["status"] == "TERMINATED" for r in rows)
    assert {r["node_ip"] for r in rows} == {"127.0.0.11", "127.0.0.12"}  # trials ran on both nodes
    info = json.loads((tmp_path / "jobs" / f"slurm-{job}" / "cluster.json").read_text())
    assert info["nodes"] == ["n1", "n2"] and info["head_ip"] == "127.0.0.11"
    token = Path(info["token_path"])
    assert token.stat().st_mode & 0o777 == 0o600
    assert job_field(slurm, job, "Restarts") == "0"  # finished before any signal: not requeued
    wait_gone(job)


def test_ray_job_submit_from_outside_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    holder = [
        sys.executable,
        "-c",
        f"import pathlib, time\nfor _ in range(600):\n    if pathlib.Path('{release}').exists(): break\n    time.sleep(0.2)",
    ]
    job = slurm.sbatch(write_script(tmp_path, holder))
    cluster_json = tmp_path / "jobs" / f"slurm-{job}" / "cluster.json"
    try:
        deadline = time.monotonic() + 180
        while not cluster_json.exists():
            assert time.monotonic() < deadline and slurm.job_state(job)[0] in ("PENDING", "RUNNING", "CONFIGURING")
            time.sleep(0.5)
        info = json.loads(cluster_json.read_text())
        env = clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=info["token_path"])
        code = "import ray; ray.init(); print('NODES', sum(n['Alive'] for n in ray.nodes()))"
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "ray"),
                "job",
                "submit",
                "--address",
                f"http://127.0.0.1:{info['dashboard_port']}",
                "--",
                sys.executable,
                "-c",
                code,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "NODES 2" in result.stdout
    finally:
        release.touch()
    assert slurm.wait_job(job, timeout=120) == ("COMPLETED", "0:0")


def test_worker_that_never_comes_up_fails_the_job_in_bounded_time(slurm: SlurmCluster, tmp_path: Path) -> None:
    # the bootstrap runs on node 0 only: the head waits for a second node that never starts
    script = write_script(
        tmp_path,
        ["true"],
        timeout=15,
        edit=lambda s: s.replace('srun --nodes="$SLURM_JOB_NUM_NODES"', "srun --nodes=1 --ntasks=1"),
    )
    start = time.monotonic()
    job = slurm.sbatch(script)
    state, _ = slurm.wait_job(job, timeout=120)
    assert state == "FAILED"
    assert time.monotonic() - start < 90
    log = (tmp_path / "jobs" / f"slurm-{job}.out").read_text()
    assert "waiting for all 2 nodes to join the Ray head n1 at 127.0.0.11:" in log
    assert "never started: ['n2']" in log
    wait_gone(job)


REJOIN = """
import os, signal, sys, time
from pathlib import Path
import ray

ray.init()
def workers():
    return [n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == "127.0.0.12"]
(first,) = workers()  # the head waited for it
marker = f"dm-{os.environ['SLURM_JOB_ID']}-1"
for entry in Path("/proc").iterdir():  # the second node's raylet (all nodes share this host)
    try:
        argv = (entry / "cmdline").read_bytes().split(b"\\0")
    except OSError:
        continue
    if argv[0].endswith(b"/raylet") and any(marker.encode() in a for a in argv):
        os.kill(int(entry.name), signal.SIGKILL)
        print("KILLED", entry.name, flush=True)
deadline = time.monotonic() + 150
while not any(n["NodeID"] != first["NodeID"] for n in workers()):
    assert time.monotonic() < deadline, f"node 127.0.0.12 did not join again: {ray.nodes()}"
    time.sleep(0.5)
print("REJOINED", flush=True)
"""


def test_a_worker_node_whose_ray_dies_joins_again(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A worker node's raylet killed mid-job: its bootstrap starts Ray again on a new port block
    and the node is back in the cluster, instead of the job running one node short."""
    command = tmp_path / "rejoin.py"
    command.write_text(REJOIN)
    job = slurm.sbatch(write_script(tmp_path, [sys.executable, str(command)], cpus=1))
    assert slurm.wait_job(job, timeout=300) == ("COMPLETED", "0:0"), job_log(tmp_path, job)[-3000:]
    log = job_log(tmp_path, job)
    assert "KILLED" in log and "REJOINED" in log
    assert "Ray on n2 exited with" in log and "joining again (1 of 3)" in log
    wait_gone(job)


PROBE = (
    "import json, os, ray; ray.init(); alive = [n for n in ray.nodes() if n['Alive']]; "
    "print('CLUSTER', json.dumps({'nodes': len(alive), 'cpus': ray.cluster_resources().get('CPU')}))"
)
# The same probe, also writing what it saw to the file named by its argument: srun forwards a
# step's output through a connection per node that SLURM may drop on a host under load
# (``srun: error: failed reading io init message``), so a test that is about something other
# than the job log reads this file instead.
PROBE_TO_FILE = (
    "import json, sys, ray; ray.init(); alive = [n for n in ray.nodes() if n['Alive']]; "
    "seen = json.dumps({'nodes': len(alive), 'cpus': ray.cluster_resources().get('CPU')}); "
    "open(sys.argv[1], 'w').write(seen); print('CLUSTER', seen)"
)


def test_two_jobs_on_the_same_nodes_at_once(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Each job's nodes claim their own port block: two clusters side by side on the same hosts."""
    jobs = []
    for i in range(2):
        sub = tmp_path / f"job{i}"
        sub.mkdir()
        # four Rays starting at once on 2 cores: in CI a worker's Ray exited and joined again after
        # 94 s, past the 120 s bound the other tests give their single job
        probe = [sys.executable, "-c", PROBE_TO_FILE, str(sub / "cluster-seen.json")]
        jobs.append((sub, slurm.sbatch(write_script(sub, probe, cpus=1, timeout=300))))
    for sub, job in jobs:
        assert slurm.wait_job(job, timeout=600) == ("COMPLETED", "0:0"), job_log(sub, job)[-3000:]
        seen = sub / "cluster-seen.json"
        assert seen.exists(), job_log(sub, job)[-3000:]
        assert json.loads(seen.read_text()) == {"nodes": 2, "cpus": 2.0}
    blocks = [json.loads((sub / "jobs" / f"slurm-{job}" / "ray-ports.json").read_text()) for sub, job in jobs]
    assert blocks[0]["block_first"] != blocks[1]["block_first"]  # both heads ran on n1 at the same time
    for sub, job in jobs:
        for node in (sub / "jobs" / f"slurm-{job}" / "nodes").glob("*.json"):
            worker = json.loads(node.read_text())["ports"]
            assert worker["min_worker"] > worker["metrics_export"]  # components and workers never overlap
        wait_gone(job)


def test_cluster_submit_prints_the_job_id(slurm: SlurmCluster, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distmis",
            "cluster",
            "submit",
            "--nodes",
            "2",
            "--cpus-per-node",
            "1",
            "--time",
            "5",
            "--job-dir",
            str(tmp_path / "jobs" / "slurm-%j"),
            "--",
            sys.executable,
            "-c",
            PROBE,
        ],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip()
    assert job.isdigit()
    assert slurm.wait_job(job, timeout=300) == ("COMPLETED", "0:0"), job_log(tmp_path, job)[-3000:]
    text = job_log(tmp_path, job)
    assert 'CLUSTER {"nodes": 2' in text
    # each node's Ray ends on SIGTERM (Ray 2.60's drain on SIGTERM, which a head never finished,
    # made every job end wait out the grace period and then SIGKILL its head)
    for node in ("n1", "n2"):
        assert f"[distmis.cluster {node}] Ray stopped (SIGTERM)" in text, text[-3000:]
    assert "did not stop on SIGTERM" not in text


def test_scancel_stops_without_requeue(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.sbatch(write_script(tmp_path, [sys.executable, "-c", "import time; time.sleep(600)"]))
    cluster_json = tmp_path / "jobs" / f"slurm-{job}" / "cluster.json"
    deadline = time.monotonic() + 180
    while not cluster_json.exists():
        assert time.monotonic() < deadline, job_log(tmp_path, job)[-3000:]
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=slurm.env, check=True)
    state, _ = slurm.wait_job(job, timeout=120)
    assert state == "CANCELLED"
    wait_gone(job)  # the job's own processes have ended: a requeue (done by its script) can no longer come
    assert job_field(slurm, job, "Restarts") == "0" and job_field(slurm, job, "JobState") == "CANCELLED"
    assert "requeueing" not in job_log(tmp_path, job)


def test_wall_time_signal_checkpoint_requeue_resume(slurm: SlurmCluster, prepared16: Path, tmp_path: Path) -> None:
    """A job whose search outlasts its wall time: SLURM's warning (SIGUSR1 to the batch script) makes
    the search checkpoint and stop, the script requeues the job, and the requeued run resumes and
    finishes. Every trial then has each epoch exactly once in results.csv, its metrics.csv and MLflow.

    SLURM checks time limits every 30 s, so its own warning comes anywhere in a 30 s window; to be
    deterministic the test sends the first warning itself, by the same path slurmctld uses
    (``scancel --batch --signal=USR1``), once the first epoch is done. With
    ``DISTMIS_SLURM_REAL_WALLTIME=1`` it waits for SLURM's own warnings instead (a 2-minute limit).
    """
    from mlflow.tracking import MlflowClient

    real = os.environ.get("DISTMIS_SLURM_REAL_WALLTIME") == "1"
    epochs = 4
    path = space_file(
        tmp_path,
        prepared16,
        name="wall",
        algorithm="random",
        samples=2,
        epochs=epochs,
        concurrency=2,
        steps_per_epoch=30,
        space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
    )
    out = tmp_path / "runs" / "wall"
    script = write_script(
        tmp_path,
        ["distmis", "tune", str(path), "--out", str(out)],
        time_limit="00:02:00" if real else "00:03:00",
        options=("--signal-window", "60", "--max-requeues", "8"),
    )
    job = slurm.sbatch(script)
    deadline = time.monotonic() + 1500
    sent = False
    held_since: float | None = None
    while True:
        state = job_field(slurm, job, "JobState")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        epochs_done = sum(len(list(csv.DictReader(open(m)))) for m in out.glob("trials/*/metrics.csv"))
        if not real and not sent and state == "RUNNING" and epochs_done >= 1:
            subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=slurm.env, check=True)
            sent = True
        if state == "PENDING" and job_field(slurm, job, "Reason") == "BeginTime":
            # SLURM holds a requeued job for 120 s; release it once the old allocation is gone
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since > 10 and slurm.idle_nodes() == 2:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm.env)
                held_since = None
        assert time.monotonic() < deadline, job_log(tmp_path, job)[-4000:]
        time.sleep(1)
    log = job_log(tmp_path, job)
    print("\n".join(line for line in log.splitlines() if "distmis:" in line and line[:4].isdigit()))
    assert state == "COMPLETED", log[-4000:]
    restarts = int(job_field(slurm, job, "Restarts"))
    assert restarts >= 1, log[-4000:]  # it was signalled and requeued at least once
    # every requeue followed a warning; a warning that comes as the search ends (exit 0) requeues nothing
    assert log.count("requeueing job") == restarts <= log.count("wall time near (SIGUSR1)")
    rows = read_results(out)
    assert len(rows) == 2 and all(r["status"] == "TERMINATED" and r["epochs"] == str(epochs) for r in rows), rows
    for r in rows:
        seen = [int(x["epoch"]) for x in csv.DictReader(open(out / "trials" / r["trial_id"] / "metrics.csv"))]
        assert seen == list(range(1, epochs + 1)), (r["trial_id"], seen)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("wall").experiment_id])
    parents = [x for x in runs if x.data.tags.get("distmis.role") == "search"]
    children = [
        x for x in runs if "mlflow.parentRunId" in x.data.tags and x.data.tags.get("distmis.abandoned") != "true"
    ]
    assert len(parents) == 1 and len(children) == 2  # the same runs reattached after every requeue
    for child in children:
        steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "val_dice"))
        assert steps == list(range(1, epochs + 1)), (child.data.tags["distmis.trial_id"], steps)
    wait_gone(job)
