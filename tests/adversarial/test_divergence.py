"""Divergence is failure: a NaN or infinite loss fails the trial or run, and no diverged model is used.

A learning rate of 1e30 with plain SGD and a cross-entropy term drives the loss to NaN in the first
epoch on any data; the Dice of such a network is still a number, which is what used to be ranked.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from _support.studies import journal_study
from conftest import Assets, Workspace, check_case, run_distmis

pytestmark = pytest.mark.slow

DIVERGING = "  lr: {loguniform: [1.0e+30, 1.0e+32]}\n"
TRAIN = "epochs: 2, batch_size_per_replica: 1, loss: dice_ce"


def test_a_search_whose_every_trial_diverges_fails_and_cannot_be_finalized(assets: Assets, tmp_path: Path) -> None:
    import optuna

    ws = Workspace(tmp_path, assets)
    space = ws.search(
        DIVERGING,
        train=TRAIN,
        extra="optimizer: {name: sgd}\nsearch: {num_samples: 2, max_concurrent_trials: 2, seed: 0}\n",
    )
    text = space.read_text().replace("model: {depth: 2, filters: 4}", "model: {depth: 2, filters: 4, norm: none}")
    space.write_text(text)
    env = {"DISTMIS_DATA_HOME": str(tmp_path / "cache")}
    result = run_distmis(["tune", str(space), "--out", "run"], cwd=ws.dir, env=env)
    detail = result.stdout[-2500:] + result.stderr[-2500:]
    assert result.returncode == 1, detail
    assert "every trial failed (2 of 2)" in result.stdout, detail
    assert "(0 finished, 0 stopped early, 2 failed)" in result.stdout, detail
    assert "best so far: -" in result.stdout, detail
    with open(ws.dir / "run" / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["status"] for r in rows] == ["ERROR", "ERROR"], rows
    assert all(r["error"].startswith("diverged: loss is nan") for r in rows), [r["error"] for r in rows]
    summary = json.loads((ws.dir / "run" / "summary.json").read_text())
    assert summary["best_trial_id"] is None and summary["failed"] == 2
    assert not (ws.dir / "run" / "best").exists() and not (ws.dir / "run" / "best.yaml").exists()
    study = journal_study(ws.dir / "run" / "optuna.journal")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2
    assert all(t.user_attrs.get("distmis_failure", "").startswith("diverged") for t in study.trials)

    finalize = run_distmis(["finalize", "run", "--top", "1", "--folds", "2"], cwd=ws.dir, env=env)
    assert finalize.returncode == 2, finalize.stdout[-2000:] + finalize.stderr[-2000:]
    assert "no trial finished with a val_dice value (2 failed" in finalize.stderr, finalize.stderr
    assert not (ws.dir / "run" / "final").exists()


def test_a_training_that_diverges_exits_1_naming_it(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    config = ws.file(
        "train.yaml",
        f"name: m\ndata: {{source: {prepared}}}\ntrain: {{{TRAIN}, patch: [16, 16, 16]}}\n"
        "model: {depth: 2, filters: 4, norm: none}\noptimizer: {name: sgd, lr: 1.0e+30}\n",
    )
    result = run_distmis(
        ["train", str(config), "--out", "run"], cwd=ws.dir, env={"DISTMIS_DATA_HOME": str(tmp_path / "c")}
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(errors) == 1 and "diverged: loss is nan at epoch 1" in errors[0], errors


def _nan_weights(model: Path) -> None:
    with np.load(model / "weights.npz") as data:
        arrays = {k: data[k] for k in data.files}
    first = sorted(arrays)[0]
    arrays[first] = np.full_like(arrays[first], np.nan)
    with open(model / "weights.npz", "wb") as fh:
        np.savez(fh, **arrays)


def test_predict_and_evaluate_refuse_a_model_with_non_finite_weights(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "p", assets)
    ws.dir.mkdir()
    _nan_weights(ws.model())
    ws.raw("data")
    check_case("predict_nan_weights", "divergence", ws, ["predict", "model", "data/imagesTs", "--out", "segs"], "NaN")

    ws = Workspace(tmp_path / "e", assets)
    ws.dir.mkdir()
    _nan_weights(ws.model())
    prepared = ws.prepared()
    argv = ["evaluate", "model", str(prepared), "--split", "test", "--no-track", "--out", "scores"]
    check_case("evaluate_nan_weights", "divergence", ws, argv, "weights.npz")


def test_an_ensemble_that_lists_a_member_twice_is_refused(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    final = ws.dir / "final"
    final.mkdir()
    ws.model("final/m0")
    (final / "ensemble.json").write_text(json.dumps({"format": "distmis-ensemble/1", "members": ["m0", "m0"]}))
    ws.raw("data")
    check_case("ensemble_member_twice", "divergence", ws, ["predict", "final", "data/imagesTs", "--out", "s"], "'m0'")
