"""Load a trained model directory (``best/`` of a run or a search) for inference.

A model directory is what training writes: ``config.yaml`` (the architecture),
``weights.npz`` (every model variable, in ``model.weights`` order) and
``preprocessing.json`` (what was done to the raw NIfTI before training). Without the last
one a prediction would silently use different intensities than training saw, so it is
required, not guessed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmis.exceptions import ConfigError, InferenceError

if TYPE_CHECKING:
    import keras

    from distmis.config import ExperimentConfig

REQUIRED = ("config.yaml", "weights.npz", "preprocessing.json")
_PREPROCESSING_KEYS = ("channels", "modalities", "label_mode", "num_classes", "normalisation", "resize", "shape")


@dataclass(frozen=True)
class ModelRecord:
    """Everything about a model directory except the weights themselves (cheap to pickle)."""

    directory: Path
    config: "ExperimentConfig"
    preprocessing: dict[str, Any]

    @property
    def channels(self) -> int:
        return int(self.preprocessing["channels"])

    @property
    def num_classes(self) -> int:
        return int(self.preprocessing["num_classes"])

    @property
    def training_shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.preprocessing["shape"])  # type: ignore[return-value]

    @property
    def default_patch(self) -> tuple[int, int, int]:
        """The cube the model was trained on: ``train.patch``, else the prepared volume shape."""
        patch = self.config.train.patch
        return tuple(patch) if patch is not None else self.training_shape  # type: ignore[return-value]

    @property
    def divisor(self) -> int:
        """Cube sides must be multiples of this (one 2x pooling per level below the bottom)."""
        return 2 ** (self.config.model.depth - 1)


def read_model_record(directory: str | Path) -> ModelRecord:
    """Check a model directory and read its configuration and preprocessing record.

    Raises:
        InferenceError: a file is missing or unreadable, naming it and what was expected.
    """
    from distmis.config import load_config

    directory = Path(directory)
    if not directory.is_dir():
        raise InferenceError(f"{directory}: not a model directory (expected the best/ directory of a run or search)")
    missing = [name for name in REQUIRED if not (directory / name).is_file()]
    if missing:
        raise InferenceError(
            f"{directory}: missing {', '.join(missing)}; a model directory needs {', '.join(REQUIRED)} "
            "(written by distmis train / tune into best/)"
        )
    try:
        config = load_config(directory / "config.yaml")
    except ConfigError as exc:
        raise InferenceError(f"{directory / 'config.yaml'}: {exc}") from None
    path = directory / "preprocessing.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InferenceError(f"{path}: not valid JSON ({exc})") from None
    absent = [k for k in _PREPROCESSING_KEYS if k not in record]
    if absent:
        raise InferenceError(f"{path}: missing field(s) {absent}; expected {list(_PREPROCESSING_KEYS)}")
    if record["resize"] not in ("crop_pad", "resample"):
        raise InferenceError(f"{path}: resize must be crop_pad or resample, got {record['resize']!r}")
    return ModelRecord(directory=directory, config=config, preprocessing=record)


def build_model(record: ModelRecord) -> "keras.Model":
    """Rebuild the U-Net from the recorded configuration and load ``weights.npz`` into it.

    Built in float32 whatever the training precision: the stored variables are float32 under
    every Keras mixed-precision policy, and inference accuracy should not depend on it.
    """
    import keras

    from distmis.model import build_unet
    from distmis.training import load_arrays

    keras.mixed_precision.set_global_policy("float32")
    model = build_unet(record.config.model, channels=record.channels, num_classes=record.num_classes)
    path = record.directory / "weights.npz"
    try:
        arrays = load_arrays(path)
    except Exception as exc:  # numpy raises BadZipFile, ValueError, EOFError... for a damaged file
        raise InferenceError(f"{path}: cannot read weights ({type(exc).__name__}: {exc})") from None
    weights = [np.asarray(arrays[k]) for k in sorted(k for k in arrays if k.startswith("model/"))]
    expected = [tuple(v.shape) for v in model.weights]
    if [tuple(w.shape) for w in weights] != expected:
        raise InferenceError(
            f"{path}: holds {len(weights)} arrays that do not match the model in config.yaml "
            f"({len(expected)} variables); was the directory assembled from different runs?"
        )
    model.set_weights(weights)
    return model


def make_predict_fn(model: "keras.Model"):  # noqa: ANN201
    """A compiled (B, x, y, z, C) -> (B, x, y, z, K) function; retraced only per cube shape."""
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def _forward(x: tf.Tensor) -> tf.Tensor:
        return model(x, training=False)

    def predict(cubes: np.ndarray) -> np.ndarray:
        return _forward(tf.convert_to_tensor(cubes, tf.float32)).numpy()

    return predict
