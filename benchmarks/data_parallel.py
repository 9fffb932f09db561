"""Data parallelism on this host: 2 workers vs 1 worker on the same global batch.

Runs the distmis training loop (the one every trial uses) in real processes, two of them
joined by MultiWorkerMirroredStrategy over TF_CONFIG on 127.0.0.1, and prints:

  * samples/s of 1 worker (global batch B, 1 and 2 threads) and of 2 workers (B/2 each, 1 thread);
  * the per-step synchronisation overhead: a 2-worker step minus a 1-worker step on the
    per-worker batch B/2 (same compute, no all-reduce);
  * start-up, from real ``distmis tune`` searches (4 trials) in experiment mode (2 slots) and
    data mode (1 trial x 2 workers): each slot's cold start-up (once: its process, or its
    worker group), and per trial the time from its start to its first epoch, minus that
    epoch's own time, for the first trial on a slot (cold) and the later ones (warm).

    python benchmarks/data_parallel.py [--size 32] [--batch 4] [--steps 30] [--no-startup]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import add_out_option, write_report

from distmis.exceptions import TuningError
from distmis.search_summary import read_search_summary

WORKER = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from distmis.training import configure_tensorflow
configure_tensorflow(int(sys.argv[4]))
import tensorflow as tf
from distmis.config import ExperimentConfig
from distmis.data import load_manifest
from distmis.training import Trainer
prepared, out, per_replica, threads, steps, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "TF_CONFIG" in os.environ else None
cfg = ExperimentConfig.model_validate({
    "train": {"epochs": 1, "batch_size_per_replica": per_replica, "steps_per_epoch": steps, "patch": [size] * 3},
    "model": {"depth": 3, "filters": 8}, "data": {"prepare": {"shape": [size] * 3}}})
trainer = Trainer(cfg, load_manifest(prepared), strategy=strategy)
trainer.steps_per_epoch = 3
trainer.train_epoch()                       # warm-up: tracing, collective set-up
trainer.steps_per_epoch = steps
_, _, seconds = trainer.train_epoch()
if trainer.worker_index == 0:
    with open(out, "w") as f:
        json.dump({"seconds": seconds, "steps": steps, "global_batch": trainer.global_batch}, f)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(prepared: Path, out: Path, per_replica: int, threads: int, workers: int, steps: int, size: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    args = [
        sys.executable,
        "-c",
        WORKER,
        str(prepared),
        str(out),
        str(per_replica),
        str(threads),
        str(steps),
        str(size),
    ]
    if workers == 1:
        subprocess.run(args, env=env, check=True)
    else:
        ports = [free_port() for _ in range(workers)]
        procs = [
            subprocess.Popen(
                args,
                env={
                    **env,
                    "TF_CONFIG": json.dumps(
                        {
                            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                            "task": {"type": "worker", "index": i},
                        }
                    ),
                },
            )
            for i in range(workers)
        ]
        if [p.wait(timeout=900) for p in procs] != [0] * workers:
            raise SystemExit("a worker failed")
    return json.loads(out.read_text())


SEARCH = """name: {name}
data: {{source: {prepared}}}
train: {{epochs: 2, batch_size_per_replica: 1, patch: [{size}, {size}, {size}], augment: {{flip: false, intensity: 0.0}}}}
model: {{depth: 3, filters: 8, norm: group, groups: 4}}
search: {{algorithm: grid, metric: val_dice, mode: max, max_concurrent_trials: {concurrent}, scheduler: {{type: none}}}}
space:
  lr: {{choice: [0.02, 0.01, 0.005, 0.002]}}
