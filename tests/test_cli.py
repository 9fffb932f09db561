"""CLI commands that need no cluster: doctor, cluster sbatch, help."""

from __future__ import annotations

import pytest

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
        "SLURM",
    ):
        assert name in out


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
