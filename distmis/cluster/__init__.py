"""Cluster: SLURM sbatch generation, per-node port blocks and the per-node Ray bootstrap
(``python -m distmis.cluster.slurm``)."""

from distmis.cluster._sbatch import JobOptions, check_venv, default_venv, render_sbatch

__all__ = ["JobOptions", "check_venv", "default_venv", "render_sbatch"]
