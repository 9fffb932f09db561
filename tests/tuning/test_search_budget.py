"""search.time_budget: the deadline counts every run of a search, and a bad duration names the key; the
trials' configurations find their data from anywhere."""

from __future__ import annotations

import csv
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _support.studies import journal_study

from distmis.config import SearchConfig
from distmis.schema import RunFile
from distmis.search_summary import SearchSummary
from distmis.tuning import SearchDeadline, deadline_reached, time_spent


def test_a_resumed_search_counts_the_time_already_spent(tmp_path: Path) -> None:
    deadline = SearchDeadline(60.0, tmp_path, started=time.time() - 50)
    assert not deadline.stop_all()  # 50 of 60 s
    assert 49 < time_spent(tmp_path) < 55  # written as it runs
    # --resume: Tune unpickles the stopper; the new run starts after the 50 s recorded
    restored = pickle.loads(pickle.dumps(deadline))
    assert 49 < restored.before < 55 and not restored.stop_all()
    restored.started -= 15  # 15 s into the resumed run: 65 of 60 s
    assert restored.stop_all() and deadline_reached(tmp_path, 60.0)
    assert json.loads((tmp_path / RunFile.TIME_SPENT).read_text())["seconds"] >= 60
    assert not deadline_reached(tmp_path, None) and not deadline_reached(tmp_path, 3600.0)


def test_a_spent_budget_stops_a_resumed_search_at_once(tmp_path: Path) -> None:
    (tmp_path / RunFile.TIME_SPENT).write_text(json.dumps({"seconds": 1800.5, "budget_seconds": 1800.0}))
    assert SearchDeadline(1800.0, tmp_path, started=time.time()).stop_all()


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("24h", 86400), ("1h30m", 5400), ("90", 90)])
def test_durations_as_slurm_users_write_them(text: str, seconds: float) -> None:
    assert SearchConfig(time_budget=text).time_budget_seconds() == seconds


@pytest.mark.parametrize("text", ["soon", "0m", "-1h", "inf", "30 minutes"])
def test_a_bad_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        SearchConfig(time_budget=text)


def test_trials_carry_a_data_source_that_reads_from_anywhere(tmp_path: Path) -> None:
    """A search file's relative data.source is resolved against its folder in the trials' configurations
    (best/config.yaml), so that evaluate and predict run from another directory find the data."""
    from distmis.config import ExperimentConfig
    from distmis.tuning import trial_context

    config = ExperimentConfig.model_validate({"data": {"source": "../data/Task01"}})
    context = trial_context(config, tmp_path / "prepared", tmp_path / "run", base_dir=tmp_path / "plans")
    assert context.base_config["data"]["source"] == str((tmp_path / "data" / "Task01").resolve())
    synthetic = trial_context(ExperimentConfig(), tmp_path, tmp_path / "run", base_dir=tmp_path)
    assert synthetic.base_config["data"]["source"] == "synthetic"


def test_an_epoch_that_ends_too_late_is_not_kept(prepared16: Path, tmp_path: Path) -> None:
    """Past ``keep_until`` the chief writes nothing more and hands back the last kept epoch: Tune
    drops a report that comes after the deadline, so a kept late epoch would be a best/ and a
    checkpoint that no record names."""
    from distmis.config import ExperimentConfig
    from distmis.training import RunSession

    config = ExperimentConfig.model_validate(
        {
            "data": {"source": str(prepared16)},
            "train": {"epochs": 5, "steps_per_epoch": 2, "batch_size_per_replica": 2},
            "model": {"depth": 2, "filters": 4},
        }
    )
    run = tmp_path / "run"
    session = RunSession(config, prepared16, run, keep_until=time.time() + 3600)
    first = session.step()
    assert first.epoch == 1 and not session.done
    session.keep_until = time.time() - 1  # the deadline passes during the second epoch
    again = session.step()
    assert again.as_dict() == first.as_dict() and session.done
    assert json.loads((run / "checkpoint" / "state.json").read_text())["epoch"] == 1
    assert json.loads((run / "best" / "metrics.json").read_text())["epoch"] == 1
    assert len((run / RunFile.METRICS).read_text().splitlines()) == 2  # the header and epoch 1


