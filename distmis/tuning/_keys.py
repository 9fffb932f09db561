"""Names shared by the trial, the results and the tracking callback (no Ray import here)."""

from __future__ import annotations

import threading
from typing import Any

# Keys the trial adds to every report besides the epoch metrics.
STARTED_AT = "trial_started_at"
REPORTED_AT = "trial_reported_at"
PID = "trial_pid"
NODE = "node_ip"

#: start-up keys of every report: a slot's cold start (once per trainable and its worker group),
#: whether this trial reused a slot that already ran one
GROUP_STARTUP = "group_startup_seconds"
WARM = "warm_start"

GRID_KEY = "grid_point"
#: set by SIGUSR1 / SIGINT: before Tune runs (the search then starts no trial) or while it runs
#: (Tune stops gracefully and saves its state; the search exits 75, resumable with --resume)
STOP_REQUESTED = threading.Event()
#: set in the one result of a trial whose configuration cannot be trained (the reason)
FAILURE = "distmis_failure"


def _configuration_errors() -> tuple[type[BaseException], ...]:
    from pydantic import ValidationError

    from distmis.exceptions import DistmisError

    return (DistmisError, ValidationError)


#: errors that come from a trial's configuration or data, not from chance: retrying the
#: trial would only repeat them (a TensorFlow or Ray error is not among them)
CONFIGURATION_ERRORS = _configuration_errors()


def describe_failure(exc: BaseException) -> str:
    """One line: which field or file, and what was wrong."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        from distmis.documents import describe_validation_error

        return f"invalid configuration: {describe_validation_error(exc)}"[:500]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def configuration_failure(reason: str, started_at: float) -> dict[str, Any]:
    """The single, final result of a trial that cannot train its configuration.

    Every metric is NaN (Optuna records the trial as failed, ASHA never promotes it) and
    ``done`` ends the trial without Tune retrying it.
    """
    import math
    import time

    nan = math.nan
    return {
        "epoch": 0,
        "loss": nan,
        "dice": nan,
        "val_loss": nan,
        "val_dice": nan,
        "val_iou": nan,
        "lr": nan,
        "epoch_seconds": 0.0,
        "train_seconds": 0.0,
        "samples_per_second": 0.0,
        "finished_at": time.time(),
        FAILURE: reason,
        STARTED_AT: started_at,
        REPORTED_AT: time.time(),
        "done": True,
    }


def sampled_params(config: dict[str, Any]) -> dict[str, Any]:
    """The searched parameters of a Tune config (a grid search nests each point under ``grid_point``)."""
    params = {k: v for k, v in config.items() if not k.startswith("_") and k != GRID_KEY}
    params.update(config.get(GRID_KEY) or {})
    return params
