"""Names shared by the trial, the results and the tracking callback (no Ray import here)."""

from __future__ import annotations

from typing import Any

# Keys the trial adds to every report besides the epoch metrics.
STARTED_AT = "trial_started_at"
REPORTED_AT = "trial_reported_at"
PID = "trial_pid"
NODE = "node_ip"

GRID_KEY = "grid_point"


def sampled_params(config: dict[str, Any]) -> dict[str, Any]:
    """The searched parameters of a Tune config (a grid search nests each point under ``grid_point``)."""
    params = {k: v for k, v in config.items() if not k.startswith("_") and k != GRID_KEY}
    params.update(config.get(GRID_KEY) or {})
    return params