def test_an_epoch_whose_report_tune_dropped_is_counted_from_the_trials_own_record(
    prepared16: Path, tmp_path: Path
) -> None:
    """A report slower than the deadline's margin (a loaded machine) is dropped by Tune although the
    trial wrote the epoch's weights: the search's records take that epoch from the trial's metrics.csv,
    so results.csv, summary.json, MLflow, the Optuna study and best/ still name the same weights.

    The trial is a real training run; Tune's view of it is a real ``Result`` that holds its first epoch
    only, as Tune's does when the second epoch's report arrives after the deadline."""
    import pandas as pd
    from ray.tune import Result

    from distmis.config import ExperimentConfig
    from distmis.metrics import REPORTED_AT, STARTED_AT
    from distmis.schema import Tag
    from distmis.space import define_by_run
    from distmis.tracking import SearchTracker
    from distmis.training import RunSession
    from distmis.tuning import OptunaSearcher, build_sampler, finish_search_tracking, summarise_search, trial_rows

    config = ExperimentConfig.model_validate(
        {
            "data": {"source": str(prepared16)},
            "train": {"epochs": 5, "steps_per_epoch": 2, "batch_size_per_replica": 2},
            "model": {"depth": 2, "filters": 4},
        }
    )
    out = tmp_path / "search"
    trial = out / RunFile.TRIALS_DIR / "t_0001"
    session = RunSession(config, prepared16, trial)
    started = time.time()
    heard = {**session.step().as_dict(), STARTED_AT: started, REPORTED_AT: time.time(), "trial_id": "t_0001"}
    session.step()  # written by the trial; its report never reaches Tune
    grid = [
        Result(metrics=heard, checkpoint=None, error=None, path=str(trial), metrics_dataframe=pd.DataFrame([heard]))
    ]

    # MLflow heard what Tune heard: the first epoch
    tracker = SearchTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "dropped", out)
    tracker.start(params={}, tags={}, artifacts=[])
    tracker.trial_started("t_0001", "t_0001", {}, {})
    tracker.trial_result("t_0001", 1, {k: heard[k] for k in ("val_dice", "loss")}, heard[REPORTED_AT])

    assert trial_rows(grid, config)[0].epochs == 1  # Tune's view alone: the second epoch is unknown
    summary_record = summarise_search(config, grid, out, wall_seconds=1.0, prepared=prepared16)  # type: ignore[arg-type]
    finish_search_tracking(tracker, config, out, summary_record)
    with open(out / RunFile.RESULTS) as fh:
        (row,) = list(csv.DictReader(fh))
    kept = json.loads((trial / "best" / "metrics.json").read_text())
    summary = json.loads((out / RunFile.SUMMARY).read_text())
    assert row["epochs"] == "2" and row["stopped_early"] == "True", row
    assert int(row["best_epoch"]) == kept["epoch"] and float(row["best_val_dice"]) == pytest.approx(kept["val_dice"])
    assert summary["best_value"] == pytest.approx(kept["val_dice"])
    assert json.loads((out / "best" / "metrics.json").read_text()) == kept
    with open(trial / RunFile.METRICS) as fh:
        last = list(csv.DictReader(fh))[-1]
    assert float(row["final_val_dice"]) == pytest.approx(float(last["val_dice"]))
    client = tracker.client
    (run,) = client.search_runs(
        [client.get_experiment_by_name("dropped").experiment_id], f"tags.`{Tag.TRIAL_ID}` = 't_0001'"
    )
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_dice")] == [1, 2]
    assert run.data.tags[Tag.EPOCHS] == "2" and run.data.metrics["val_dice"] == pytest.approx(float(last["val_dice"]))

    # the Optuna study (optuna-dashboard's view, and what a resumed search's sampler learns from) counts
    # the same epochs: PRUNED at the last epoch's value with two epochs of training, or COMPLETE at the
    # best value where the late epoch was the trial's last
    for max_epochs, state, value in ((5, "PRUNED", row["final_val_dice"]), (2, "COMPLETE", row["best_val_dice"])):
        searcher = OptunaSearcher(
            space=define_by_run(config.space),
            metric="val_dice",
            mode="max",
            sampler=build_sampler("random", 0, 1),
            journal=tmp_path / f"optuna-{max_epochs}.journal",
            study_name="dropped",
            max_epochs=max_epochs,
            trials_dir=out / RunFile.TRIALS_DIR,
        )
        searcher.suggest("t_0001")
        searcher.on_trial_result("t_0001", heard)
        searcher.on_trial_complete("t_0001", result=heard)  # Tune's last result: the first epoch
        (told,) = journal_study(tmp_path / f"optuna-{max_epochs}.journal", "dropped").trials
        assert told.state.name == state and told.value == pytest.approx(float(value))
        assert told.intermediate_values == pytest.approx({1: heard["val_dice"], 2: float(last["val_dice"])})


