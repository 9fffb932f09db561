"""How often Ray Tune's driver syncs the experiment directory, as concurrent trials grow.

Each distmis trial checkpoints every epoch with ``CheckpointConfig(num_to_keep=2)``, and Tune then
forces an experiment sync once some trial has checkpointed twice since the last sync; it also
syncs every ``TUNE_GLOBAL_CHECKPOINT_S`` (distmis: 5 s). Each sync copies every file of the
experiment (``benchmarks/tune_storage.py`` times one), so what a search of K concurrent trials
costs its driver is that time the sync rate. Does the rate grow with K (one forced sync per
trial's second checkpoint) or stay near one per epoch (the counters are cleared for all trials at
each sync)? This runs K trials that only sleep an epoch and checkpoint, through distmis's Tune
settings (``tune_environment``, ``tune_storage``, the same ``CheckpointConfig``), and counts the
driver's syncs: each one writes ``experiment_state-*.json`` through the storage filesystem.

    python benchmarks/tune_sync_rate.py [--concurrency 2,8,32] [--epoch-seconds 2] [--epochs 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from benchlib import add_out_option, write_report

from distmis.tuning import WholeFileLocalHandler, tune_environment

#: when the driver wrote each experiment state (one per sync); the driver's copy of the handler only
SYNCS: list[float] = []


class CountingHandler(WholeFileLocalHandler):
    """distmis's storage handler, noting each sync of the experiment state in the driver."""

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        if Path(path).name.startswith("experiment_state"):
            SYNCS.append(time.monotonic())
        return super().open_output_stream(path, metadata)


def run(concurrency: int, epoch_seconds: float, epochs: int) -> dict[str, float]:
    import ray.cloudpickle
    import tune_driver_load  # the sleeping trial, beside this script
    from ray import tune

    from distmis.raysession import init_ray, shutdown_ray

    # Ray's workers cannot import a benchmark script: the trial travels by value, as this one's would
    ray.cloudpickle.register_pickle_by_value(tune_driver_load)

    tune_environment()
    SYNCS.clear()
    out = Path(tempfile.mkdtemp(prefix="tune-sync-rate-"))
    init_ray(None, num_cpus=concurrency)
    try:
        tuner = tune.Tuner(
            tune.with_resources(tune_driver_load.sleeping_trial, {"cpu": 1}),
            param_space={"_epochs": epochs, "_sleep": epoch_seconds},
            tune_config=tune.TuneConfig(num_samples=concurrency, max_concurrent_trials=concurrency),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str(out),
                storage_filesystem=pafs.PyFileSystem(CountingHandler(out)),
                # a function trainable checkpoints when it reports one: no frequency to set
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                verbose=0,
            ),
        )
        start = time.monotonic()
        tuner.fit()
        wall = time.monotonic() - start
    finally:
        shutdown_ray()
        shutil.rmtree(out, ignore_errors=True)
    syncs = [t for t in SYNCS if t >= start]
    gaps = [b - a for a, b in zip(syncs, syncs[1:], strict=False)]
    return {
        "wall": wall,
        "syncs": len(syncs),
        "per_epoch": len(syncs) / (wall / epoch_seconds),
        "median_gap": statistics.median(gaps) if gaps else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="2,8,32")
    p.add_argument("--epoch-seconds", type=float, default=2.0)
    p.add_argument("--epochs", type=int, default=15)
    add_out_option(p, "tune_sync_rate")
    a = p.parse_args()
    rows = []
    print(f"trials of {a.epochs} epochs of {a.epoch_seconds} s, one wave of K at once")
    print(
        "| K trials at once | wall (s) | syncs | syncs per epoch-length | checkpoints per epoch-length | median gap (s) |"
    )
    print("|---|---|---|---|---|---|")
    for k in (int(x) for x in a.concurrency.split(",")):
        r = run(k, a.epoch_seconds, a.epochs)
        print(
            f"| {k} | {r['wall']:.1f} | {r['syncs']} | {r['per_epoch']:.2f} | {k} | {r['median_gap']:.2f} |",
            flush=True,
        )
        rows.append({"K trials at once": k, **r})
    title = f"trials of {a.epochs} epochs of {a.epoch_seconds} s, one wave of K at once: Tune's syncs"
    write_report(a.out, "tune_sync_rate", title=title, rows=rows, echo=False)


if __name__ == "__main__":
    main()
