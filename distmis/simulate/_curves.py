"""Learning curves as data: the curve table, read from a file or from finished searches, and written.

A simulated search needs, for every configuration it may propose, what a real trial of that
configuration reported epoch by epoch and how long each epoch took. The curve table holds that,
one row per trial and epoch, as CSV (gzip-compressed when the name ends in ``.gz``)::

    trial              a trial's id (its rows share it; epochs 1, 2, ... in order)
    training_seed      train.seed of the trial (two seeds of one configuration measure seed noise)
    warm               1 when the trial ran in a process a previous trial had started (Tune's reused actors)
    slot_startup_seconds  a fresh slot's cold start before the trial started (its process, Ray's actor);
                       empty for a warm trial
    startup_seconds    seconds from the trial's start to its first epoch (data, model, tracing); for a
                       warm trial, from the end of the trial that freed its slot
    epoch              1, 2, ...
    epoch_seconds      seconds of that epoch, its validation included
    report_seconds     seconds from that epoch's end to the next epoch's start: the trial's checkpoint
                       and its result's way to the driver and back; empty after a trial's last epoch
                       and where it was not recorded (a table from before it existed)
    peak_memory_bytes  the trial's peak memory where it is known, else empty
    search_fixed_seconds  the recorded search's time before its first trial (checks, data, Ray and
                       MLflow start-up, the tuner), the same on every row of one search; may be empty
    param.<name>       one column per searched parameter, empty where a condition left it unsampled
    val_<metric>       every validation metric the trial reported (val_dice, val_loss, ...)

Every value is a finite number: a trial whose metrics diverged (NaN) is left out when a table is
built from a search, because a table stands for configurations that can be trained.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import math
import re
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distmis.exceptions import ConfigError
from distmis.files import write_text_atomic
from distmis.recipes import RECIPES
from distmis.space import ParamSpec, Space

PARAM_PREFIX = "param."
METRIC_PREFIX = "val_"
#: the columns every row has, in the order a table is written
FIXED_COLUMNS = (
    "trial",
    "training_seed",
    "warm",
    "slot_startup_seconds",
    "startup_seconds",
    "epoch",
    "epoch_seconds",
    "report_seconds",
    "peak_memory_bytes",
    "search_fixed_seconds",
)
#: the parameters that set what an epoch costs (the others change what it learns, not its seconds)
COST_PARAMS = ("filters", "depth", "batch_size_per_replica", "norm")


class CurveError(ConfigError):
    """A curve table that cannot stand for the search asked of it (one line naming file and row)."""


@dataclass
class Curve:
    """One trial of a recorded search: its configuration and what it reported each epoch."""

    trial: str
    training_seed: int
    params: dict[str, Any]
    warm: bool
    startup_seconds: float
    slot_startup_seconds: float | None = None
    epoch_seconds: list[float] = field(default_factory=list)
    #: per epoch; None after the last epoch and where it was not recorded
    report_seconds: list[float | None] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)
    peak_memory_bytes: float | None = None
    search_fixed_seconds: float | None = None

    @property
    def epochs(self) -> int:
        return len(self.epoch_seconds)

    def result(self, epoch: int) -> dict[str, float]:
        """What the trial reported after ``epoch`` (1-based), as Tune's result holds it."""
        return {"epoch": epoch, **{name: series[epoch - 1] for name, series in self.values.items()}}


@dataclass
class CurveTable:
    """The curves of one or more recorded searches, and where they came from (for error messages)."""

    curves: list[Curve]
    source: str
    #: the training recipe the curves were recorded with (:mod:`distmis.recipes`): a table file says
    #: it in its first line (``# recipe: distmis``), a search directory in its search file; ``None``
    #: where unknown, or where joined tables differ
    recipe: str | None = None

    @property
    def metrics(self) -> list[str]:
        return sorted({m for c in self.curves for m in c.values})

    @property
    def params(self) -> list[str]:
        return sorted({p for c in self.curves for p in c.params})


