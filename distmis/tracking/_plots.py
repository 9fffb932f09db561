"""Pictures of a finished search (PNG): learning curves and Optuna's study plots.

Optuna's plots are drawn for every algorithm (grid and random too): the study is rebuilt in
memory from the search's results as the search's sampler records it: a trial that trained every
epoch is complete with its best value, one the scheduler stopped is pruned with its last.
"""

from __future__ import annotations

import contextlib
import csv
import math
import warnings
from pathlib import Path
from typing import Any

from distmis.config import ExperimentConfig
from distmis.files import atomic_file
from distmis.metrics import LOSS
from distmis.space import ParamSpec


def _distribution(spec: ParamSpec):  # noqa: ANN202
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if spec.loguniform is not None:
        return FloatDistribution(*spec.loguniform, log=True)
    if spec.uniform is not None:
        return FloatDistribution(*spec.uniform)
    if spec.randint is not None:
        return IntDistribution(spec.randint[0], spec.randint[1] - 1)
    return CategoricalDistribution(list(spec.choice or []))


def _parse(value: str, spec: ParamSpec) -> Any:
    if spec.choice is not None:
        for c in spec.choice:
            if str(c) == value:
                return c
        return value
    return int(value) if spec.randint is not None else float(value)


def learning_curves(out: Path, rows: list[dict[str, str]], metric: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        path = out / "trials" / r["trial_id"] / "metrics.csv"
        if not path.is_file():
            continue
        with open(path) as fh:
            hist = list(csv.DictReader(fh))
        epochs = [int(h["epoch"]) for h in hist]
        style = "--" if r.get("stopped_early") == "True" else "-"
        axes[0].plot(epochs, [float(h[metric]) for h in hist], style, marker="o", ms=3, label=r["trial_id"])
        axes[1].plot(epochs, [float(h[LOSS]) for h in hist], style, marker="o", ms=3)
    axes[0].set(xlabel="epoch", ylabel=metric, title=f"{metric} per trial (dashed: stopped early)")
    axes[1].set(xlabel="epoch", ylabel="training loss", title="training loss per trial")
    axes[0].legend(fontsize=7, ncol=2)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    target = out / "plots" / "learning_curves.png"
    with atomic_file(target) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return target


def optuna_plots(out: Path, config: ExperimentConfig, rows: list[dict[str, str]]) -> list[Path]:
    """Optimisation history, parameter importances and parallel coordinates (those that can be drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    metric, mode = config.search.metric, config.search.mode
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if mode == "max" else "minimize", study_name=config.name)
    for r in rows:
        pruned = r.get("stopped_early") == "True"
        # as the search's sampler saw it: a finished trial's best value, a stopped one's last (pruned)
        value = r.get(f"final_{metric}" if pruned else f"best_{metric}", "")
        if r["status"] != "TERMINATED" or value in ("", "nan") or math.isnan(float(value)):
            continue
        params, dists = {}, {}
        for name, spec in config.space.items():
            if r.get(name, "") != "":
                params[name], dists[name] = _parse(r[name], spec), _distribution(spec)
        if pruned:
            trial = optuna.trial.create_trial(
                params=params,
                distributions=dists,
                state=optuna.trial.TrialState.PRUNED,
                intermediate_values={int(r.get("epochs") or 1): float(value)},
            )
        else:
            trial = optuna.trial.create_trial(params=params, distributions=dists, value=float(value))
        study.add_trial(trial)
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        return []  # nothing to draw: every trial failed or stopped (Optuna would only warn)
    made = []
    plots: dict[str, Any] = {
        "optimization_history": optuna.visualization.matplotlib.plot_optimization_history,
        "param_importances": optuna.visualization.matplotlib.plot_param_importances,
        "parallel_coordinate": optuna.visualization.matplotlib.plot_parallel_coordinate,
    }
    for name, draw in plots.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ax = draw(study)
            except Exception:  # noqa: BLE001 - e.g. importances need >= 2 trials with varying params
                continue
        fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        fig.set_size_inches(8, 5)
        fig.tight_layout()
        target = out / "plots" / f"{name}.png"
        with atomic_file(target) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
        plt.close(fig)
        made.append(target)
    return made


def import_plotting() -> None:
    """Import matplotlib and Optuna's plotting, which :func:`search_plots` draws with; an error is left
    for :func:`search_plots` to raise, where the plots are drawn.

    Why: those imports took 2.1 s of the 2.9 s a search spent on its plots (2 cores), after the
    last trial, while the user waits. :class:`~distmis.tracking.PlottingPreload` calls this on a
    thread at Tune's first step, when a core is idle. (Earlier places, measured: on the tracking
    thread while Ray starts, it competed with Ray's processes for the CPU and delayed the start
    by 0.6-0.9 s; on the first trial's report, the trials ran about 1 s slower.)
    """
    with contextlib.suppress(Exception):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
        import optuna.importance
        import optuna.visualization.matplotlib  # noqa: F401


def search_plots(out: Path, config: ExperimentConfig) -> list[Path]:
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return []
    return [learning_curves(out, rows, config.search.metric), *optuna_plots(out, config, rows)]
