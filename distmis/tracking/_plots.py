"""Pictures of a finished search (PNG): learning curves and Optuna's study plots.

Optuna's plots are drawn from the study in the search's journal, as its sampler recorded it.
A grid (Tune's own searcher) keeps no study: one is built in memory from the search's results,
by the rule the Optuna searcher records trials with (a trial that trained every epoch is
complete with its best value, one the scheduler stopped is pruned with its last), so that every
algorithm gets the same pictures.
"""

from __future__ import annotations

import contextlib
import csv
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distmis.config import ExperimentConfig
from distmis.files import atomic_file
from distmis.metrics import LOSS
from distmis.schema import RunFile
from distmis.space import ParamSpec, optuna_distribution

if TYPE_CHECKING:
    import optuna


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
        path = out / RunFile.TRIALS_DIR / r["trial_id"] / RunFile.METRICS
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
    if axes[0].lines:
        axes[0].legend(fontsize=7, ncol=2)
    else:  # a search stopped (by its time budget, or a failure) before any trial ended an epoch
        for ax in axes:
            ax.text(0.5, 0.5, "no trial reported an epoch", ha="center", va="center", transform=ax.transAxes)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    target = out / "plots" / "learning_curves.png"
    with atomic_file(target, own_directory=True) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return target


def optuna_plots(out: Path, config: ExperimentConfig, rows: list[dict[str, str]]) -> list[Path]:
    """Optimisation history, parameter importances and parallel coordinates (those that can be drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = _journal_study(out, config) or _study_of_results(config, rows)
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
        with atomic_file(target, own_directory=True) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
        plt.close(fig)
        made.append(target)
    return made


def _journal_study(out: Path, config: ExperimentConfig) -> optuna.Study | None:
    """The study the search's Optuna searcher kept, or ``None`` (a grid keeps none)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    journal = out / RunFile.JOURNAL
    if journal.is_symlink() or not journal.is_file():
        return None  # never read through a link: a grid's search has none
    storage = JournalStorage(JournalFileBackend(str(journal)))
    names = [s.study_name for s in storage.get_all_studies()]
    if config.name not in names:
        return None
    return optuna.load_study(study_name=config.name, storage=storage)


def _study_of_results(config: ExperimentConfig, rows: list[dict[str, str]]) -> optuna.Study:
    """An in-memory study of a search without a journal, as the Optuna searcher would have recorded it."""
    import optuna

    metric, mode = config.search.metric, config.search.mode
    study = optuna.create_study(direction="maximize" if mode == "max" else "minimize", study_name=config.name)
    for r in rows:
        pruned = r.get("stopped_early") == "True"
        value = r.get(f"final_{metric}" if pruned else f"best_{metric}", "")
        if r["status"] != "TERMINATED" or value in ("", "nan") or math.isnan(float(value)):
            continue
        params, dists = {}, {}
        for name, spec in config.space.items():
            if r.get(name, "") != "":
                params[name], dists[name] = _parse(r[name], spec), optuna_distribution(spec)
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
    return study


def import_plotting() -> None:
    """Import matplotlib and Optuna's plotting, which :func:`search_plots` draws with; an error is left
    for :func:`search_plots` to raise, where the plots are drawn.

    Why: those imports are most of what drawing the plots costs, after the last trial, while
    the user waits. :class:`~distmis.tracking.PlottingPreload` calls this on a thread at Tune's
    first step, when a core is idle: earlier it would compete with Ray's start for the CPU,
    later with the trials.
    """
    with contextlib.suppress(Exception):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
        import optuna.importance
        import optuna.visualization.matplotlib  # noqa: F401


def search_plots(out: Path, config: ExperimentConfig) -> list[Path]:
    with open(out / RunFile.RESULTS) as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return []
    return [learning_curves(out, rows, config.search.metric), *optuna_plots(out, config, rows)]
