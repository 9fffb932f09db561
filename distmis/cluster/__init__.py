"""Cluster: SLURM sbatch generation and the per-node Ray bootstrap (``python -m distmis.cluster.slurm``)."""

from distmis.cluster._sbatch import render_sbatch

__all__ = ["render_sbatch"]