parallelism: {{mode: {mode}, workers_per_trial: {workers}, cpus_per_worker: 1}}
"""


def startup(work: Path, prepared: Path, size: int) -> list[dict[str, Any]]:
    """Cold start-up per slot and per-trial overhead, cold and warm, measured by real searches; a row per mode."""
    rows = []
    print("\nstart-up (4 trials x 2 epochs; overhead = first epoch's end - trial start - that epoch's time):")
    for mode, workers, concurrent in (("experiment", 1, 2), ("data", 2, 1)):
        space = work / f"{mode}.yaml"
        space.write_text(
            SEARCH.format(name=mode, prepared=prepared, size=size, concurrent=concurrent, mode=mode, workers=workers)
        )
        out = work / "runs" / mode
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
        subprocess.run(
            [sys.executable, "-m", "distmis", "tune", str(space), "--out", str(out)],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        firsts = []
        for result in (out / "tune").glob("*/result.json"):
            firsts.append(json.loads(result.read_text().splitlines()[0]))
        slots = {r["trial_pid"]: r["group_startup_seconds"] for r in firsts}
        cold = [r for r in firsts if not r["warm_start"]]
        warm = [r for r in firsts if r["warm_start"]]

        def overhead(rs: list[dict]) -> str:
            values = [r["finished_at"] - r["trial_started_at"] - r["epoch_seconds"] for r in rs]
            return (
                f"mean {sum(values) / len(values):5.2f} s, max {max(values):5.2f} s (n={len(values)})"
                if values
                else "-"
            )

        def first_epoch(rs: list[dict]) -> str:
            values = [r["finished_at"] - r["trial_started_at"] for r in rs]
            return f"{sum(values) / len(values):5.2f} s" if values else "-"

        wall = read_search_summary(out, error=TuningError).wall_seconds
        print(
            f"  {mode:<10} {concurrent} x {workers} worker(s): wall {wall:5.1f} s; cold start-up per slot "
            f"{sum(slots.values()) / len(slots):5.1f} s ({len(slots)} slot(s))"
        )
        print(f"  {'':<10} per-trial overhead, cold: {overhead(cold)}; warm: {overhead(warm)}")
        print(f"  {'':<10} trial start to first epoch: cold {first_epoch(cold)}, warm {first_epoch(warm)}")
        rows.append(
            {
                "mode": mode,
                "wall_s": wall,
                "cold_startup_per_slot_s": sum(slots.values()) / len(slots),
                "overhead_cold": overhead(cold),
                "overhead_warm": overhead(warm),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4, help="global batch")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up measurement (real searches)")
    add_out_option(ap, "data_parallel")
    args = ap.parse_args()
    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset, write_synthetic_msd

    work = Path(tempfile.mkdtemp(prefix="dp-bench-"))
    shape = (args.size,) * 3
    write_synthetic_msd(work / "msd", cases=16, shape=shape, test_cases=0)
    prepare_dataset(work / "msd", work / "prep", PrepareConfig(shape=shape, split=(0.75, 0.25, 0.0)))
    b, half = args.batch, args.batch // 2
    one_1t = run(work / "prep", work / "a.json", b, 1, 1, args.steps, args.size)
    one_2t = run(work / "prep", work / "b.json", b, 2, 1, args.steps, args.size)
    half_1t = run(work / "prep", work / "c.json", half, 1, 1, args.steps, args.size)
    two = run(work / "prep", work / "d.json", half, 1, 2, args.steps, args.size)

    def sps(r: dict) -> float:
        return r["steps"] * r["global_batch"] / r["seconds"]

    def step_ms(r: dict) -> float:
        return 1000 * r["seconds"] / r["steps"]

    print(
        f"3D U-Net (depth 3, 8 filters) on {args.size}^3 patches, global batch {b}, {args.steps} steps, {os.cpu_count()} cores"
    )
    print(f"1 worker, 1 thread,  batch {b}:         {sps(one_1t):7.1f} samples/s  {step_ms(one_1t):7.1f} ms/step")
    print(f"1 worker, 2 threads, batch {b}:         {sps(one_2t):7.1f} samples/s  {step_ms(one_2t):7.1f} ms/step")
    print(f"2 workers x 1 thread, {half} per worker:    {sps(two):7.1f} samples/s  {step_ms(two):7.1f} ms/step")
    print(f"speed-up 2 workers vs 1 worker (1 thread):  {sps(two) / sps(one_1t):5.2f}x")
    print(f"speed-up 2 workers vs 1 worker (2 threads): {sps(two) / sps(one_2t):5.2f}x")
    overhead = step_ms(two) - step_ms(half_1t)
    print(
        f"per-step synchronisation overhead: {overhead:6.1f} ms ({step_ms(two):.1f} ms 2-worker step - "
        f"{step_ms(half_1t):.1f} ms 1-worker step on batch {half}; {100 * overhead / step_ms(two):.0f}% of the step)"
    )
    rows = [
        {"setting": f"1 worker, 1 thread, batch {b}", "samples/s": sps(one_1t), "ms/step": step_ms(one_1t)},
        {"setting": f"1 worker, 2 threads, batch {b}", "samples/s": sps(one_2t), "ms/step": step_ms(one_2t)},
        {"setting": f"2 workers x 1 thread, {half} per worker", "samples/s": sps(two), "ms/step": step_ms(two)},
    ]
    data = {
        "sync_overhead_ms": overhead,
        "startup": startup(work, work / "prep", args.size) if not args.no_startup else [],
    }
    title = f"3D U-Net (depth 3, 8 filters) on {args.size}^3 patches, global batch {b}, {args.steps} steps"
    write_report(args.out, "data_parallel", title=title, rows=rows, data=data, echo=False)


if __name__ == "__main__":
    main()
