"""Searches simulated on a virtual clock: recorded learning curves replayed through distmis's own searcher and scheduler.

What ``distmis simulate`` and a user's script need: run a simulation, simulate one search, read
and write curve tables (or a finished search's curves), and analyse the runs. The parts the
simulator is built from (its surrogate, its clock, the engine's measured constants), which the
benchmarks that study the simulator itself use, are in :mod:`distmis.simulate.study`.
"""

from distmis.simulate._curves import Curve, CurveError, CurveTable, read_table, write_table
from distmis.simulate._engine import SearchRun, StartupCosts, simulate_search
from distmis.simulate._from_search import curves_of_search, read_curves
from distmis.simulate._report import analyse
from distmis.simulate._run import run_simulation

__all__ = [
    "Curve",
    "CurveError",
    "CurveTable",
    "SearchRun",
    "StartupCosts",
    "analyse",
    "curves_of_search",
    "read_curves",
    "read_table",
    "run_simulation",
    "simulate_search",
    "write_table",
]