# --------------------------------------------------------------------------- cells
def cell(value: Any) -> str:
    """A parameter value as written in the table (``true``/``false`` as YAML writes booleans)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_param(text: str, spec: ParamSpec | None) -> Any:
    """A cell back to a value: the matching choice, else a number, else the text itself.

    A table may span more than the search: a grid's few values of a parameter the table recorded
    over a range, or one choice of a parameter the table varied. Those values stay as recorded:
    they are configurations the search will not propose, but they are still neighbours.
    """
    if text == "":
        return None
    if spec is not None and spec.choice is not None:
        for option in spec.choice:
            if cell(option) == text:
                return option
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number


def architecture(curve: Curve) -> tuple[str, ...]:
    """The values of :data:`COST_PARAMS` (empty where the search did not vary one: the same cost throughout)."""
    return tuple(cell(curve.params.get(name)) for name in COST_PARAMS)


def architecture_medians(
    curves: Iterable[Curve], seconds: Callable[[Curve], float | None]
) -> dict[tuple[str, ...], float]:
    """The median of ``seconds`` per :func:`architecture`, over the curves for which it is not None.

    What a curve's cost is compared with: its own architecture's, because another depth or batch
    size says nothing about its epochs. ``seconds`` says which curves count by answering None.
    """
    by_arch: dict[tuple[str, ...], list[float]] = {}
    for c in curves:
        if (s := seconds(c)) is not None:
            by_arch.setdefault(architecture(c), []).append(s)
    return {k: statistics.median(v) for k, v in by_arch.items()}


# --------------------------------------------------------------------------- reading a table file
def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")  # -sig: a spreadsheet's CSV begins with a byte-order mark


def _number(row: dict[str, str], column: str, where: str, *, optional: bool = False) -> float | None:
    text = (row.get(column) or "").strip()
    if not text and optional:
        return None
    try:
        value = float(text)
    except ValueError:
        raise CurveError(f"{where}: {column} is {text!r}; expected a number") from None
    if not math.isfinite(value):
        raise CurveError(f"{where}: {column} is {text!r}; a curve's values must be finite numbers")
    return value


#: a week: no epoch, start-up or report of a real trial takes longer; a larger value is a broken table
MAX_SECONDS = 7 * 24 * 3600.0
#: metrics that are fractions of the volume (overlaps): a value outside [0, 1] is not one
_FRACTION_METRICS = ("dice", "iou", "sensitivity", "specificity", "precision", "recall")


def _seconds(row: dict[str, str], column: str, where: str, *, optional: bool = False) -> float | None:
    value = _number(row, column, where, optional=optional)
    if value is not None and not 0 <= value <= MAX_SECONDS:
        raise CurveError(
            f"{where}: {column} is {row.get(column, '').strip()!r}; expected seconds, from 0 to {MAX_SECONDS:.0f} "
            "(a week)"
        )
    return value


def _metric_value(row: dict[str, str], metric: str, where: str) -> float:
    """A metric's value: finite, and within [0, 1] when it is an overlap (Dice 1e300 is a broken table)."""
    value = _number(row, metric, where)
    assert value is not None
    if any(word in metric.split("_") for word in _FRACTION_METRICS) and not 0.0 <= value <= 1.0:
        raise CurveError(f"{where}: {metric} is {row.get(metric, '').strip()!r}; an overlap lies between 0 and 1")
    return value


def read_table(path: str | Path) -> CurveTable:
    """A curve-table file (CSV, or CSV.gz), checked row by row.

    Raises:
        CurveError: an unreadable file, a missing column, a value that is not a finite number, or
            a trial whose epochs do not run 1, 2, 3, ... (each names the file and the row).
    """
    path = Path(path)
    try:
        with _open_text(path) as fh:
            lines = fh.read().splitlines(keepends=True)
        notes = _header_notes(lines)
        reader = csv.DictReader(lines[len(notes) :])
        columns = list(reader.fieldnames or [])
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:  # a reader of rows by name would keep the last of them and read it as the first
            raise CurveError(f"{path}: row {1 + len(notes)}: column {twice[0]!r} appears more than once")
        missing = [c for c in ("trial", "epoch", "epoch_seconds") if c not in columns]
        if missing:
            raise CurveError(f"{path}: not a curve table: no column {missing[0]!r} (columns: {columns[:8]})")
        if not any(c.startswith(METRIC_PREFIX) for c in columns):
            raise CurveError(f"{path}: no validation metric column (val_...)")
        curves = list(_curves_of_rows(reader, path, columns, first_row=2 + len(notes)))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise CurveError(f"{path}: cannot read the curve table: {exc}") from None
    if not curves:
        raise CurveError(f"{path}: the curve table holds no rows")
    recipe = dict(notes).get("recipe")
    if recipe is not None and recipe not in RECIPES:
        raise CurveError(f"{path}: row 1: recipe {recipe!r}; expected one of {', '.join(sorted(RECIPES))}")
    return CurveTable(curves, str(path), recipe)


