"""A search's or finalize's own state damaged or deleted: one error naming the file, before Ray or
MLflow start, and every file byte-identical; a journal whose last record was cut short is mended."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from _support.searchfiles import finished_trial, write_summary
from _support.studies import journal_storage, journal_study
from conftest import Assets, Workspace, check_case

pytestmark = pytest.mark.slow

SPACE = "  lr: {loguniform: [1.0e-3, 1.0e-2]}\n"


def _journal(path: Path, trials: int = 3) -> Path:
    """A real Optuna journal with ``trials`` finished trials."""
    study = optuna.create_study(study_name="s", storage=journal_storage(path), direction="maximize")
    for i in range(trials):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-2, log=True)})
        study.tell(trial, 0.1 * i)
    return path


def _search(ws: Workspace, *, journal: bool = True, tune: bool = True) -> tuple[Path, Path]:
    space = ws.search(SPACE)
    run = ws.dir / "run"
    run.mkdir()
    record = {"written_by": "distmis tune", "version": "0.1.0", "location": str(run)}
    (run / ".distmis-output").write_text(json.dumps(record) + "\n")
    (run / "search.yaml").write_text(space.read_text())
    if journal:
        _journal(run / "optuna.journal")
    if tune:
        (run / "tune").mkdir()
        (run / "tune" / "searcher-state-2026-11-01_10-00-00.pkl").write_bytes(pickle.dumps({"numbers": {}}))
        (run / "tune" / "tuner.pkl").write_bytes(pickle.dumps({}))
    return space, run


def test_a_journal_damaged_before_its_last_record(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space, run = _search(ws)
    lines = (run / "optuna.journal").read_bytes().split(b"\n")
    lines[1] = lines[1][: len(lines[1]) // 2]
    (run / "optuna.journal").write_bytes(b"\n".join(lines))
    argv = ["tune", str(space), "--out", "run", "--resume"]
    check_case("journal_damaged", "state", ws, argv, "optuna.journal: record 2 of")


def test_a_deleted_journal(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space, _run = _search(ws, journal=False)
    argv = ["tune", str(space), "--out", "run", "--resume"]
    check_case("journal_deleted", "state", ws, argv, "optuna.journal: missing")


def test_a_deleted_tune_state(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space, _run = _search(ws, tune=False)
    argv = ["tune", str(space), "--out", "run", "--resume"]
    check_case("tune_state_deleted", "state", ws, argv, "run/tune: missing")


def test_a_deleted_tuner_state(assets: Assets, tmp_path: Path) -> None:
    """Without ``tune/tuner.pkl`` Ray Tune cannot restore a search: one error before Ray starts, not
    Tune's FileNotFoundError traceback after it."""
    ws = Workspace(tmp_path, assets)
    space, run = _search(ws)
    (run / "tune" / "tuner.pkl").unlink()
    argv = ["tune", str(space), "--out", "run", "--resume"]
    check_case("tuner_state_deleted", "state", ws, argv, "run/tune/tuner.pkl: missing")


@pytest.mark.parametrize(
    ("case_id", "plan", "token"),
    [
        ("finalize_plan_torn", None, "finalize.json: not valid JSON"),
        ("finalize_plan_folds", {"folds": "five"}, "finalize.json: folds: "),
        ("finalize_plan_no_candidates", {"candidates": []}, "finalize.json: candidates: "),
        ("finalize_plan_unknown", {"flods": 3}, "finalize.json: flods: unknown key"),
    ],
)
def test_a_finalize_plan_cut_short_or_edited_by_hand_is_refused_naming_its_field(
    assets: Assets, tmp_path: Path, case_id: str, plan: dict[str, Any] | None, token: str
) -> None:
    ws = Workspace(tmp_path, assets)
    _space, run = _search(ws)
    final = run / "finalize"
    final.mkdir()
    record = {"written_by": "distmis finalize", "version": "0.1.0", "location": str(final)}
    (final / ".distmis-output").write_text(json.dumps(record) + "\n")
    whole = {
        "run": str(run),
        "splits": None,
        "candidates": [{"rank": 0, "trial_id": "t0", "params": {"lr": 0.005}, "search_value": 0.5}],
        "folds": 2,
        "seed": 0,
        "groups": [["a"], ["b"]],
        "tta": True,
        "pairs": True,
        "postprocess": True,
    }
    text = json.dumps({**whole, **plan}) if plan is not None else json.dumps(whole)[:60]  # None: cut short
    (final / "finalize.json").write_text(text)
    (run / "results.csv").write_text("trial_id,status\n")
    write_summary(run, ws.dir / "prepared", [finished_trial("t0", {"lr": 0.005}, {"val_dice": 0.5})])
    check_case(case_id, "state", ws, ["finalize", "run", "--resume"], token)


