"""Fill the sbatch template (``cluster/distmis.sbatch.template``, package data) into a job script."""

from __future__ import annotations

import shlex
import sys
from importlib import resources
from pathlib import Path
from string import Template


def _template() -> str:
    # cluster/distmis.sbatch.template in the repository is a link to this file
    return resources.files("distmis").joinpath("resources/distmis.sbatch.template").read_text()


def render_sbatch(
    command: list[str],
    *,
    nodes: int,
    cpus_per_node: int,
    gpus_per_node: int = 0,
    time: str = "01:00:00",
    partition: str | None = None,
    job_name: str = "distmis",
    job_dir: str = "runs/slurm-%j",
    venv: str | None = None,
    timeout: int = 300,
    resume_on_requeue: bool = True,
) -> str:
    """The text of an sbatch script that runs ``command`` on a fresh Ray cluster over ``nodes`` nodes."""
    if nodes < 1 or cpus_per_node < 1 or gpus_per_node < 0:
        raise ValueError(f"need nodes >= 1, cpus_per_node >= 1, gpus_per_node >= 0, got {nodes=}, {cpus_per_node=}, {gpus_per_node=}")
    job_dir_abs = str(Path(job_dir).resolve()) if not job_dir.startswith("/") else job_dir
    return Template(_template()).safe_substitute(
        job_name=job_name,
        nodes=nodes,
        cpus_per_node=cpus_per_node,
        gpu_line=f"#SBATCH --gpus-per-node={gpus_per_node}" if gpus_per_node else "# (no GPUs requested)",
        time=time,
        partition_line=f"#SBATCH --partition={partition}" if partition else "# (default partition)",
        job_dir_pattern=job_dir_abs,
        log_dir=str(Path(job_dir_abs).parent),
        venv=venv or sys.prefix,
        timeout=timeout,
        command=shlex.join(command),
        resume_on_requeue="yes" if resume_on_requeue else "no",
    )
