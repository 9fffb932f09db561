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
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from distmis.documents import load_json_document
from distmis.exceptions import ConfigError, InferenceError
from distmis.schema import RunFile

if TYPE_CHECKING:
    import keras

    from distmis.config import ExperimentConfig
    from distmis.data import ModelPreprocessing

REQUIRED = (RunFile.CONFIG, RunFile.WEIGHTS, RunFile.PREPROCESSING)


@dataclass(frozen=True)
class ModelRecord:
    """Everything about a model directory except the weights themselves (cheap to pickle)."""

    directory: Path
    config: ExperimentConfig
    preprocessing: ModelPreprocessing
    #: an ensemble's members (single models), averaged; empty for a single model
    members: tuple[ModelRecord, ...] = ()
    #: masks whose largest connected component alone is kept (chosen by cross-validation)
    largest_component: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: predicted with test-time mirroring unless asked otherwise (an ensemble of finalize: yes)
    tta: bool = False

    @property
    def is_ensemble(self) -> bool:
        return bool(self.members)

    @property
    def singles(self) -> tuple[ModelRecord, ...]:
        """The single models whose outputs are averaged (the model itself when it is one)."""
        return self.members or (self,)

    @property
    def channels(self) -> int:
        return self.preprocessing.channels

    @property
    def num_classes(self) -> int:
        return self.preprocessing.num_classes

    @property
    def training_shape(self) -> tuple[int, int, int]:
        return self.preprocessing.shape

    @property
    def default_patch(self) -> tuple[int, int, int]:
        """The cube the model was trained on: ``train.patch``, else the prepared volume shape."""
        patch = self.config.train.patch
        return tuple(patch) if patch is not None else self.training_shape  # type: ignore[return-value]

    @property
    def divisors(self) -> tuple[int, int, int]:
        """Each side of a cube must be a multiple of its axis's figure (the product of its poolings)."""
        return self.config.model.divisors()


class _Mask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: StrictStr
    values: list[int]


class _Ensemble(BaseModel):
    """The structure of ``ensemble.json`` (``distmis finalize`` writes it into ``final/``)."""

    model_config = ConfigDict(extra="allow")
    format: Literal["distmis-ensemble/1"]
    members: list[StrictStr] = Field(min_length=1)
    largest_component: list[_Mask] = []
    tta: bool = True


def read_model_record(directory: str | Path) -> ModelRecord:
    """Check a model directory and read its configuration and preprocessing record.

    A model directory is a single model (``best/`` of a run or a search: ``config.yaml``,
    ``weights.npz``, ``preprocessing.json``) or an ensemble (``final/`` of a finalize:
    ``ensemble.json`` naming member directories that are single models, trained on the same
    preprocessing). Every member is checked here, before any case is read.

    Raises:
        InferenceError: a file is missing, unreadable or inconsistent, naming it.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise InferenceError(
            f"{directory}: not a model directory (expected best/ of a run or search, or final/ of a finalize)"
        )
    if (directory / RunFile.ENSEMBLE).is_file():
        return _read_ensemble(directory)
    return _read_single(directory)


def _read_single(directory: Path) -> ModelRecord:
    from distmis.config import load_config
    from distmis.data import ModelPreprocessing

    missing = [name for name in REQUIRED if not (directory / name).is_file()]
    if missing:
        raise InferenceError(
            f"{directory}: missing {', '.join(missing)}; a model directory needs {', '.join(REQUIRED)} "
            "(written by distmis train / tune into best/)"
        )
    try:
        config = load_config(directory / RunFile.CONFIG)
    except ConfigError as exc:
        raise InferenceError(f"{directory / RunFile.CONFIG}: {exc}") from None
    _check_archive(directory / RunFile.WEIGHTS)
    path = directory / RunFile.PREPROCESSING
    record = load_json_document(ModelPreprocessing, path, error=InferenceError, what="a preprocessing record")
    return ModelRecord(directory=directory, config=config, preprocessing=record)


def _check_archive(path: Path) -> None:
    """A weights file that is a readable array archive (a truncated or replaced one is named now)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile) as exc:
        raise InferenceError(f"{path}: not a readable weights archive ({exc})") from None
    if bad is not None or not names:
        raise InferenceError(f"{path}: a damaged weights archive ({bad or 'empty'})")
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as arrays:
            broken = [name for name in arrays.files if not np.isfinite(arrays[name]).all()]
    except (OSError, ValueError) as exc:
        raise InferenceError(f"{path}: not a readable weights archive ({exc})") from None
    if broken:
        raise InferenceError(
            f"{path}: {len(broken)} weight array(s) hold NaN or infinite values ({broken[0]}...): the training that "
            "wrote it diverged, and its predictions would mean nothing; train it again with a lower learning rate"
        )


