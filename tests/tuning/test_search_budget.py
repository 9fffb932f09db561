"""search.time_budget: the deadline counts every run of a search, and a bad duration names the key; the
trials' configurations find their data from anywhere."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from distmis.config import SearchConfig
from distmis.schema import RunFile
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
