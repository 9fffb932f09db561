"""SLURM: print an sbatch script that runs a command on a per-job Ray cluster, or submit it.

    distmis cluster sbatch --nodes 4 --gpus-per-node 4 --time 12:00:00 -- distmis tune my_space.yaml > job.sbatch
    distmis cluster submit --nodes 2 -- distmis tune my_space.yaml        # prints the job id
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["sbatch", "submit"], help="print the script, or submit it with sbatch")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--cpus-per-node", type=int, default=8)
    p.add_argument("--gpus-per-node", type=int, default=0)
    p.add_argument("--time", default="01:00:00", help="wall time (default 01:00:00)")
    p.add_argument("--partition", default=None)
    p.add_argument("--job-name", default="distmis")
    p.add_argument("--job-dir", default="runs/slurm-%j", help="shared directory per job; %%j = job id (default runs/slurm-%%j)")
    p.add_argument("--venv", default=None, help="virtual environment to activate on the nodes (default: this one)")
    p.add_argument("--timeout", type=int, default=300, help="bound of every bootstrap wait in seconds")
    p.epilog = "Everything after -- is the command the head runs once the cluster is up."


def run(args: argparse.Namespace) -> int:
    from distmis.cluster import render_sbatch
    from distmis.exceptions import ClusterError

    command = args.passthrough
    if not command:
        raise ClusterError("give the command to run after --, e.g. -- distmis tune my_space.yaml")
    try:
        script = render_sbatch(command, nodes=args.nodes, cpus_per_node=args.cpus_per_node,
                               gpus_per_node=args.gpus_per_node, time=args.time, partition=args.partition,
                               job_name=args.job_name, job_dir=args.job_dir, venv=args.venv, timeout=args.timeout)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    Path(args.job_dir.replace("%j", "x")).resolve().parent.mkdir(parents=True, exist_ok=True)
    if args.action == "sbatch":
        print(script, end="")
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as fh:
        fh.write(script)
    out = subprocess.run(["sbatch", "--parsable", fh.name], capture_output=True, text=True)
    if out.returncode != 0:
        raise ClusterError(f"sbatch failed: {out.stderr.strip()}")
    print(out.stdout.strip().split(";")[0])
    return 0
