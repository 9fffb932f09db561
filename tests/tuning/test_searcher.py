"""The Optuna searcher on its own: trial states as TPE must see them, per-epoch values, save/restore."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from _support.studies import journal_study

from distmis.space import ParamSpec, define_by_run
from distmis.tuning import OptunaSearcher, build_sampler

SPACE = {"lr": ParamSpec(loguniform=(1e-4, 1e-2)), "norm": ParamSpec(choice=["batch", "group"])}


def searcher(journal: Path, points: list[dict] | None = None, startup: int = 2) -> OptunaSearcher:
    return OptunaSearcher(
        space=define_by_run(SPACE),
        metric="val_dice",
        mode="max",
        sampler=build_sampler("optuna", 0, startup),
        journal=journal,
        study_name="s",
        max_epochs=3,
        points_to_evaluate=points,
    )


def study(journal: Path) -> optuna.Study:
    return journal_study(journal, "s")


def epochs(s: OptunaSearcher, trial: str, values: list[float]) -> dict:
    result = {}
    for epoch, value in enumerate(values, start=1):
        result = {"epoch": epoch, "val_dice": value, "training_iteration": epoch}
        s.on_trial_result(trial, result)
    return result


def test_trial_states_values_and_points(tmp_path: Path) -> None:
    journal = tmp_path / "optuna.journal"
    s = searcher(journal, points=[{"lr": 5e-3, "norm": "group"}])
    first = s.suggest("a")
    assert first == {"lr": 5e-3, "norm": "group"}  # the starting point comes first
    s.on_trial_complete("a", epochs(s, "a", [0.5, 0.8, 0.7]))  # every epoch: COMPLETE, its best value
    s.suggest("b")
    s.on_trial_complete("b", epochs(s, "b", [0.2]))  # stopped by the scheduler after one epoch: PRUNED
    s.suggest("c")
    s.on_trial_complete("c", epochs(s, "c", [0.3, 0.4]), error=True)  # failed: FAIL
    s.suggest("d")
    s.on_trial_complete("d", {"epoch": 0, "val_dice": float("nan")})  # could not run its configuration
    trials = study(journal).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "FAIL", "FAIL"]
    assert trials[0].value == pytest.approx(0.8) and trials[0].intermediate_values == {1: 0.5, 2: 0.8, 3: 0.7}
    assert trials[1].value == pytest.approx(0.2) and trials[1].intermediate_values == {1: 0.2}
    s.on_trial_complete("a", {"epoch": 3, "val_dice": 0.9})  # a second completion changes nothing
    assert study(journal).trials[0].value == pytest.approx(0.8)


def test_save_and_restore_continue_the_same_study_and_sampler(tmp_path: Path) -> None:
    journal = tmp_path / "optuna.journal"
    s = searcher(journal, startup=10)
    s.suggest("a")
    s.on_trial_complete("a", epochs(s, "a", [0.5, 0.6, 0.7]))
    s.suggest("b")
    epochs(s, "b", [0.4])  # running when the driver is killed
    s.save(str(tmp_path / "state.pkl"))
    s.suggest("lost")  # started after the last save: Tune will not know it
    fresh = searcher(journal, startup=10)
    fresh.restore(str(tmp_path / "state.pkl"))
    trials = study(journal).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "RUNNING", "FAIL"]  # the unknown one is closed
    fresh.on_trial_result("b", {"epoch": 2, "val_dice": 0.6})  # the resumed trial reports into its own trial
    fresh.on_trial_complete("b", {"epoch": 3, "val_dice": 0.65})
    assert study(journal).trials[1].intermediate_values == {1: 0.4, 2: 0.6, 3: 0.65}
    nxt = fresh.suggest("c")
    # the sampler went on from its saved random state: a sampler started again from its seed would
    # draw the first trial's parameters once more
    assert nxt["lr"] != study(journal).trials[0].params["lr"]
    assert study(journal).trials[-1].number == 3


def test_epochs_the_trial_wrote_after_its_last_report_are_told_and_a_diverged_one_fails_it(tmp_path: Path) -> None:
    """Tune completes a trial with the last report it heard; the trial's own metrics.csv can hold epochs
    after it (their reports came after the search's deadline). The study counts them as results.csv
    does: each epoch as an intermediate value, as its report would have been, and a diverged one as the
    trial's failure; nothing after it."""
    import csv

    from distmis.metrics import FAILURE

    trials = tmp_path / "trials"
    (trials / "a").mkdir(parents=True)
    with open(trials / "a" / "metrics.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["epoch", "loss", "val_dice"])
        writer.writerows([[1, 0.9, 0.4], [2, 0.7, 0.6], [3, "nan", 0.0], [4, 0.5, 0.7]])
    s = OptunaSearcher(
        space=define_by_run(SPACE),
        metric="val_dice",
        mode="max",
        sampler=build_sampler("random", 0, 1),
        journal=tmp_path / "optuna.journal",
        study_name="s",
        max_epochs=3,
        trials_dir=trials,
    )
    s.suggest("a")
    s.on_trial_complete("a", epochs(s, "a", [0.4]))
    (told,) = study(tmp_path / "optuna.journal").trials
    assert told.state.name == "FAIL" and told.intermediate_values == {1: 0.4, 2: 0.6, 3: 0.0}
    assert "loss is nan at epoch 3" in told.user_attrs[FAILURE]
