"""CLI commands that need no cluster: doctor, cluster sbatch, help."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _support.raycluster import free_port

from distmis.cli import main


def test_doctor_prints_what_it_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in (
        "ports",
        "temp path length",
        "GPUs visible to TensorFlow",
        "TensorFlow/Keras",
        "Ray token file",
        "Ray:",
        "Ray address",
        "SLURM",
    ):
        assert name in out


def test_doctor_fails_on_a_stale_ray_address_and_tracking_server(tmp_path: Path) -> None:
    """A RAY_ADDRESS or tracking server left from an earlier job, where nothing listens, is named
    (within the bounds) and doctor exits 1; as a user runs it, in its own process."""
    closed = free_port()  # nothing listens there
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{closed}", "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{closed}"}
    result = subprocess.run(
        [sys.executable, "-m", "distmis", "doctor"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    ray_line = next(line for line in lines if "Ray address" in line)
    assert ray_line.startswith("[FAIL]") and f"127.0.0.1:{closed} (from RAY_ADDRESS)" in ray_line, ray_line
    store = next(line for line in lines if "MLflow tracking store" in line)
    assert store.startswith("[FAIL]") and "does not answer" in store, store
    assert "Traceback" not in result.stderr, result.stderr


def test_cluster_sbatch_renders_a_job_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "cluster",
                "sbatch",
                "--nodes",
                "4",
                "--gpus-per-node",
                "4",
                "--cpus-per-node",
                "16",
                "--time",
                "12:00:00",
                "--partition",
                "gpu",
                "--",
                "distmis",
                "tune",
                "my space.yaml",
            ]
        )
        == 0
    )
    script = capsys.readouterr().out
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=12:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --signal=B:USR1@120",
        "python -m distmis.cluster.slurm",
        "distmis tune 'my space.yaml'",
    ):
        assert line in script
    assert "6379" not in script and "sleep" not in script  # no fixed port, no sleep as synchronisation


def test_cluster_without_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "sbatch", "--nodes", "2"]) == 2
    assert "give the command to run after --" in capsys.readouterr().err
    assert main(["cluster", "sbatch", "--nodes", "0", "--", "true"]) == 2


def test_the_command_ends_with_mains_exit_code_and_all_its_output(tmp_path: Path) -> None:
    # the command skips the interpreter's teardown at exit: what it printed to a pipe (block
    # buffered) must still arrive whole, and its exit code must be main()'s
    space = tmp_path / "space.yaml"
    space.write_text("name: s\nspace:\n  lr: {loguniform: [1.0e-4, 1.0e-2]}\n  amsgrad: {choice: [true, false]}\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout is then block buffered
    ok = subprocess.run(
        [sys.executable, "-m", "distmis", "validate", str(space)], capture_output=True, text=True, env=env
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.rstrip().endswith(f"{space}: valid"), ok.stdout[-300:]
    bad = subprocess.run(
        [sys.executable, "-m", "distmis", "validate", str(tmp_path / "none.yaml")], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("distmis: error:") and "none.yaml" in bad.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly_as_sigpipe_would(tmp_path: Path) -> None:
    # `distmis validate x.yaml | head -1`: the reader is gone before the command writes (its end
    # of the pipe is closed first), so every write fails; no traceback, the shell's SIGPIPE code
    space = tmp_path / "space.yaml"
    space.write_text("name: s\nspace:\n  lr: {loguniform: [1.0e-4, 1.0e-2]}\n")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "distmis", "validate", str(space)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == "", done.stderr
    assert space.read_text().startswith("name: s")