@pytest.mark.slow
def test_a_deadline_that_cuts_through_the_trials_leaves_records_that_name_the_kept_weights(
    prepared16: Path, tmp_path: Path
) -> None:
    """A search whose time budget ends while its trials train: every epoch a trial kept after its first
    ended before the deadline, and results.csv, summary.json, each trial's files and best/ agree on them.

    A busy machine may not end one epoch within the first budget: the search then keeps
    nothing, and it is run again with a longer one; the checks below never weaken. A trial's first epoch is
    kept whenever it ends (a trial Tune heard from always has weights), so on a loaded machine it may end
    past the deadline, and only the later ones are held to it."""
    for budget in (90, 240):
        out = tmp_path / f"run-{budget}"
        result = _deadline_search(prepared16, tmp_path, budget, out)
        if result.returncode == 0 or not _no_epoch_kept(out):
            break
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / RunFile.SUMMARY).read_text())
    deadline = summary["started_at"] + budget
    with open(out / RunFile.RESULTS) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 and any(int(r["epochs"]) >= 1 for r in rows), rows
    for r in rows:
        trial = out / RunFile.TRIALS_DIR / r["trial_id"]
        with open(trial / RunFile.METRICS) as fh:
            kept = list(csv.DictReader(fh))
        # cut by the deadline, every kept epoch reported
        assert len(kept) == int(r["epochs"]) < EPOCHS_NEVER_REACHED, (r, kept)
        assert all(float(row["finished_at"]) <= deadline for row in kept[1:]), (deadline, kept)
        if kept:
            assert json.loads((trial / "checkpoint" / "state.json").read_text())["epoch"] == len(kept)
            assert json.loads((trial / "best" / "metrics.json").read_text())["epoch"] == int(r["best_epoch"])
    best = json.loads((out / "best" / "metrics.json").read_text())
    assert best["val_dice"] == pytest.approx(summary["best_value"])
    assert _epochs_told_to_optuna(out) == sorted(
        (int(r["epochs"]), round(float(r["final_val_dice"]), 6) if int(r["epochs"]) else -1.0) for r in rows
    )


def test_a_budget_that_ends_before_any_epoch_says_so_and_what_to_change(prepared16: Path, tmp_path: Path) -> None:
    """A search whose time budget ends before any trial has ended an epoch (a first epoch of more steps than
    any machine ends in the budget) has no best model: ``tune`` says so in one line naming search.time_budget
    and what to change, not only "best trial: none", and exits 1 with no best model written."""
    out = tmp_path / "run-short"
    result = _deadline_search(prepared16, tmp_path, 5, out, steps_per_epoch=STEPS_NEVER_REACHED)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if line.startswith("distmis: no trial reported")]
    # whether a trial got through its set-up inside 5 s is the machine's; the line must say which, as the files do
    began = sorted(p.parent.name for p in (out / RunFile.TRIALS_DIR).glob(f"*/{RunFile.METRICS}"))
    assert said == [_NO_EPOCH_LINES[bool(began)].format(budget=5, failed="")], (began, result.stdout[-3000:])
    summary = json.loads((out / RunFile.SUMMARY).read_text())
    assert summary["began_training"] == len(began)
    assert _no_epoch_kept(out) and not (out / RunFile.BEST_MODEL_DIR).exists()
    assert summary["best_trial_id"] is None
    # the learning-curve plot says no trial reported an epoch, rather than warn of an empty legend
    assert "Traceback" not in result.stderr and "No artists with labels" not in result.stderr, result.stderr[-3000:]


