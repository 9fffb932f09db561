"""Does a process that runs trial after trial (a warm Tune slot) keep what each trial left behind?

Runs N short trials of one configuration one after another in one process, as a reused trial
process runs them, twice, each in a fresh process:

  kept       a new ``RunSession`` per trial, the previous one released: what the slot did before
             TensorFlow's custom-gradient registrations were forgotten
  trial      ``TrialSession.start`` per trial, the path a distmis trial takes (it forgets the
             previous trial's registrations, ``distmis.tensorflow_env.forget_custom_gradients``)

and prints, per trial and as slopes over the trials: the process's resident memory, the number
of objects Python's garbage collector tracks, and the median training seconds of an epoch. The
traced graph a trial leaves is set by the model, not by the volume, so the task's 32^3 data is
enough; a larger U-Net leaves a larger graph.

    python benchmarks/warm_trials.py [--trials 30] [--epochs 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, TASK_FILES, prepare_task, write_report

MODES = ("kept", "trial")


def child(mode: str, doc: dict, trials: int) -> None:
    """One variant in this process: a JSON line per trial."""
    import psutil

    from distmis.config import ExperimentConfig
    from distmis.tensorflow_env import custom_gradient_names
    from distmis.training import RunSession, configure_tensorflow, release_in_background
    from distmis.tuning import TrialSession, TrialStart

    configure_tensorflow(1)  # a 1-CPU trial, as the task's searches run
    config = ExperimentConfig.model_validate(doc)
    prepared = str(doc["data"]["source"])
    out = Path(tempfile.mkdtemp(prefix=f"warm-{mode}-"))
    slot = TrialSession()
    process = psutil.Process()
    for i in range(trials):
        run_dir = out / f"t{i}"
        if mode == "kept":
            release_in_background(slot, "session")
            slot.session = RunSession(config, prepared, run_dir)
        else:
            slot.start(TrialStart(doc, {}, prepared, str(run_dir), "val_dice", "max"))
        seconds = [slot.session.step().as_dict()["train_seconds"] for _ in range(config.train.epochs)]
        gc.collect()  # count what is still reachable, not what awaits collection
        print(
            json.dumps(
                {
                    "trial": i,
                    "rss_mb": process.memory_info().rss / 2**20,
                    "objects": len(gc.get_objects()),
                    "train_seconds": statistics.median(seconds[1:]),  # the first epoch traces
                    "custom_gradients": len(custom_gradient_names()),
                }
            ),
            flush=True,
        )


def slope(values: list[float]) -> float:
    """Least-squares growth per trial, the first trial (imports, first trace) left out."""
    y = np.asarray(values[1:], dtype=float)
    return float(np.polyfit(np.arange(len(y)), y, 1)[0]) if len(y) > 1 else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "runs" / "bench-warm-trials"))
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--doc", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child, json.loads(a.doc), a.trials)
        return

    root = Path(a.out)
    base = yaml.safe_load(TASK_FILES["anatomy32"].read_text())
    prepared = prepare_task("anatomy32", base, TASK_FILES["anatomy32"].parent, root)
    doc = {
        "name": "warm-trials",
        "data": {"source": str(prepared)},
        "train": {**base["train"], "epochs": a.epochs, "seed": 0},
        "model": base["model"],
        "optimizer": base["optimizer"],
    }
    results: dict[str, list[dict]] = {}
    for mode in MODES:
        started = time.time()
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--doc", json.dumps(doc), "--trials", str(a.trials)],
            capture_output=True,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        if proc.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        results[mode] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        print(f"  {mode}: {len(results[mode])} trials, {time.time() - started:.0f} s", flush=True)

    table = []
    for mode, rows in results.items():
        rss = [r["rss_mb"] for r in rows]
        secs = [r["train_seconds"] for r in rows]
        table.append(
            {
                "variant": mode,
                "memory, trial 2 -> last (MB)": f"{rss[1]:.0f} -> {rss[-1]:.0f}",
                "memory per trial (MB)": round(slope(rss), 2),
                "Python objects per trial": round(slope([r["objects"] for r in rows])),
                "custom gradients held at the end": rows[-1]["custom_gradients"],
                "train s/epoch, trials 2-6 -> last 5": (
                    f"{statistics.median(secs[1:6]):.3f} -> {statistics.median(secs[-5:]):.3f}"
                ),
            }
        )

    def draw(fig: Any) -> None:
        axes = fig.add_subplot()
        for mode, rows in results.items():
            axes.plot([r["rss_mb"] for r in rows], marker=".", label=mode)
        axes.set_xlabel("trial")
        axes.set_ylabel("process RSS (MB)")
        axes.legend()

    title = (
        f"{a.trials} trials of {a.epochs} epochs in one process (anatomy32 model: depth {base['model']['depth']}, "
        f"{base['model']['filters']} filters, 32^3 patch), this machine, one TensorFlow thread"
    )
    write_report(root, "warm_trials", title=title, rows=table, data={"runs": results}, figure=draw)


if __name__ == "__main__":
    main()
