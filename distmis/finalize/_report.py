"""What a finalize shows: ``cv.csv``, ``report.md``/``report.html`` and two pictures.

The selection bias is printed and plotted, not hidden: next to each configuration's value in the
search (the best of its epochs on one validation split, the number the search ranked it by) stands
its cross-validated mean, and their difference.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from distmis.files import atomic_file, write_text_atomic
from distmis.finalize._cv import MAIN, Selection
from distmis.finalize._plan import FinalizePlan

COLUMNS = ("configuration", "search value", "CV mean", "CV std", "selection bias", "per fold", "chosen")


def cv_metric(search_metric: str) -> str | None:
    """The cross-validated metric that the search's own metric corresponds to (``None``: no such)."""
    if search_metric.startswith("val_"):
        return search_metric.removeprefix("val_")
    return None


def rows(plan: FinalizePlan, tables: dict[str, dict[str, dict[str, Any]]], selection: Selection) -> list[list[str]]:
    key = cv_metric(plan.config.search.metric) or MAIN
    out = []
    for c in plan.candidates:
        cv = tables[c.name].get(key, {"mean": math.nan, "std": math.nan, "folds": []})
        bias = c.search_value - cv["mean"] if cv_metric(plan.config.search.metric) else math.nan
        out.append(
            [
                f"{c.name} ({_params(c.params)})",
                f"{c.search_value:.4f}",
                _fmt(cv["mean"]),
                _fmt(cv["std"]),
                _fmt(bias, signed=True),
                " ".join(_fmt(v) for v in cv["folds"]),
                "yes" if c.name in selection.members else "",
            ]
        )
    return out


def print_cv_table(plan: FinalizePlan, tables: dict[str, dict[str, dict[str, Any]]], selection: Selection) -> None:
    """finalize's result on the console: each configuration's cross-validated value beside its search value."""
    from rich.table import Table

    from distmis.console import console

    key = cv_metric(plan.config.search.metric) or MAIN
    table = Table(title=f"{plan.folds}-fold cross-validation ({key}, mean ± std over folds)", title_justify="left")
    # the figures never wrap on an 80-column terminal or log; a long configuration wraps instead
    table.add_column("configuration", justify="left", ratio=1)
    for column in (f"CV {key}", "search value", "selection bias", "chosen"):
        table.add_column(column, justify="right", no_wrap=True)
    for name, search, mean, std, bias, _, chosen in rows(plan, tables, selection):
        table.add_row(name, f"{mean} ± {std}", search, bias, chosen)
    console().print(table)


def write_cv_csv(plan: FinalizePlan, per_case: dict[str, dict[str, dict[str, float]]]) -> Path:
    """One row per configuration, fold and case: every out-of-fold score."""
    metrics = sorted({m for cases in per_case.values() for s in cases.values() for m in s})
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["configuration", "fold", "case_id", *metrics])
    for c in plan.candidates:
        for fold, group in enumerate(plan.groups):
            for case in group:
                scores = per_case[c.name].get(case, {})
                writer.writerow([c.name, fold, case, *[scores.get(m, "") for m in metrics]])
    path = plan.out / "cv.csv"
    write_text_atomic(path, buf.getvalue())
    return path