#: a note line before a table's header: ``# key: value``
_NOTE = re.compile(r"#\s*(?P<key>[a-z_]+)\s*:\s*(?P<value>.*?)\s*$")


def _header_notes(lines: list[str]) -> list[tuple[str, str]]:
    """The ``# key: value`` lines a table file begins with (the recipe it was recorded with), in order."""
    notes = []
    for line in lines:
        if not line.startswith("#"):
            break
        match = _NOTE.match(line)
        notes.append((match["key"], match["value"]) if match else ("", line.strip()))
    return notes


def _curves_of_rows(
    rows: Iterable[dict[str, str]], path: Path, columns: list[str], *, first_row: int = 2
) -> Iterator[Curve]:
    metrics = [c for c in columns if c.startswith(METRIC_PREFIX)]
    params = [c for c in columns if c.startswith(PARAM_PREFIX)]
    seen: set[str] = set()
    current: Curve | None = None
    for number, row in enumerate(rows, start=first_row):  # the line after the header
        where = f"{path}: row {number}"
        trial = (row.get("trial") or "").strip()
        if not trial:
            raise CurveError(f"{where}: the trial column is empty")
        epoch = _number(row, "epoch", where)
        if current is None or trial != current.trial:
            if trial in seen:
                raise CurveError(f"{where}: trial {trial} appears again after other trials; keep its rows together")
            if current is not None:
                yield current
            seen.add(trial)
            constant = {c: (row.get(c) or "").strip() for c in (*params, "training_seed", "warm")}
            current = Curve(
                trial=trial,
                training_seed=int(_number(row, "training_seed", where, optional=True) or 0),
                params={c[len(PARAM_PREFIX) :]: row.get(c, "") for c in params},
                warm=bool(_number(row, "warm", where, optional=True) or 0),
                startup_seconds=_seconds(row, "startup_seconds", where, optional=True) or 0.0,
                slot_startup_seconds=_seconds(row, "slot_startup_seconds", where, optional=True),
                peak_memory_bytes=_number(row, "peak_memory_bytes", where, optional=True),
                search_fixed_seconds=_seconds(row, "search_fixed_seconds", where, optional=True),
                values={m: [] for m in metrics},
            )
        else:
            _same_trial_columns(row, current, constant, where)
        if epoch != current.epochs + 1:
            raise CurveError(
                f"{where}: trial {trial} goes from epoch {current.epochs} to {epoch:g}; expected epoch "
                f"{current.epochs + 1} (a curve has every epoch, in order)"
            )
        seconds = _seconds(row, "epoch_seconds", where)
        assert seconds is not None
        current.epoch_seconds.append(seconds)
        current.report_seconds.append(_seconds(row, "report_seconds", where, optional=True))
        for m in metrics:
            current.values[m].append(_metric_value(row, m, where))
    if current is not None:
        yield current


def _same_trial_columns(row: dict[str, str], curve: Curve, first: dict[str, str], where: str) -> None:
    """A trial's configuration, training seed and slot are one per trial: a later row that says
    otherwise is two trials under one name, and reading only the first would replay the wrong one."""
    for column, value in first.items():
        if (row.get(column) or "").strip() != value:
            raise CurveError(
                f"{where}: trial {curve.trial} has {column} {(row.get(column) or '').strip()!r}, its first row "
                f"{value!r}; a trial's configuration, training_seed and warm are the same on each of its rows"
            )


