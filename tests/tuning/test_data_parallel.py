"""Data-parallel and hybrid trials: resource planning, and a real 2-node Ray cluster on this host."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raycluster import RayHead
from test_search import read_results, space_file

from distmis.config import ExperimentConfig
from distmis.exceptions import TuningError
from distmis.tuning import plan_concurrency


def _cfg(mode: str, workers: int, cpus: float = 1, gpus: float = 0, concurrent: int | None = None) -> ExperimentConfig:
    return ExperimentConfig.model_validate({
        "parallelism": {"mode": mode, "workers_per_trial": workers, "cpus_per_worker": cpus, "gpus_per_worker": gpus},
        "search": {"max_concurrent_trials": concurrent},
    })


def test_plan_concurrency() -> None:
    cluster = {"CPU": 8.0, "GPU": 2.0}
    assert plan_concurrency(_cfg("hybrid", 2, cpus=2), cluster)[1] == 2
    assert plan_concurrency(_cfg("data", 4, cpus=2), cluster)[1] == 1
    assert plan_concurrency(_cfg("experiment", 1, cpus=1), cluster)[1] == 8
    assert plan_concurrency(_cfg("experiment", 1, cpus=1, gpus=1), cluster)[1] == 2
    assert plan_concurrency(_cfg("hybrid", 2, cpus=1, concurrent=3), cluster)[1] == 3
    with pytest.raises(TuningError, match=r"one trial needs 4 GPU .*the cluster has 2; it could never start"):
        plan_concurrency(_cfg("data", 4, cpus=1, gpus=1), cluster)
    with pytest.raises(TuningError, match=r"one worker needs 6 CPU, the largest node has 4"):
        plan_concurrency(_cfg("data", 1, cpus=6), cluster, nodes=[{"CPU": 4.0}, {"CPU": 4.0}])


@pytest.mark.slow
def test_data_parallel_trials_span_two_nodes(prepared16: Path, tmp_path: Path) -> None:
    head = RayHead(tmp_path, host="127.0.0.11", num_cpus=1, resources=json.dumps({"trial_driver": 100}))
    try:
        head.add_node("127.0.0.12", num_cpus=1)
        deadline = time.monotonic() + 60
        while head.alive_nodes() < 2:
            assert time.monotonic() < deadline, "worker node 127.0.0.12 did not join within 60 s"
            time.sleep(1)
        # grid, run in order, one trial at a time: a good lr, then a hopeless one that ASHA stops
        # at its first rung (its val_loss is worse than the first trial's there)
        path = space_file(tmp_path, prepared16, name="dp", algorithm="grid", samples=1, epochs=3,
                          scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
                          steps_per_epoch=20, space={"lr": {"choice": [2.0e-2, 1.0e-7]}})
        doc = path.read_text().replace("mode: experiment", "mode: data").replace("workers_per_trial: 1",
                                                                                  "workers_per_trial: 2")
        doc = doc.replace("batch_size_per_replica: 2", "batch_size_per_replica: 1")
        doc = doc.replace("metric: val_dice", "metric: val_loss").replace("mode: max", "mode: min")
        doc = doc.replace("  filters: 8\n", "  filters: 8\n  norm: group\n")  # batch norm is noise at batch 1
        path.write_text(doc)
        out = tmp_path / "out"
        result = subprocess.run(
            [sys.executable, "-m", "distmis", "tune", str(path), "--out", str(out), "--address", head.address],
            env=head.env, capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        rows = read_results(out)
        assert len(rows) == 2 and all(r["status"] == "TERMINATED" for r in rows)
        stopped = [r for r in rows if r["stopped_early"] == "True"]
        assert len(stopped) == 1 and float(stopped[0]["lr"]) < 1e-6, rows  # ASHA stopped the hopeless trial
        for r in rows:  # each trial's two workers ran on the two nodes
            workers = [json.loads(p.read_text()) for p in (out / "trials" / r["trial_id"]).glob("worker-*.json")]
            assert sorted(w["rank"] for w in workers) == [0, 1]
            assert {w["node_ip"] for w in workers} == {"127.0.0.11", "127.0.0.12"}
        # global batch = per-replica batch x workers
        summary = json.loads((out / "summary.json").read_text())
        assert summary["trials"] == 2 and summary["stopped_early"] == 1
        # the trial stopped by ASHA in mid-run gave its workers back: every CPU is free again
        deadline = time.monotonic() + 60
        while True:
            res = head.available()
            if res["free"].get("CPU", 0) == res["total"]["CPU"] == 2:
                break
            assert time.monotonic() < deadline, f"CPUs still held after the search: {res}"
            time.sleep(1)
    finally:
        head.stop()