def plots(
    plan: FinalizePlan,
    tables: dict[str, dict[str, dict[str, Any]]],
    per_case: dict[str, dict[str, dict[str, float]]],
) -> list[Path]:
    """Per-configuration CV box plots, and the search value against the CV mean (the selection bias)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from distmis import __version__

    key = cv_metric(plan.config.search.metric) or MAIN
    made = []
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(plan.candidates) + 2), 4))
    data = [
        [s[MAIN] for s in per_case[c.name].values() if math.isfinite(s.get(MAIN, math.nan))] for c in plan.candidates
    ]
    ax.boxplot(data, tick_labels=[c.name for c in plan.candidates], showmeans=True)
    ax.set(ylabel=f"out-of-fold {MAIN} per case", title=f"{plan.folds}-fold cross-validation per configuration")
    ax.grid(alpha=0.3)
    made.append(_save(fig, plan.out / "plots" / "cv_boxplot.png", __version__))
    plt.close(fig)
    if cv_metric(plan.config.search.metric):
        fig, ax = plt.subplots(figsize=(5.5, 5))
        xs = [c.search_value for c in plan.candidates]
        ys = [tables[c.name][key]["mean"] for c in plan.candidates]
        ax.errorbar(xs, ys, yerr=[tables[c.name][key]["std"] for c in plan.candidates], fmt="o", capsize=3)
        for c, x, y in zip(plan.candidates, xs, ys, strict=True):
            ax.annotate(c.name, (x, y), textcoords="offset points", xytext=(5, 5))
        finite = [v for v in xs + ys if math.isfinite(v)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        pad = max(0.02, (hi - lo) * 0.1)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "--", color="grey", lw=1, label="no selection bias")
        ax.set(
            xlabel=f"value in the search ({plan.config.search.metric}, best epoch, one validation split)",
            ylabel=f"cross-validated {key} (mean of {plan.folds} folds)",
            title="Selection bias: below the line, the search was optimistic",
        )
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        made.append(_save(fig, plan.out / "plots" / "selection_bias.png", __version__))
        plt.close(fig)
    return made


def _save(fig: Any, path: Path, version: str) -> Path:
    fig.tight_layout()
    with atomic_file(path, own_directory=True) as tmp:
        fig.savefig(tmp, dpi=100, format="png", metadata={"Software": f"distmis finalize {version}"})
    return path


def write_reports(
    plan: FinalizePlan,
    tables: dict[str, dict[str, dict[str, Any]]],
    selection: Selection,
    pictures: list[Path],
) -> tuple[Path, Path]:
    from distmis.reports import write_report

    key = cv_metric(plan.config.search.metric) or MAIN
    chosen = " + ".join(selection.members)
    headlines = [
        f"**Chosen: {chosen}**, cross-validated {MAIN} {_fmt(selection.cv[MAIN]['mean'])} "
        f"± {_fmt(selection.cv[MAIN]['std'])} over {plan.folds} folds; its fold models are the ensemble in {plan.final}.",
        *[
            f"{name}: cross-validated {MAIN} {_fmt(tables[name][MAIN]['mean'])} (search {c.search_value:.4f} "
            f"{plan.config.search.metric})"
            for name, c in ((c.name, c) for c in plan.candidates)
        ],
    ]
    notes = [
        f"Folds: the {sum(len(g) for g in plan.groups)} training and validation cases of the search's data in "
        f"{plan.folds} folds (seed {plan.seed}); the test split was not used.",
        f"Selection bias = value in the search - cross-validated {key}: the search ranked its trials by the best "
        "epoch on one small validation split, an optimistic estimate (the winner's curse).",
        f"Out-of-fold predictions from the raw scans{' with test-time mirroring' if plan.tta else ''}, scored in the "
        "scan's geometry.",
    ]
    if selection.pair_cv:
        notes.append(
            "Ensembles of two configurations (probabilities averaged): "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in selection.pair_cv.items())
        )
    if plan.postprocess:
        gains = ", ".join(f"{k} {_fmt(v, signed=True)}" for k, v in selection.postprocess_gain.items())
        kept = ", ".join(n for n, _ in selection.largest_component) or "none"
        notes.append(f"Largest connected component only, CV Dice change per mask: {gains}; kept for: {kept}.")
    return write_report(
        plan.out,
        title=f"distmis finalize: {plan.config.name}",
        headlines=headlines,
        columns=COLUMNS,
        rows=rows(plan, tables, selection),
        notes=notes,
        plots=pictures,
    )


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _fmt(value: float, *, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


__all__ = ["COLUMNS", "cv_metric", "plots", "rows", "write_cv_csv", "write_reports"]
