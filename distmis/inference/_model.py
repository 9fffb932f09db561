"""Load a trained model directory (``best/`` of a run or a search) for inference.

A model directory is what training writes: ``config.yaml`` (the architecture),
``weights.npz`` (every model variable, keyed by its path) and
``preprocessing.json`` (what was done to the raw NIfTI before training). Without the last
one a prediction would silently use different intensities than training saw, so it is
required, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from distmis.documents import load_json_document
from distmis.exceptions import ConfigError, InferenceError

if TYPE_CHECKING:
    import keras

    from distmis.config import ExperimentConfig

REQUIRED = ("config.yaml", "weights.npz", "preprocessing.json")


class _Preprocessing(BaseModel):
    """The structure of ``preprocessing.json``: what inference must redo to raw scans."""

    model_config = ConfigDict(extra="allow")
    channels: int = Field(ge=1)
    modalities: list[StrictStr]
    labels: dict[str, StrictStr] = {}
    label_mode: Literal["binary", "multiclass", "regions"]
    num_classes: int = Field(ge=1)
    regions: dict[str, list[int]] | None = None
    normalisation: StrictStr
    resize: Literal["crop_pad", "resample"]
    shape: tuple[int, int, int]

    @model_validator(mode="after")
    def _consistent(self) -> _Preprocessing:
        if any(s < 1 for s in self.shape):
            raise ValueError(f"shape must be 3 positive integers, got {list(self.shape)}")
        if len(self.modalities) != self.channels:
            raise ValueError(f"channels {self.channels} but {len(self.modalities)} modalities")
        if (self.label_mode == "binary") != (self.num_classes == 1) and self.label_mode != "regions":
            raise ValueError(f"label_mode {self.label_mode!r} does not go with num_classes {self.num_classes}")
        if self.label_mode == "regions" and len(self.regions or {}) != self.num_classes:
            raise ValueError(
                f"label_mode 'regions' needs one region per output channel ({self.num_classes}), "
                f"got regions {self.regions}"
            )
        return self


@dataclass(frozen=True)
class ModelRecord:
    """Everything about a model directory except the weights themselves (cheap to pickle)."""

    directory: Path
    config: ExperimentConfig
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
    record = load_json_document(_Preprocessing, path, error=InferenceError, what="a preprocessing record").model_dump()
    return ModelRecord(directory=directory, config=config, preprocessing=record)


def build_model(record: ModelRecord) -> keras.Model:
    """Rebuild the U-Net from the recorded configuration and load ``weights.npz`` into it.

    Built in float32 whatever the training precision: the stored variables are float32 under
    every Keras mixed-precision policy, and inference accuracy should not depend on it.
    """
    import keras

    from distmis.exceptions import TrainingError
    from distmis.model import build_unet
    from distmis.training import assign_by_path, load_arrays

    keras.mixed_precision.set_global_policy("float32")
    model = build_unet(
        record.config.model,
        channels=record.channels,
        num_classes=record.num_classes,
        activation="softmax" if record.preprocessing["label_mode"] == "multiclass" else "sigmoid",
    )
    path = record.directory / "weights.npz"
    try:
        assign_by_path(model.weights, load_arrays(path), prefix="model/", source=str(path))
    except TrainingError as exc:
        raise InferenceError(f"{exc} (was the directory assembled from different runs?)") from None
    return model


def make_predict_fn(model: keras.Model):  # noqa: ANN201
    """A compiled (B, x, y, z, C) -> (B, x, y, z, K) function; retraced only per cube shape."""
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def _forward(x: tf.Tensor) -> tf.Tensor:
        return model(x, training=False)

    def predict(cubes: np.ndarray) -> np.ndarray:
        return _forward(tf.convert_to_tensor(cubes, tf.float32)).numpy()

    return predict
