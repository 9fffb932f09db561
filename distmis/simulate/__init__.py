"""Searches simulated on a virtual clock: recorded learning curves replayed through distmis's own searcher and scheduler."""

from distmis.simulate._clock import Clock, curve_ratios, later_epoch_seconds, on_clock
from distmis.simulate._curves import (
    COST_PARAMS,
    Curve,
    CurveError,
    CurveTable,
    architecture,
    read_table,
    typed_for,
    write_table,
)
from distmis.simulate._engine import (
    DRIVER_SECONDS_PER_RESULT,
    DRIVER_SECONDS_PER_TRIAL,
    REPORT_SECONDS,
    Report,
    SearchRun,
    StartupCosts,
    cold_first_epoch_seconds,
    simulate_search,
)
from distmis.simulate._from_search import curves_of_search, joined, read_curves, read_tables, report_seconds
from distmis.simulate._report import analyse, finite_json, fmt_stat, plot, quartiles, table_text, time_to
from distmis.simulate._run import run_simulation
from distmis.simulate._surrogate import LeaveOneOut, NearestCurves

__all__ = [
    "COST_PARAMS",
    "DRIVER_SECONDS_PER_RESULT",
    "DRIVER_SECONDS_PER_TRIAL",
    "REPORT_SECONDS",
    "Clock",
    "Curve",
    "CurveError",
    "CurveTable",
    "LeaveOneOut",
    "NearestCurves",
    "Report",
    "SearchRun",
    "StartupCosts",
    "analyse",
    "architecture",
    "cold_first_epoch_seconds",
    "curve_ratios",
    "curves_of_search",
    "finite_json",
    "fmt_stat",
    "joined",
    "later_epoch_seconds",
    "on_clock",
    "plot",
    "quartiles",
    "read_curves",
    "read_table",
    "read_tables",
    "report_seconds",
    "run_simulation",
    "simulate_search",
    "table_text",
    "time_to",
    "typed_for",
    "write_table",
]
