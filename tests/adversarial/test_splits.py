"""The test split is fixed when a search starts: data prepared again with another split is refused by
every command that reads it for that search or its models, naming the cases that moved; a model
scored on cases it trained or was selected on says so."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from _support.searchfiles import write_summary
from conftest import Assets, Workspace, check_case, run_distmis

from distmis.data import ModelPreprocessing, load_manifest

pytestmark = pytest.mark.slow

SPACE = "  lr: {loguniform: [1.0e-3, 1.0e-2]}\n"


def _prepare_again(ws: Workspace, prepared: Path, *, seed: int) -> None:
    """``prepare --overwrite`` of the same data with another split, as a user would run it."""
    raw = ws.raw("raw-again")
    argv = ["prepare", str(raw), str(prepared), "--shape", "16,16,16", "--split", "0.5,0.25,0.25"]
    result = run_distmis(
        [*argv, "--seed", str(seed), "--overwrite"], cwd=ws.dir, env={"DISTMIS_DATA_HOME": str(ws.dir)}
    )
    assert result.returncode == 0, result.stderr[-2000:]


def _moved_seed(ws: Workspace, prepared: Path) -> int:
    """A split seed that moves a test case (the data are small: some seeds give the same split)."""
    test = json.loads((prepared / "info.json").read_text())["splits"]["test"]["cases"]
    for seed in range(1, 20):
        _prepare_again(ws, prepared, seed=seed)
        if json.loads((prepared / "info.json").read_text())["splits"]["test"]["cases"] != test:
            return seed
    raise AssertionError("no seed moved a test case")


def _search(ws: Workspace, prepared: Path) -> tuple[Path, Path]:
    """A search as distmis leaves it after its start: marker, space, journal, Tune state, splits."""
    space = ws.search(SPACE, source=str(prepared))
    run = ws.dir / "run"
    run.mkdir()
    (run / ".distmis-output").write_text(
        json.dumps({"written_by": "distmis tune", "version": "0.1.0", "location": str(run)}) + "\n"
    )
    (run / "search.yaml").write_text(space.read_text())
    (run / "optuna.journal").write_text("")
    (run / "tune").mkdir()
    (run / "tune" / "searcher-state-2026-11-01_10-00-00.pkl").write_bytes(pickle.dumps({}))
    (run / "tune" / "tuner.pkl").write_bytes(pickle.dumps({}))
    splits = json.loads((prepared / "info.json").read_text())["splits"]
    (run / "splits.json").write_text(json.dumps({k: v["cases"] for k, v in splits.items()}))
    (run / "results.csv").write_text("trial_id,status\n")
    write_summary(run, prepared, [])
    return space, run


def test_resume_and_finalize_of_a_search_whose_data_was_split_again(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    space, _run = _search(ws, prepared)
    _moved_seed(ws, prepared)
    check_case("resume_resplit", "splits", ws, ["tune", str(space), "--out", "run", "--resume"], "are not those of")
    check_case("finalize_resplit", "splits", ws, ["finalize", "run"], "are not those of the search")


def test_evaluate_of_a_model_on_data_split_again_and_on_its_own_validation_cases(
    assets: Assets, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path, assets)
    model = ws.model()
    prepared = ws.prepared()
    result = run_distmis(
        ["evaluate", "model", str(prepared), "--split", "val", "--no-track", "--out", "val"],
        cwd=ws.dir,
        env={"DISTMIS_DATA_HOME": str(ws.dir)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    val = json.loads((prepared / "info.json").read_text())["splits"]["val"]["cases"]
    assert f"chose its best epoch on {len(val)} of these {len(val)} case(s)" in result.stdout, result.stdout
    seen = json.loads((ws.dir / "val" / "summary.json").read_text())["seen_in_training"]
    assert seen == {"trained_on": [], "validated_on": val}

    result = run_distmis(
        ["evaluate", "model", str(prepared), "--split", "train", "--no-track", "--out", "train"],
        cwd=ws.dir,
        env={"DISTMIS_DATA_HOME": str(ws.dir)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "the model trained on" in result.stdout, result.stdout

    _moved_seed(ws, prepared)
    argv = ["evaluate", str(model), str(prepared), "--split", "test", "--no-track", "--out", "scores"]
    check_case("evaluate_resplit", "splits", ws, argv, "are not those of the model")


def test_finalize_without_splits_json_checks_the_trial_models_splits(assets: Assets, tmp_path: Path) -> None:
    """Deleting ``splits.json`` does not skip the guard: the trials' models record the splits they
    trained on, and data split again since is refused all the same."""
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    _space, run = _search(ws, prepared)
    (run / "splits.json").unlink()
    model = run / "trials" / "t0" / "best"
    model.mkdir(parents=True)
    # the record training writes for a model of this data, as the data was split then
    record = ModelPreprocessing.of_prepared(load_manifest(prepared).info)
    (model / "preprocessing.json").write_text(record.model_dump_json())
    _moved_seed(ws, prepared)
    check_case("finalize_no_splits_json", "splits", ws, ["finalize", "run"], "are not those of the trial model")


@pytest.mark.parametrize("where", ["twice", "two splits"])
def test_prepared_splits_that_repeat_a_case_are_refused(assets: Assets, tmp_path: Path, where: str) -> None:
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    info = json.loads((prepared / "info.json").read_text())
    case = info["splits"]["test"]["cases"][0]
    target = info["splits"]["test"] if where == "twice" else info["splits"]["train"]
    target["cases"].append(case)
    target["num_cases"] += 1
    (prepared / "info.json").write_text(json.dumps(info))
    config = ws.file(
        "train.yaml",
        f"name: m\ndata: {{source: {prepared}}}\ntrain: {{epochs: 1, batch_size_per_replica: 1, "
        "patch: [16, 16, 16]}\nmodel: {depth: 2, filters: 4, norm: none}\n",
    )
    check_case(f"splits_case_{where}", "splits", ws, ["train", str(config), "--out", "run"], repr(case))