# --------------------------------------------------------------------------- the table against a search
def typed_for(table: CurveTable, space: Space, *, metric: str, epochs: int) -> CurveTable:
    """The table's curves with parameters typed by ``space``, checked to stand for that search.

    Raises:
        CurveError: the table's parameters are not the space's, the search metric was not
            recorded, or a curve is shorter than ``epochs``.
    """
    columns = set(table.params)
    wanted = set(space)
    if columns != wanted:
        extra, absent = sorted(columns - wanted), sorted(wanted - columns)
        detail = "; ".join(
            part
            for part in (
                f"the space has no {', '.join(extra)}" if extra else "",
                f"no column for {', '.join(PARAM_PREFIX + a for a in absent)}" if absent else "",
            )
            if part
        )
        raise CurveError(f"{table.source}: the table's parameters are not the search space's: {detail}")
    if metric not in table.metrics:
        raise CurveError(f"{table.source}: no column {metric!r} (the search metric); it has {table.metrics}")
    typed = []
    for curve in table.curves:
        if curve.epochs < epochs:
            raise CurveError(
                f"{table.source}: trial {curve.trial} has {curve.epochs} epoch(s) and the search trains {epochs} "
                "(train.epochs): a truncated curve cannot go on; record it to the end or lower train.epochs"
            )
        params = {
            name: parse_param(text, space[name]) if isinstance(text, str) else text
            for name, text in curve.params.items()
        }
        for name, value in params.items():
            _check_recorded(value, space[name], f"{table.source}: trial {curve.trial}: {PARAM_PREFIX}{name}")
        typed.append(
            dataclasses.replace(
                curve,
                params=params,
                epoch_seconds=curve.epoch_seconds[:epochs],
                report_seconds=curve.report_seconds[:epochs],
                values={m: v[:epochs] for m, v in curve.values.items()},
            )
        )
    return CurveTable(typed, table.source, table.recipe)


def _check_recorded(value: Any, spec: ParamSpec, where: str) -> None:
    """A parameter is recorded unless a condition switched it off, and one the space draws from a
    range as a finite number (above 0 on a log scale): the surrogate measures distances on that
    scale, where a text, NaN or a logarithm of 0 would make every neighbour as near as any."""
    if value is None:
        if spec.when is None and not (spec.choice is not None and None in spec.choice):
            raise CurveError(f"{where} is empty; only a parameter with a condition (when:) may be left out")
        return
    if spec.choice is not None:
        return
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not number or (spec.loguniform is not None and value <= 0):
        low, high = getattr(spec, spec.kind)
        above = " above 0" if spec.loguniform is not None else ""
        raise CurveError(
            f"{where} is {cell(value)!r}; the space draws it from {spec.kind} [{low}, {high}]: expected a finite number{above}"
        )


# --------------------------------------------------------------------------- writing
def table_text(curves: Iterable[Curve], *, recipe: str | None = None) -> str:
    """The CSV text of ``curves`` (columns: :data:`FIXED_COLUMNS`, then parameters, then metrics),
    after a line naming the ``recipe`` they were recorded with, where known."""
    curves = list(curves)
    params = sorted({p for c in curves for p in c.params})
    metrics = sorted({m for c in curves for m in c.values})
    out = io.StringIO()
    if recipe:
        out.write(f"# recipe: {recipe}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*FIXED_COLUMNS, *(PARAM_PREFIX + p for p in params), *metrics])
    for c in curves:
        for i, seconds in enumerate(c.epoch_seconds):
            writer.writerow(
                [
                    c.trial,
                    c.training_seed,
                    int(c.warm),
                    _seconds_cell(c.slot_startup_seconds),
                    f"{c.startup_seconds:.3f}",
                    i + 1,
                    f"{seconds:.3f}",
                    _seconds_cell(c.report_seconds[i] if i < len(c.report_seconds) else None),
                    "" if c.peak_memory_bytes is None else f"{c.peak_memory_bytes:.0f}",
                    _seconds_cell(c.search_fixed_seconds),
                    *(cell(c.params.get(p)) for p in params),
                    *(f"{c.values[m][i]:.5g}" for m in metrics),
                ]
            )
    return out.getvalue()


def _seconds_cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def write_table(curves: Iterable[Curve], path: str | Path, *, recipe: str | None = None) -> Path:
    """Write a curve table (gzip when ``path`` ends in ``.gz``, with a fixed mtime so the bytes are
    reproducible); ``recipe``: the training recipe they were recorded with, named in its first line."""
    path = Path(path)
    text = table_text(curves, recipe=recipe)
    if path.suffix != ".gz":
        write_text_atomic(path, text)
        return path
    from distmis.files import atomic_file

    with atomic_file(path) as tmp:
        tmp.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    return path


def is_table_file(path: Path) -> bool:
    return path.is_file() and bool(re.search(r"\.csv(\.gz)?$", path.name))


__all__ = [
    "COST_PARAMS",
    "Curve",
    "CurveError",
    "CurveTable",
    "architecture",
    "architecture_medians",
    "cell",
    "is_table_file",
    "parse_param",
    "read_table",
    "table_text",
    "typed_for",
    "write_table",
]