@pytest.mark.parametrize(
    ("case_id", "edit", "token"),
    [
        ("summary_cut", lambda s: {k: v for k, v in s.items() if k != "metric"}, "summary.json: metric: required"),
        ("summary_count", lambda s: {**s, "trials": "four"}, "summary.json: trials: "),
        ("summary_trial", lambda s: {**s, "trials_detail": [{"trial_id": "t0"}]}, "summary.json: trials_detail.0."),
    ],
)
def test_a_search_summary_cut_short_or_edited_is_refused_naming_its_field(
    assets: Assets, tmp_path: Path, case_id: str, edit: Callable[[dict[str, Any]], dict[str, Any]], token: str
) -> None:
    """finalize and simulate read a finished search's summary.json through the model tune writes it
    with: a damaged one is one error naming the file and the field, and nothing is written."""
    from distmis.simulate import CurveError, curves_of_search

    ws = Workspace(tmp_path, assets)
    _space, run = _search(ws)
    (run / "results.csv").write_text("trial_id,status\n")
    write_summary(run, ws.dir / "prepared", [finished_trial("t0", {"lr": 0.005}, {"val_dice": 0.5})])
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(edit(summary)))
    check_case(case_id, "state", ws, ["finalize", "run"], token)
    with pytest.raises(CurveError, match=token.replace(".", r"\.")):
        curves_of_search(run)


@pytest.mark.parametrize(
    ("case_id", "text", "token"),
    [
        ("time_spent_torn", '{"seconds": 12', "time_spent.json: not valid JSON"),
        ("time_spent_negative", '{"seconds": -5, "budget_seconds": 60}', "time_spent.json: seconds: "),
        ("time_spent_text", '{"seconds": "lots", "budget_seconds": 60}', "time_spent.json: seconds: "),
    ],
)
def test_a_damaged_record_of_the_time_a_search_spent_is_refused_on_resume(
    assets: Assets, tmp_path: Path, case_id: str, text: str, token: str
) -> None:
    """Read as 0 s, a damaged record would give a resumed search its whole time budget again."""
    ws = Workspace(tmp_path, assets)
    space, run = _search(ws)
    (run / "time_spent.json").write_text(text)
    check_case(case_id, "state", ws, ["tune", str(space), "--out", "run", "--resume"], token)


@pytest.mark.parametrize(
    ("case_id", "planted", "argv", "token"),
    [
        ("fifo_marker_finalize", "run/.distmis-output", ["finalize", "run"], "a run directory without results"),
        ("fifo_marker_resume", "run/.distmis-output", ["tune", "space.yaml", "--out", "run", "--resume"],
         "run/.distmis-output: not the marker distmis writes"),
        ("fifo_summary", "run/summary.json", ["simulate", "space.yaml", "--workers", "2", "--curves", "run"],
         "summary.json: cannot read (not a regular file)"),
        ("fifo_config", "other.yaml", ["validate", "other.yaml"], "other.yaml: not a regular file"),
    ],
)  # fmt: skip
def test_a_fifo_in_place_of_a_record_is_refused_instead_of_blocking(
    assets: Assets, tmp_path: Path, case_id: str, planted: str, argv: list[str], token: str
) -> None:
    """A FIFO where a command reads a record (an output's marker, a search's summary, a configuration)
    would block it forever before its first line: each is one error, at once."""
    ws = Workspace(tmp_path, assets)
    space, run = _search(ws)
    assert space == ws.dir / "space.yaml", space
    (ws.dir / planted).unlink(missing_ok=True)
    os.mkfifo(ws.dir / planted)
    check_case(case_id, "state", ws, argv, token)


def test_a_torn_last_journal_record_is_dropped_and_kept_and_the_study_goes_on(tmp_path: Path) -> None:
    from distmis.tuning import mend_journal

    path = _journal(tmp_path / "optuna.journal")
    whole = path.read_bytes()
    path.write_bytes(whole[:-9])  # a kill in the middle of Optuna's last append
    mend_journal(path)
    assert path.read_bytes() == b"".join(line + b"\n" for line in whole.split(b"\n")[:-2])
    assert (tmp_path / "optuna.journal.torn").read_bytes() == whole.split(b"\n")[-2][:-8]
    study = journal_study(path, "s")
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-2, log=True)})
    study.tell(trial, 0.5)
    reread = journal_study(path, "s")
    assert len(reread.trials) == 4 and reread.trials[-1].value == 0.5
    assert reread.trials[-2].state == optuna.trial.TrialState.RUNNING  # the torn record was its tell
