"""What ``distmis compare`` runs: the fixed configurations and one search per parallelism mode.

Same configurations in every mode. An adaptive sampler (TPE) proposes different points
depending on which results arrive first, and that order is exactly what the parallelism
mode changes; the modes would then be compared on different work. So the budget's
configurations are drawn once, up front (the space's grid in order for a grid search,
otherwise Optuna's seeded RandomSampler over the space: TPE's own start-up phase), and every
mode runs that list (``search.algorithm: points``). The scheduler (e.g. ASHA) is kept: early
stopping is part of what a mode gains or loses.

Same resources in every mode: ``k`` worker slots of ``cpus_per_worker`` CPUs (and
``gpus_per_worker`` GPUs):

=============  =====================  ==========================
mode           trials at once         workers per trial
=============  =====================  ==========================
baseline       1                      1   (the first few configurations, sequentially)
experiment     k                      1
data           1                      k
hybrid         k / n                  n   (1 < n < k, n divides k)
=============  =====================  ==========================
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmis.config import ExperimentConfig
from distmis.exceptions import ConfigError

MODES = ("experiment", "data", "hybrid")
BASELINE = "baseline"


@dataclass(frozen=True)
class ModePlan:
    name: str
    workers_per_trial: int
    concurrent_trials: int
    points: tuple[dict[str, Any], ...]
    #: "linear": the learning rate times the workers per trial (a "-lr" variant of data/hybrid)
    lr_scaling: str | None = None

    @property
    def parallelism_mode(self) -> str:
        if self.workers_per_trial == 1:
            return "experiment"
        return "data" if self.concurrent_trials == 1 else "hybrid"

    @property
    def slots(self) -> int:
        return self.workers_per_trial * self.concurrent_trials


def fixed_points(config: ExperimentConfig, budget: int) -> list[dict[str, Any]]:
    """The ``budget`` configurations every mode runs (see the module docstring)."""
    from distmis.space import decode_params, define_by_run, grid_points

    if not config.space:
        raise ConfigError("space: the search space is empty; distmis compare needs parameters to search")
    if config.search.algorithm == "points":
        return [dict(p) for p in (config.search.points or [])[:budget]]
    if config.search.algorithm == "grid":
        return grid_points(config.space)[:budget]
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=config.search.seed))
    sample = define_by_run(config.space)
    points = []
    for _ in range(budget):
        trial = study.ask()
        sample(trial)
        points.append(decode_params(config.space, dict(trial.params)))
        study.tell(trial, 0.0)
    return points


def plan_modes(
    modes: list[str],
    *,
    workers: int,
    points: list[dict[str, Any]],
    hybrid_workers: int | None,
    baseline_trials: int,
    lr_scaling: str = "none",
) -> list[ModePlan]:
    """One plan per requested mode, plus the sequential baseline first (unless ``baseline_trials`` is 0).

    With ``lr_scaling="linear"``, data and hybrid also run a ``-lr`` variant whose learning
    rate is scaled by the workers per trial, so the report shows the accuracy side of strong
    scaling (a larger global batch, fewer optimiser steps per epoch) with and without it.

    Raises:
        ConfigError: unknown mode, fewer than 2 worker slots, or a hybrid split that does not exist.
    """
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ConfigError(f"--modes: unknown {unknown}; expected a comma-separated subset of {list(MODES)}")
    if workers < 2:
        raise ConfigError(f"--slots {workers}: comparing parallelism needs at least 2 worker slots")
    pts = tuple(points)
    plans = []
    if baseline_trials > 0:
        plans.append(ModePlan(BASELINE, 1, 1, pts[:baseline_trials]))
    for mode in modes:
        if mode == "experiment":
            plans.append(ModePlan(mode, 1, workers, pts))
        elif mode == "data":
            plans.append(ModePlan(mode, workers, 1, pts))
        else:
            n = hybrid_workers or (2 if workers >= 4 and workers % 2 == 0 else None)
            if n is None or not 1 < n < workers or workers % n:
                raise ConfigError(
                    f"hybrid: k/n trials x n workers needs 1 < n < k with n dividing k; got k={workers}, "
                    f"n={n}. Give --slots 4 or more (e.g. --slots 4 --cpus-per-worker 0.5 on 2 cores), "
                    "set --hybrid-workers, or leave hybrid out of --modes"
                )
            plans.append(ModePlan(mode, n, workers // n, pts))
    if lr_scaling == "linear":
        plans += [
            ModePlan(f"{p.name}-lr", p.workers_per_trial, p.concurrent_trials, p.points, "linear")
            for p in list(plans)
            if p.workers_per_trial > 1
        ]
    elif lr_scaling != "none":
        raise ConfigError(f"--lr-scaling {lr_scaling!r}: expected none or linear")
    return plans


def mode_config(
    base: ExperimentConfig,
    plan: ModePlan,
    *,
    cpus_per_worker: float,
    gpus_per_worker: float,
    tracking_uri: str,
    experiment: str,
    parent_run_id: str | None,
    base_dir: Path,
) -> dict[str, Any]:
    """The search-space file of one mode: the user's file with the points, parallelism and tracking set."""
    data = base.to_yaml_dict()
    source = data["data"]["source"]
    if source != "synthetic" and not Path(source).expanduser().is_absolute():
        data["data"]["source"] = str((base_dir / source).resolve())  # the file is written elsewhere
    if data["data"].get("cache_dir") and not Path(data["data"]["cache_dir"]).expanduser().is_absolute():
        data["data"]["cache_dir"] = str((base_dir / data["data"]["cache_dir"]).resolve())
    data["name"] = f"{base.name}-{plan.name}"
    data["search"].update(
        algorithm="points",
        points=[dict(p) for p in plan.points],
        num_samples=len(plan.points),
        max_concurrent_trials=plan.concurrent_trials,
    )
    if plan.lr_scaling is not None:
        data["train"]["lr_scaling"] = plan.lr_scaling
    data["parallelism"] = {
        "mode": plan.parallelism_mode,
        "workers_per_trial": plan.workers_per_trial,
        "cpus_per_worker": cpus_per_worker,
        "gpus_per_worker": gpus_per_worker,
    }
    # an address with credentials is not written to disk: the mode's process gets it from its environment
    from distmis.tracking import redact_uri

    written = tracking_uri if redact_uri(tracking_uri) == tracking_uri else None
    data["tracking"].update(uri=written or None, experiment=experiment, parent_run_id=parent_run_id)
    ExperimentConfig.model_validate(data)  # fail here, not in a subprocess
    return data