#: tune's line when no trial reported an epoch inside the budget: by whether any trial's first epoch began
_NO_EPOCH_LINES = {
    True: "distmis: no trial reported val_dice inside search.time_budget {budget}{failed}: no best model; start a "
    "new search with a longer search.time_budget (distmis init --budget plans one) or fewer train.steps_per_epoch, "
    "so that a trial's first epoch ends inside it",
    False: "distmis: no trial reported val_dice inside search.time_budget {budget}{failed}: no best model; no "
    "trial's set-up (its process, the data, the model) ended inside it either, so fewer train.steps_per_epoch would "
    "not help: start a new search with a longer search.time_budget (distmis init --budget plans one)",
}


@pytest.mark.parametrize(
    ("began", "failed", "expected"),
    [
        (2, 0, _NO_EPOCH_LINES[True].format(budget="30s", failed="")),
        (0, 0, _NO_EPOCH_LINES[False].format(budget="30s", failed="")),
        # a summary written before the count: the advice that holds when a first epoch began
        (None, 0, _NO_EPOCH_LINES[True].format(budget="30s", failed="")),
        (
            0,
            1,
            _NO_EPOCH_LINES[False].format(
                budget="30s", failed=" (1 of 2 failed: the error column of OUT/results.csv says why)"
            ),
        ),
    ],
)
def test_the_no_epoch_line_tells_a_slow_set_up_from_a_long_first_epoch(
    began: int | None, failed: int, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fewer steps per epoch help only a search whose trials began an epoch before its deadline: one whose
    trials were all still setting up is told that only a longer budget helps."""
    summary = SearchSummary(
        name="short",
        out="OUT",
        metric="val_dice",
        mode="max",
        wall_seconds=31.0,
        trials=2,
        finished=0,
        stopped_early=2 - failed,
        failed=failed,
        max_concurrent_observed=2,
        began_training=began,
    )
    summary.print(time_budget="30s")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("distmis:")]
    assert said == [expected]


def _epochs_told_to_optuna(out: Path) -> list[tuple[int, float]]:
    """Each trial of the search's Optuna study as (epochs told, the last epoch's value or -1), sorted."""
    told = []
    for trial in journal_study(out / RunFile.JOURNAL, "deadline").trials:
        values = trial.intermediate_values
        told.append((len(values), round(values[max(values)], 6) if values else -1.0))
    return sorted(told)


#: a trial's epochs in the deadline search: ending them all in 240 s would take 400 epochs a second
EPOCHS_NEVER_REACHED = 100_000

#: steps in a first epoch no machine ends inside a 5 s budget: 20,000 steps a second
STEPS_NEVER_REACHED = 100_000


def _deadline_search(
    prepared: Path, tmp_path: Path, budget: int, out: Path, *, steps_per_epoch: int = 3
) -> subprocess.CompletedProcess[str]:
    """``distmis tune`` of two long trials under a time budget of ``budget`` seconds."""
    space = tmp_path / f"space-{budget}.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "deadline",
                "data": {"source": str(prepared)},
                # more epochs than any machine ends in the budget: the deadline, not the epoch count, ends the trials
                "train": {
                    "epochs": EPOCHS_NEVER_REACHED,
                    "steps_per_epoch": steps_per_epoch,
                    "batch_size_per_replica": 2,
                },
                "model": {"depth": 2, "filters": 4},
                "search": {
                    "algorithm": "random",
                    "num_samples": 2,
                    "max_concurrent_trials": 2,
                    "seed": 0,
                    "scheduler": {"type": "none"},
                    "time_budget": str(budget),
                },
                "space": {"lr": {"loguniform": [3.0e-3, 2.0e-2]}},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    return subprocess.run(
        [sys.executable, "-m", "distmis", "tune", str(space), "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600 + budget,
    )


def _no_epoch_kept(out: Path) -> bool:
    """Whether a search under a time budget ended before any trial reported an epoch."""
    try:
        with open(out / RunFile.RESULTS) as fh:
            return all(int(r["epochs"] or 0) == 0 for r in csv.DictReader(fh))
    except OSError:
        return True
