"""The simulator's parts, for studying the simulator itself: the surrogate that answers a
configuration a table lacks, the clock that retimes a table, the engine's measured constants, and
the report's figures. ``benchmarks/`` (fidelity, scale, clock and driver studies) and the tests use
them; a user simulating a search needs only :mod:`distmis.simulate`.
"""

from distmis.simulate._clock import Clock, curve_ratios, later_epoch_seconds, on_clock
from distmis.simulate._curves import COST_PARAMS, architecture, typed_for
from distmis.simulate._engine import (
    DRIVER_SECONDS_PER_RESULT,
    DRIVER_SECONDS_PER_TRIAL,
    REPORT_SECONDS,
    Report,
    cold_first_epoch_seconds,
)
from distmis.simulate._from_search import joined, read_tables, report_seconds
from distmis.simulate._report import finite_json, fmt_stat, plot, quartiles, table_text, time_to
from distmis.simulate._surrogate import LeaveOneOut, NearestCurves

__all__ = [
    "COST_PARAMS",
    "DRIVER_SECONDS_PER_RESULT",
    "DRIVER_SECONDS_PER_TRIAL",
    "REPORT_SECONDS",
    "Clock",
    "LeaveOneOut",
    "NearestCurves",
    "Report",
    "architecture",
    "cold_first_epoch_seconds",
    "curve_ratios",
    "finite_json",
    "fmt_stat",
    "joined",
    "later_epoch_seconds",
    "on_clock",
    "plot",
    "quartiles",
    "read_tables",
    "report_seconds",
    "table_text",
    "time_to",
    "typed_for",
]
