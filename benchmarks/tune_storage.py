"""What one of Ray Tune's experiment syncs costs the search's driver, as the search grows.

Every few seconds, and whenever a trial has saved ``num_to_keep`` checkpoints, Tune copies its
whole experiment directory (each trial's ``result.json``, ``progress.csv``, ``params.*``, event
file) from its staging directory into ``--out/tune`` with pyarrow's ``copy_files``, every file
each time. This times that copy for a directory of N trials' files, through pyarrow's local
filesystem (writes in place) and through distmis's (``distmis.tuning.tune_storage``:
each file under a temporary name, renamed when complete), side by side, median of ``--repeats``;
and distmis's with its storage root, which also refuses a directory link planted below the root
(an ``lstat`` of each directory between the root and the file, at each write).

    python benchmarks/tune_storage.py [--trials 64,128,256,512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.fs as pafs
from benchlib import add_out_option, write_report

from distmis.tuning import WholeFileLocalHandler, tune_storage


def staging(root: Path, trials: int) -> Path:
    """A Tune-like experiment directory: per trial the files Tune's driver-side loggers write."""
    src = root / "staging"
    for i in range(trials):
        d = src / f"distmis_trial_{i:08x}_{i}_lr=0.0010"
        d.mkdir(parents=True)
        (d / "params.json").write_text(json.dumps({"lr": 1e-3, "norm": "group"}))
        (d / "params.pkl").write_bytes(os.urandom(200))
        (d / "result.json").write_text("\n".join(json.dumps({"epoch": e, "val_dice": 0.5}) for e in range(16)))
        (d / "progress.csv").write_text("epoch,val_dice\n" + "\n".join(f"{e},0.5" for e in range(16)))
        (d / f"events.out.tfevents.{i}.host").write_bytes(os.urandom(2000))
    (src / "experiment_state-x.json").write_text(json.dumps({"trials": list(range(trials))}))
    return src


def sync_seconds(src: Path, dest: Path, filesystem: pafs.FileSystem, repeats: int) -> float:
    local = pafs.LocalFileSystem()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        pafs.copy_files(str(src), str(dest), source_filesystem=local, destination_filesystem=filesystem)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:] if len(times) > 1 else times)  # the first creates the directories


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", default="64,128,256,512")
    p.add_argument("--repeats", type=int, default=5)
    add_out_option(p, "tune_storage")
    a = p.parse_args()
    rows = []
    print("| trials | files | pyarrow local (s) | distmis whole-file (s) | ratio | + link checks (s) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.trials.split(",")):
        root = Path(tempfile.mkdtemp(prefix="tune-storage-"))
        try:
            src = staging(root, n)
            files = sum(1 for _ in src.rglob("*") if _.is_file())
            plain = sync_seconds(src, root / "plain", pafs.LocalFileSystem(), a.repeats)
            whole = sync_seconds(src, root / "whole", pafs.PyFileSystem(WholeFileLocalHandler()), a.repeats)
            checked = sync_seconds(src, root / "checked", tune_storage(root / "checked"), a.repeats)
            print(
                f"| {n} | {files} | {plain:.3f} | {whole:.3f} | {whole / plain:.2f} | {checked:.3f} | "
                f"{checked / plain:.2f} |",
                flush=True,
            )
            rows.append(
                {
                    "trials": n,
                    "files": files,
                    "pyarrow local (s)": plain,
                    "distmis whole-file (s)": whole,
                    "distmis, link-checked (s)": checked,
                }
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
    title = f"syncing a search's trial directories, median of {a.repeats}: pyarrow's local copy against distmis's"
    write_report(a.out, "tune_storage", title=title, rows=rows, echo=False)


if __name__ == "__main__":
    main()
