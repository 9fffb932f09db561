"""Search-space sampling without Ray: conditions respected, grids exact."""

from __future__ import annotations

import itertools
from pathlib import Path

import optuna
import pytest

from distmis.config import ParamSpec, load_config
from distmis.exceptions import ConfigError
from distmis.space import define_by_run, grid_points, ordered_params

REPO = Path(__file__).resolve().parents[2]

SPACE = {
    "groups": ParamSpec(choice=[2, 4], when={"norm": "group"}),  # listed before its target on purpose
    "lr": ParamSpec(loguniform=(1e-4, 1e-2)),
    "norm": ParamSpec(choice=["batch", "group", "none"]),
    "amsgrad": ParamSpec(choice=[True, False]),
}


@pytest.mark.parametrize(
    "sampler", [optuna.samplers.RandomSampler(seed=0), optuna.samplers.TPESampler(seed=0, n_startup_trials=5)]
)
def test_conditional_parameter_only_sampled_when_condition_holds(sampler: optuna.samplers.BaseSampler) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler)
    fn = define_by_run(SPACE)
    study.optimize(lambda t: (fn(t), t.params["lr"])[1], n_trials=40)
    with_group = [t.params for t in study.trials if t.params["norm"] == "group"]
    without = [t.params for t in study.trials if t.params["norm"] != "group"]
    assert with_group and without
    assert all("groups" in p for p in with_group)
    assert all("groups" not in p for p in without)
    assert all(1e-4 <= t.params["lr"] <= 1e-2 for t in study.trials)


def test_order_puts_targets_first() -> None:
    order = ordered_params(SPACE)
    assert order.index("norm") < order.index("groups")


def test_grid_is_exactly_the_prototype_grid() -> None:
    cfg = load_config(REPO / "search_spaces" / "distmis_grid.yaml", require_space=True)
    points = grid_points(cfg.space)
    expected = {
        (lr, norm, b2, ams)
        for lr, norm, b2, ams in itertools.product(
            [1e-4, 5e-4, 1e-3, 5e-3], ["batch", "group"], [0.99, 0.999], [True, False]
        )
    }
    got = {(p["lr"], p["norm"], p["beta_2"], p["amsgrad"]) for p in points}
    assert len(points) == 32 and got == expected


def test_grid_with_condition() -> None:
    space = {"norm": ParamSpec(choice=["batch", "group"]), "groups": ParamSpec(choice=[2, 4], when={"norm": "group"})}
    points = grid_points(space)
    assert sorted(points, key=str) == sorted(
        [{"norm": "batch"}, {"norm": "group", "groups": 2}, {"norm": "group", "groups": 4}], key=str
    )


def test_grid_rejects_continuous() -> None:
    with pytest.raises(ConfigError, match="grid search needs `choice`"):
        grid_points({"lr": ParamSpec(loguniform=(1e-4, 1e-2))})