def _read_ensemble(directory: Path) -> ModelRecord:
    spec = load_json_document(_Ensemble, directory / RunFile.ENSEMBLE, error=InferenceError, what="an ensemble record")
    members: list[ModelRecord] = []
    repeated = sorted({name for name in spec.members if spec.members.count(name) > 1})
    if repeated:
        raise InferenceError(
            f"{directory / RunFile.ENSEMBLE}: member {repeated[0]!r} is listed more than once; each member counts once in the "
            "average (a repeated one would silently get double weight)"
        )
    for name in spec.members:
        where = (directory / name).resolve()
        if directory.resolve() not in where.parents:
            raise InferenceError(f"{directory / RunFile.ENSEMBLE}: member {name!r} lies outside the model directory")
        if not where.is_dir():
            raise InferenceError(f"{directory / name}: a member of the ensemble {directory} is missing")
        members.append(_read_single(directory / name))
    first = members[0]
    keys = ("channels", "modalities", "labels", "label_mode", "num_classes", "regions", "channel_normalisation")
    for member in members[1:]:
        differs = [k for k in keys if getattr(member.preprocessing, k) != getattr(first.preprocessing, k)]
        if differs:
            raise InferenceError(
                f"{member.directory}: its {', '.join(differs)} differ from {first.directory}'s; an ensemble's "
                "members must be trained on the same data"
            )
    masks = tuple((m.name, tuple(m.values)) for m in spec.largest_component)
    return ModelRecord(
        directory=directory,
        config=first.config,
        preprocessing=first.preprocessing,
        members=tuple(members),
        largest_component=masks,
        tta=spec.tta,
    )


def build_model(record: ModelRecord) -> keras.Model:
    """Rebuild the U-Net of a single model from its configuration and load ``weights.npz`` into it;
    the full-resolution output only.

    Built in float32 whatever the training precision: the stored variables are float32 under
    every Keras mixed-precision policy, and inference accuracy should not depend on it.
    """
    import keras

    from distmis.exceptions import TrainingError
    from distmis.model import build_unet, full_resolution
    from distmis.training import assign_by_path, load_arrays

    if record.is_ensemble:
        raise InferenceError(f"{record.directory}: an ensemble; build its members with build_models")
    keras.mixed_precision.set_global_policy("float32")
    model = build_unet(
        record.config.model,
        channels=record.channels,
        num_classes=record.num_classes,
        activation="softmax" if record.preprocessing.label_mode == "multiclass" else "sigmoid",
    )
    path = record.directory / RunFile.WEIGHTS
    try:
        assign_by_path(model.weights, load_arrays(path), prefix="model/", source=str(path))
    except TrainingError as exc:
        raise InferenceError(f"{exc} (was the directory assembled from different runs?)") from None
    return full_resolution(model)  # a deep-supervised model's lower heads are for training only


def build_models(record: ModelRecord) -> list[keras.Model]:
    """Every model whose outputs are averaged: the model itself, or an ensemble's members (all
    kept loaded: reloading a member per cube batch costs far more time than the few MB a 3D
    U-Net's weights take; ``benchmarks/predict.py`` measures it)."""
    return [build_model(single) for single in record.singles]


#: the mirrorings of test-time augmentation: every subset of the three spatial axes (nnU-Net's 8)
MIRROR_AXES: tuple[tuple[int, ...], ...] = ((), (1,), (2,), (3,), (1, 2), (1, 3), (2, 3), (1, 2, 3))


class PredictFn:
    """A compiled (B, x, y, z, C) -> (B, x, y, z, K) function; retraced only per cube shape.

    With ``tta`` every cube is also predicted mirrored along each subset of the spatial axes and
    the 8 outputs, mirrored back, are averaged (nnU-Net's test-time mirroring): 8 forward passes
    per cube, memory still bounded by the cube batch. ``seconds`` and ``cubes`` count the time
    spent in the network, so a command can print what the augmentation cost.
    """

    def __init__(self, model: keras.Model | list[keras.Model], *, tta: bool = False) -> None:
        import tensorflow as tf

        models = model if isinstance(model, list) else [model]
        axes = MIRROR_AXES if tta else ((),)
        self.passes = len(axes) * len(models)
        self.seconds = 0.0
        self.cubes = 0

        @tf.function(reduce_retracing=True)
        def _forward(x: tf.Tensor) -> tf.Tensor:
            outputs = []
            for member in models:  # an ensemble: its members' probabilities averaged, per cube batch
                for mirror in axes:
                    y = member(tf.reverse(x, mirror) if mirror else x, training=False)
                    outputs.append(tf.reverse(y, mirror) if mirror else y)
            return tf.add_n(outputs) / float(len(outputs))

        self._forward = _forward

    def __call__(self, cubes: np.ndarray) -> np.ndarray:
        import time

        import tensorflow as tf

        start = time.perf_counter()
        out = self._forward(tf.convert_to_tensor(cubes, tf.float32)).numpy()
        self.seconds += time.perf_counter() - start
        self.cubes += len(cubes)
        return out


def make_predict_fn(model: keras.Model | list[keras.Model], *, tta: bool = False) -> PredictFn:
    """See :class:`PredictFn`."""
    return PredictFn(model, tta=tta)
