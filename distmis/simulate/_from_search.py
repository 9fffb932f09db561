"""Curves read straight from finished search directories (a pilot search run without a scheduler).

What a search leaves is enough to rebuild the table: ``summary.json`` holds each trial's typed
parameters, status and start, ``results.csv`` its slot's cold start, ``trials/<id>/metrics.csv``
every epoch with its seconds and end time (and so the time the trial spent reporting between
epochs), and ``trials/<id>/config.yaml`` its training seed.
"""

from __future__ import annotations

import bisect
import csv
from pathlib import Path

import yaml

from distmis.documents import finite_or_none, read_json
from distmis.schema import RunFile
from distmis.search_summary import TrialRow, read_search_summary
from distmis.simulate._curves import METRIC_PREFIX, Curve, CurveError, CurveTable


def _epochs(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _cold_starts(search: Path, trials: list[str]) -> dict[str, float]:
    """Each trial's slot cold start (``group_startup_seconds`` of ``results.csv``), where recorded.

    Raises:
        CurveError: ``results.csv`` records cold starts but has no row for one of ``trials`` (a
            truncated file would otherwise model that trial's cold start as 0 s).
    """
    path = search / RunFile.RESULTS
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    found = {row.get("trial_id"): finite_or_none(row.get("group_startup_seconds")) for row in rows}
    if any(v is not None for v in found.values()):
        missing = [t for t in trials if t not in found]
        if missing:
            raise CurveError(
                f"{path}: no row for trial(s) {', '.join(missing[:3])} of summary.json: a truncated file? Their "
                "cold starts are unknown; restore it, or simulate from a curve table"
            )
    return {tid: value for tid, value in found.items() if tid is not None and value is not None}


#: the phases of ``timings.json`` before the first trial starts
FIXED_PHASES = ("checks", "data", "ray_and_tracking_start", "tuner_setup")


def _fixed_seconds(search: Path) -> float | None:
    """The search's time before its first trial, from its ``timings.json``, where recorded."""
    try:
        timings = read_json(search / RunFile.TIMINGS, error=CurveError, what="search timings")
    except CurveError:
        return None
    if not isinstance(timings, dict):
        return None
    phases = [finite_or_none(timings.get(p)) for p in FIXED_PHASES]
    return sum(p for p in phases if p is not None) if any(p is not None for p in phases) else None


def _training_seed(trial_dir: Path) -> int:
    try:
        doc = yaml.safe_load((trial_dir / RunFile.CONFIG).read_text(encoding="utf-8")) or {}
        return int(doc.get("train", {}).get("seed", 0))
    except (OSError, yaml.YAMLError, TypeError, ValueError, AttributeError):
        return 0


def curves_of_search(search: str | Path) -> tuple[CurveTable, int]:
    """The curves of one finished search, and how many trials were left out (failed or diverged).

    Start-up is what a worker spent before a trial's first epoch: for a trial on a fresh slot, the
    time from the trial's start to its first epoch, and apart the slot's cold start before it; for a
    trial on a reused slot, the time from the end of the trial that freed the slot to its first epoch.

    Raises:
        CurveError: not a finished search (no ``summary.json`` with trials).
    """
    search = Path(search)
    summary = read_search_summary(search, error=CurveError)
    if not summary.trials_detail:
        raise CurveError(f"{search}: not a finished search (summary.json lists no trials)")
    starts = {t.trial_id: finite_or_none(t.started_at) for t in summary.trials_detail}
    trials = sorted(
        (t for t in summary.trials_detail if starts[t.trial_id] is not None), key=lambda t: starts[t.trial_id] or 0.0
    )
    stopped = [t.trial_id for t in trials if t.stopped_early]
    if stopped:
        raise CurveError(
            f"{search}: {len(stopped)} of its {len(trials)} trials were stopped early by its scheduler "
            f"({', '.join(stopped[:3])}{', ...' if len(stopped) > 3 else ''}); simulate replays whole curves: record "
            "a pilot search with `scheduler: {type: none}`"
        )
    cold = _cold_starts(search, [t.trial_id for t in trials if t.status == "TERMINATED"])
    fixed = _fixed_seconds(search)
    ends: list[float] = []  # ends of finished trials, sorted: the moments a slot was freed
    curves: list[Curve] = []
    left_out = 0
    for t in trials:
        tid, started = t.trial_id, starts[t.trial_id] or 0.0
        epochs_file = search / RunFile.TRIALS_DIR / tid / RunFile.METRICS
        if t.status == "TERMINATED" and not epochs_file.is_file():
            raise CurveError(f"{epochs_file}: missing, though trial {tid} finished; its curve is gone (restore it)")
        rows = _epochs(epochs_file)
        finished = finite_or_none(t.finished_at)
        if finished is not None:
            bisect.insort(ends, finished)
        curve = _curve(t, rows, search / RunFile.TRIALS_DIR / tid)
        if curve is None or t.status != "TERMINATED":
            left_out += 1
            continue
        curve.search_fixed_seconds = fixed
        first_epoch_start = float(rows[0]["finished_at"]) - curve.epoch_seconds[0]
        if curve.warm:
            i = bisect.bisect_right(ends, started) - 1  # the latest slot freed before it started
            freed = ends.pop(i) if i >= 0 else started
            curve.startup_seconds = max(0.0, first_epoch_start - freed)
        else:
            curve.startup_seconds = max(0.0, first_epoch_start - started)
            curve.slot_startup_seconds = cold.get(tid)
        curves.append(curve)
    if not curves:
        raise CurveError(f"{search}: no trial of this search finished with finite metrics")
    return CurveTable(curves, str(search), _recipe_of_search(search)), left_out


def _recipe_of_search(search: Path) -> str | None:
    """The recipe of the network a search trained (its search file's ``model``), where it can be read."""
    from pydantic import ValidationError

    from distmis.config import ModelConfig
    from distmis.recipes import recipe_of

    try:
        doc = yaml.safe_load((search / RunFile.SEARCH_FILE).read_text(encoding="utf-8")) or {}
        return recipe_of(ModelConfig.model_validate(doc.get("model") or {}))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValidationError, AttributeError, TypeError):
        return None


