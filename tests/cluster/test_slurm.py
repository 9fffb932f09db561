"""The SLURM bootstrapper on a real SLURM with 2 simulated nodes on this host (127.0.0.11, .12)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raycluster import clean_env
from slurmcluster import SlurmCluster, available

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))
from test_search import read_results, space_file  # noqa: E402

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


def write_script(tmp: Path, command: list[str], *, timeout: int = 120, edit=None) -> Path:  # noqa: ANN001
    script = tmp / "job.sbatch"
    argv = ["cluster", "sbatch", "--nodes", "2", "--cpus-per-node", "2", "--time", "00:10:00",
            "--job-dir", str(tmp / "jobs" / "slurm-%j"), "--timeout", str(timeout), "--", *command]
    out = subprocess.run([sys.executable, "-m", "distmis", *argv], capture_output=True, text=True, check=True)
    text = out.stdout if edit is None else edit(out.stdout)
    script.write_text(text)
    return script


def test_generated_sbatch_is_readable() -> None:
    assert main(["cluster", "sbatch", "--nodes", "4", "--gpus-per-node", "4", "--time", "12:00:00",
                 "--", "distmis", "tune", "my_space.yaml"]) == 0


def test_search_on_two_slurm_nodes(slurm: SlurmCluster, prepared16: Path, tmp_path: Path) -> None:
    # 4 concurrent 1-CPU trials on 2 nodes x 2 CPUs, long enough that all 4 run at once
    path = space_file(tmp_path, prepared16, name="slurm", algorithm="random", samples=4, epochs=3, concurrency=4,
                      steps_per_epoch=100, space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}})
    out = tmp_path / "out"
    script = write_script(tmp_path, ["distmis", "tune", str(path), "--out", str(out)])
    job = slurm.sbatch(script)
    state, code = slurm.wait_job(job, timeout=400)
    log = (tmp_path / "jobs" / f"slurm-{job}.out").read_text() if (tmp_path / "jobs" / f"slurm-{job}.out").exists() else ""
    assert (state, code) == ("COMPLETED", "0:0"), log[-4000:]
    rows = read_results(out)
    assert len(rows) == 4 and all(r["status"] == "TERMINATED" for r in rows)
    assert {r["node_ip"] for r in rows} == {"127.0.0.11", "127.0.0.12"}  # trials ran on both nodes
    info = json.loads((tmp_path / "jobs" / f"slurm-{job}" / "cluster.json").read_text())
    assert info["nodes"] == ["n1", "n2"] and info["head_ip"] == "127.0.0.11"
    token = Path(info["token_path"])
    assert token.stat().st_mode & 0o777 == 0o600
    deadline = time.monotonic() + 30
    while job_processes(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes(job) == []  # nothing of this job's Ray is left on any node


def test_ray_job_submit_from_outside_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    holder = [sys.executable, "-c",
              f"import pathlib, time\nfor _ in range(600):\n    if pathlib.Path('{release}').exists(): break\n    time.sleep(0.2)"]
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
            [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address",
             f"http://127.0.0.1:{info['dashboard_port']}", "--", sys.executable, "-c", code],
            env=env, capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "NODES 2" in result.stdout
    finally:
        release.touch()
    assert slurm.wait_job(job, timeout=120) == ("COMPLETED", "0:0")


def test_worker_that_never_comes_up_fails_the_job_in_bounded_time(slurm: SlurmCluster, tmp_path: Path) -> None:
    # the bootstrap runs on node 0 only: the head waits for a second node that never starts
    script = write_script(tmp_path, ["true"], timeout=15,
                          edit=lambda s: s.replace('srun --nodes="$SLURM_JOB_NUM_NODES"', "srun --nodes=1 --ntasks=1"))
    start = time.monotonic()
    job = slurm.sbatch(script)
    state, _ = slurm.wait_job(job, timeout=120)
    assert state == "FAILED"
    assert time.monotonic() - start < 90
    log = (tmp_path / "jobs" / f"slurm-{job}.out").read_text()
    assert "waiting for all 2 nodes to join the Ray head n1 at 127.0.0.11:" in log
    assert "never started: ['n2']" in log
    deadline = time.monotonic() + 30
    while job_processes(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes(job) == []
