"""Planning a comparison: fixed configurations, mode shapes, per-mode search files (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distmis.compare import config_key, fixed_points, mode_config, plan_modes
from distmis.config import ExperimentConfig
from distmis.exceptions import ConfigError


def _config(**search: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "c",
            "data": {"source": "prepared"},
            "search": {"seed": 3, **search},
            "space": {
                "lr": {"loguniform": [1e-4, 1e-2]},
                "norm": {"choice": ["group", "none"]},
                "groups": {"choice": [2, 4], "when": {"norm": "group"}},
            },
        }
    )


def test_fixed_points_are_reproducible_and_respect_conditions() -> None:
    a, b = fixed_points(_config(), 6), fixed_points(_config(), 6)
    assert a == b and len(a) == 6
    assert all(("groups" in p) == (p["norm"] == "group") for p in a)
    assert fixed_points(_config(seed=4), 6) != a


def test_mode_shapes_use_the_same_slots() -> None:
    points = fixed_points(_config(), 4)
    plans = {
        p.name: p
        for p in plan_modes(
            ["experiment", "data", "hybrid"], workers=4, points=points, hybrid_workers=None, baseline_trials=2
        )
    }
    assert [(p.concurrent_trials, p.workers_per_trial) for p in plans.values()] == [(1, 1), (4, 1), (1, 4), (2, 2)]
    assert all(p.points == tuple(points) for n, p in plans.items() if n != "baseline")
    assert plans["baseline"].points == tuple(points[:2])
    assert {p.parallelism_mode for p in plans.values()} == {"experiment", "data", "hybrid"}
    with pytest.raises(ConfigError, match="hybrid"):
        plan_modes(["hybrid"], workers=2, points=points, hybrid_workers=None, baseline_trials=0)
    with pytest.raises(ConfigError, match="unknown"):
        plan_modes(["model"], workers=4, points=points, hybrid_workers=None, baseline_trials=0)


def test_mode_config_runs_exactly_the_points(tmp_path: Path) -> None:
    config = _config()
    points = fixed_points(config, 3)
    plan = plan_modes(["hybrid"], workers=4, points=points, hybrid_workers=2, baseline_trials=0)[0]
    data = mode_config(
        config,
        plan,
        cpus_per_worker=0.5,
        gpus_per_worker=0,
        tracking_uri="sqlite:///x.db",
        experiment="e",
        parent_run_id="abc",
        base_dir=tmp_path,
    )
    cfg = ExperimentConfig.model_validate(data)
    assert cfg.search.algorithm == "points" and cfg.search.points == points
    assert (cfg.parallelism.mode, cfg.parallelism.workers_per_trial, cfg.search.max_concurrent_trials) == (
        "hybrid",
        2,
        2,
    )
    assert cfg.data.source == str((tmp_path / "prepared").resolve())  # relative paths still point at the data
    assert cfg.tracking.parent_run_id == "abc"


def test_points_must_name_searched_parameters() -> None:
    with pytest.raises(ValueError, match=r"search\.points\.0: \[.learning_rate.\] are not parameters"):
        _config(algorithm="points", points=[{"learning_rate": 0.1}])


def test_config_key_matches_yaml_csv_and_mlflow_spellings() -> None:
    assert config_key({"lr": 0.001, "norm": "group", "amsgrad": True}) == config_key(
        {"lr": "0.001", "norm": "group", "amsgrad": "true", "groups": ""}
    )
