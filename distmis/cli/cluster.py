"""SLURM: print an sbatch script that runs a command on a per-job Ray cluster, or submit it.

    distmis cluster sbatch --nodes 4 --gpus-per-node 4 --time 12:00:00 -- distmis tune my_space.yaml > job.sbatch
    distmis cluster submit --nodes 2 -- distmis tune my_space.yaml        # prints the job id

The job survives its wall time: SLURM warns the script --signal-window seconds before the
limit, the search checkpoints and stops, and the script requeues the job, which resumes the
search (at most --max-requeues times). `sbatch` only prints: it writes nothing to disk.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from distmis.cli._common import nonnegative_int, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["sbatch", "submit"], help="print the script, or submit it with sbatch")
    p.add_argument("--nodes", type=positive_int, default=1)
    p.add_argument("--cpus-per-node", type=positive_int, default=8)
    p.add_argument("--gpus-per-node", type=nonnegative_int, default=0)
    p.add_argument("--time", default="01:00:00", help="wall time in SLURM's format (default 01:00:00)")
    p.add_argument("--partition", default=None)
    p.add_argument("--job-name", default="distmis")
    p.add_argument(
        "--job-dir", default="runs/slurm-%j", help="shared directory per job; %%j = job id (default runs/slurm-%%j)"
    )
    venv = p.add_mutually_exclusive_group()
    venv.add_argument("--venv", default=None, help="virtual environment to activate on the nodes (default: this one)")
    venv.add_argument("--no-venv", action="store_true", help="activate nothing (edit the script's marked block)")
    p.add_argument("--timeout", type=positive_int, default=300, help="bound of every bootstrap wait in seconds")
    p.add_argument(
        "--signal-window",
        type=positive_int,
        default=120,
        help="seconds before the wall time at which the search checkpoints and stops (default 120)",
    )
    p.add_argument(
        "--max-requeues",
        type=nonnegative_int,
        default=5,
        help="times a job that reached its wall time is requeued to resume the search (default 5)",
    )
    p.epilog = "Everything after -- is the command the head runs once the cluster is up."


def _options(args: argparse.Namespace):  # noqa: ANN202
    from distmis.cluster import JobOptions, check_venv, default_venv

    venv = None if args.no_venv else str(check_venv(args.venv or default_venv()))
    return JobOptions(
        nodes=args.nodes,
        cpus_per_node=args.cpus_per_node,
        gpus_per_node=args.gpus_per_node,
        time=args.time,
        partition=args.partition,
        job_name=args.job_name,
        job_dir=args.job_dir,
        venv=venv,
        timeout=args.timeout,
        signal_window=args.signal_window,
        max_requeues=args.max_requeues,
    )


def run(args: argparse.Namespace) -> int:
    from distmis.cluster import render_sbatch
    from distmis.exceptions import ClusterError

    options = _options(args)
    script = render_sbatch(args.passthrough, options)
    if args.action == "sbatch":
        print(script, end="")
        if not Path(options.log_dir).is_dir():
            print(
                f"distmis: note: create the log directory before submitting: mkdir -p {options.log_dir}",
                file=sys.stderr,
            )
        return 0
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ClusterError(
            "sbatch: not found on PATH; run `distmis cluster submit` on a SLURM login node, or print "
            "the script with `distmis cluster sbatch` and submit it there"
        )
    Path(options.log_dir).mkdir(parents=True, exist_ok=True)  # SLURM opens the log before the script runs
    with tempfile.TemporaryDirectory(prefix="distmis-sbatch-") as tmp:
        path = Path(tmp) / "job.sbatch"
        path.write_text(script)  # sbatch copies the script at submission
        out = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise ClusterError(
            f"sbatch refused the job: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        )
    job_id = out.stdout.strip().split(";")[0]
    print(job_id)
    print(
        f"distmis: submitted job {job_id}; log {options.log_dir}/slurm-{job_id}.out, cluster "
        f"{options.job_dir_absolute.replace('%j', job_id)}/cluster.json",
        file=sys.stderr,
    )
    return 0
