"""Errors distmis raises on purpose.

Each is shown to a CLI user as one line (``distmis: error: ...``) and a non-zero exit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class DistmisError(Exception):
    """Base class for every error that is the user's input, not a bug."""


class ConfigError(DistmisError):
    """A configuration / search-space file is invalid (names file, YAML path and line)."""


class DataError(DistmisError):
    """A dataset on disk is missing, malformed or inconsistent with its ``dataset.json``."""


class TrainingError(DistmisError):
    """A training run cannot start or continue (e.g. a checkpoint that does not match)."""


class TuningError(DistmisError):
    """A search cannot start or resume (e.g. an existing experiment without ``--resume``)."""


class ClusterError(DistmisError):
    """A Ray / SLURM cluster could not be reached or brought up within its bounded wait."""


class TrackingError(DistmisError):
    """The MLflow tracking store cannot be reached or used when a search starts."""


class OutputError(DistmisError):
    """An output path would destroy an input, or replace something distmis did not write."""


class InferenceError(DistmisError):
    """A model directory cannot be used for prediction, or a case could not be predicted."""