def _curve(trial: TrialRow, rows: list[dict[str, str]], trial_dir: Path) -> Curve | None:
    """One trial's curve, or None when it has no epoch or a value that is not a finite number."""
    if not rows:
        return None
    metrics = [c for c in rows[0] if c.startswith(METRIC_PREFIX) and c != "val_seconds"]
    values: dict[str, list[float]] = {m: [] for m in metrics}
    seconds: list[float] = []
    ended: list[float] = []
    for row in rows:
        numbers = {m: finite_or_none(row.get(m)) for m in metrics}
        took = finite_or_none(row.get("epoch_seconds"))
        end = finite_or_none(row.get("finished_at"))
        if took is None or any(v is None for v in numbers.values()) or end is None:
            return None
        seconds.append(took)
        ended.append(end)
        for m, v in numbers.items():
            assert v is not None
            values[m].append(v)
    return Curve(
        trial=trial.trial_id,
        training_seed=_training_seed(trial_dir),
        params={k: v for k, v in trial.params.items() if k not in ("seed", "train.seed")},
        warm=bool(trial.warm),
        startup_seconds=0.0,
        epoch_seconds=seconds,
        report_seconds=report_seconds(seconds, ended),
        values=values,
    )


def report_seconds(epoch_seconds: list[float], finished_at: list[float]) -> list[float | None]:
    """Per epoch, the time from its end to the next epoch's start (None after the last).

    ``metrics.csv`` dates each epoch's end (``finished_at``) and times the epoch itself, so the
    gap between one epoch's end and the next one's start is what the trial spent reporting: its
    checkpoint, Tune's round trip through the driver. A trial restarted between two epochs
    shows its restart there; the simulation takes the median over every epoch, which passes over it.
    """
    gaps: list[float | None] = [
        max(0.0, finished_at[i + 1] - epoch_seconds[i + 1] - finished_at[i]) for i in range(len(finished_at) - 1)
    ]
    return [*gaps, None] if finished_at else []


def read_tables(sources: list[str | Path]) -> list[CurveTable]:
    """Each curve-table file or finished search directory as a table of its own, in the order
    given; with more than one, each curve's trial is prefixed by its source's index (``1:...``), so
    that two recordings' trials keep apart when :func:`joined`."""
    from distmis.simulate._curves import read_table

    tables: list[CurveTable] = []
    for index, source in enumerate(sources):
        path = Path(source)
        if path.is_dir():
            table, left_out = curves_of_search(path)
            if left_out:
                print(f"distmis: {path}: {left_out} trial(s) failed or diverged; their curves are left out", flush=True)
        elif path.exists():
            table = read_table(path)
        else:
            raise CurveError(f"{path}: no such curve table or search directory")
        if len(sources) > 1:
            for c in table.curves:
                c.trial = f"{index}:{c.trial}"
        tables.append(CurveTable(table.curves, str(path), table.recipe))
    return tables


def joined(tables: list[CurveTable]) -> CurveTable:
    """One table of the curves of ``tables``, in order."""
    recipes = {t.recipe for t in tables}
    recipe = recipes.pop() if len(recipes) == 1 else None
    return CurveTable([c for t in tables for c in t.curves], ", ".join(t.source for t in tables), recipe)


def read_curves(sources: list[str | Path]) -> CurveTable:
    """One table from curve-table files and finished search directories, in the order given."""
    return joined(read_tables(sources))


__all__ = ["curves_of_search", "joined", "read_curves", "read_tables", "report_seconds"]
