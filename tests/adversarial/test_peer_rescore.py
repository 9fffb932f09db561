"""``benchmarks/peer_rescore.py``: a kept peer run scored on a second dataset, scan by scan, and the
task's own training scans refused as that dataset (they would flatter every system alike).

The kept run is laid out as ``peer_nnunet.py`` keeps one (BUDGET/seedN/SYSTEM with its result, the
file init wrote and the search's model), around the session's trained model; the scoring is the real
``distmis evaluate``. nnU-Net's side needs the ``peers`` extra and is measured in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import Assets, Workspace, snapshot, write_msd

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "peer_rescore.py"


def _kept_run(ws: Workspace, task: Path) -> Path:
    """A distmis run as peer_nnunet.py keeps it, trained (the session's model) on ``task``."""
    run = ws.dir / "runs" / task.name / "5m" / "seed0" / "distmis"
    (run / "run").mkdir(parents=True)
    shutil.copytree(ws.assets.model, run / "run" / "best")
    ids = [e["image"].split("/")[-1].removesuffix(".nii.gz") for e in ws.dataset_json(task)["training"]]
    (run / "run" / "splits.json").write_text(json.dumps({"train": ids[:-1], "val": [], "test": ids[-1:]}))
    (run / "plan.yaml").write_text(f"name: task\ndata: {{source: {task}}}\n")
    result = {"system": "distmis", "budget": "5m", "seed": 0, "total_seconds": 290.0, "peak_gb": 2.0, "dice": {}}
    (run / "result.json").write_text(json.dumps(result))
    return run.parents[2]


def _rescore(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def test_a_kept_run_is_scored_on_every_scan_of_a_second_dataset(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    task = ws.raw("task")
    fresh = write_msd(ws.dir / "fresh", cases=3, test_cases=0, seed=7)
    runs = _kept_run(ws, task)
    inputs = {p: snapshot(p) for p in (task, fresh, runs)}
    done = _rescore("--runs", str(runs), "--data", str(fresh), "--out", str(ws.dir / "out"), cwd=ws.dir)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((ws.dir / "out" / "peer_rescore.json").read_text())
    [row] = report["rows"]
    assert (row["system"], row["budget"], row["seeds"], row["scans"]) == ("distmis", "5m", 1, 3)
    [kept] = report["data"]["runs"]
    assert sorted(kept["scans"]) == ["CASE_000", "CASE_001", "CASE_002"]
    assert all(0.0 <= dice <= 1.0 for scan in kept["scans"].values() for dice in scan.values())
    assert (ws.dir / "out" / "peer_rescore.png").read_bytes()[:4] == b"\x89PNG"
    assert {p: snapshot(p) for p in (task, fresh)} == {p: inputs[p] for p in (task, fresh)}
    # a second call scores nothing again: the run's scores are kept
    again = _rescore("--runs", str(runs), "--data", str(fresh), "--out", str(ws.dir / "out"), cwd=ws.dir)
    assert again.returncode == 0 and "scans scored" not in again.stdout, again.stdout + again.stderr


def test_the_tasks_own_training_scans_are_refused_as_the_second_dataset(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    task = ws.raw("task")
    runs = _kept_run(ws, task)
    # one of the task's training scans under another name, among fresh ones, is still that scan
    fresh = write_msd(ws.dir / "fresh", cases=3, test_cases=0, seed=7)
    shutil.copyfile(task / "imagesTr" / "CASE_001.nii.gz", fresh / "imagesTr" / "CASE_002.nii.gz")
    before = snapshot(ws.dir)
    done = _rescore("--runs", str(runs), "--data", str(fresh), cwd=ws.dir)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"peer_rescore: error: --data {fresh}: case CASE_002's image is the task's training case")
    assert snapshot(ws.dir) == before  # nothing written, the default --out under --runs included
    other = write_msd(ws.dir / "other", cases=2, test_cases=0, modalities=3, seed=8)
    wrong = _rescore("--runs", str(runs), "--data", str(other), cwd=ws.dir)
    assert wrong.returncode == 2 and "differ from the task the runs trained on" in wrong.stderr, wrong.stderr
    (other / "dataset.json").write_text('{"broken')
    broken = _rescore("--runs", str(runs), "--data", str(other), cwd=ws.dir)
    assert broken.returncode == 2, broken.stderr
    [line] = broken.stderr.strip().splitlines()
    assert line.startswith(f"peer_rescore: error: --data {other}: {other / 'dataset.json'}: not valid JSON"), line
