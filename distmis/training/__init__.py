"""Training: one configuration, one training loop, for one worker or many."""

from distmis.metrics import EpochMetrics
from distmis.training._loop import Trainer, assign_by_path, load_arrays, save_arrays
from distmis.training._run import (
    CHECKPOINT_DIR,
    FitResult,
    RunSession,
    fit,
    format_epoch,
)
from distmis.training._runtime import configure_tensorflow, release_in_background
from distmis.training._steptime import (
    MIN_TIMED_STEPS,
    TIMED_SECONDS,
    measure_concurrent_step_seconds,
    measure_recipe_step_seconds,
    measure_step_samples,
    steady_step_seconds,
)

__all__ = [
    "CHECKPOINT_DIR",
    "MIN_TIMED_STEPS",
    "TIMED_SECONDS",
    "EpochMetrics",
    "FitResult",
    "RunSession",
    "Trainer",
    "assign_by_path",
    "configure_tensorflow",
    "fit",
    "format_epoch",
    "load_arrays",
    "measure_concurrent_step_seconds",
    "measure_recipe_step_seconds",
    "measure_step_samples",
    "release_in_background",
    "save_arrays",
    "steady_step_seconds",
]
