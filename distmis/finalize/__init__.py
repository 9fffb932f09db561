"""Finalize: cross-validation of a search's best configurations, an ensemble of fold models, one honest test score."""

from distmis.finalize._cv import Selection
from distmis.finalize._plan import FinalizeOptions, FinalizePlan, plan_finalize
from distmis.finalize._records import Candidate
from distmis.finalize._run import FinalizeResult, fold_config, run_finalize

__all__ = [
    "Candidate",
    "FinalizeOptions",
    "FinalizePlan",
    "FinalizeResult",
    "Selection",
    "fold_config",
    "plan_finalize",
    "run_finalize",
]
