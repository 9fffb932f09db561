"""A search's or finalize's own state damaged or deleted: one error naming the file, before Ray or
MLflow start, and every file byte-identical; a journal whose last record was cut short is mended."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import optuna
import pytest
from conftest import Assets, Workspace, check_case

pytestmark = pytest.mark.slow

SPACE = "  lr: {loguniform: [1.0e-3, 1.0e-2]}\n"


def _journal(path: Path, trials: int = 3) -> Path:
    """A real Optuna journal with ``trials`` finished trials."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
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


def test_a_finalize_plan_cut_short(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    _space, run = _search(ws)
    final = run / "finalize"
    final.mkdir()
    record = {"written_by": "distmis finalize", "version": "0.1.0", "location": str(final)}
    (final / ".distmis-output").write_text(json.dumps(record) + "\n")
    (final / "finalize.json").write_text('{"candidates": [{"name": "c0", "par')
    (run / "results.csv").write_text("trial_id,status\n")
    (run / "summary.json").write_text(json.dumps({"prepared": str(ws.dir / "prepared"), "trials_detail": []}))
    check_case("finalize_plan_torn", "state", ws, ["finalize", "run", "--resume"], "finalize.json: not valid JSON")


def test_a_torn_last_journal_record_is_dropped_and_kept_and_the_study_goes_on(tmp_path: Path) -> None:
    from distmis.tuning import mend_journal

    path = _journal(tmp_path / "optuna.journal")
    whole = path.read_bytes()
    path.write_bytes(whole[:-9])  # a kill in the middle of Optuna's last append
    mend_journal(path)
    assert path.read_bytes() == b"".join(line + b"\n" for line in whole.split(b"\n")[:-2])
    assert (tmp_path / "optuna.journal.torn").read_bytes() == whole.split(b"\n")[-2][:-8]
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    study = optuna.load_study(study_name="s", storage=storage)
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-2, log=True)})
    study.tell(trial, 0.5)
    reread = optuna.load_study(
        study_name="s", storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    )
    assert len(reread.trials) == 4 and reread.trials[-1].value == 0.5
    assert reread.trials[-2].state == optuna.trial.TrialState.RUNNING  # the torn record was its tell
