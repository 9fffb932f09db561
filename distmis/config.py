"""The one configuration file: a validated YAML document.

``distmis train`` reads the sections ``name``, ``data``, ``train``, ``model`` and
``optimizer``; ``distmis tune`` additionally reads ``search``, ``space``, ``parallelism`` and
``tracking``. Every section is a pydantic model with ``extra="forbid"``, so a typo is an
error naming the YAML path, its line and the closest valid key instead of being silently
ignored: a typo that falls back to a default wastes a whole search.
"""

from __future__ import annotations

import difflib
import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from distmis.documents import MAX_YAML_NODES, StrictYamlLoader, expanded_size, format_field, validation_problems
from distmis.exceptions import ConfigError
from distmis.metrics import SEARCH_METRICS, VAL_DICE, is_known_metric
from distmis.recipes import level_pools, level_scales, level_widths
from distmis.space import ParamSpec, point_problems, structure_problems

Vec3 = tuple[int, int, int]
NormalizationScheme = Literal["auto", "zscore", "ct", "none"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------- data
class SyntheticConfig(_Section):
    """Synthetic MSD-layout data generated on first use (see ``distmis synth``)."""

    cases: int = Field(24, ge=2)
    shape: Vec3 = (32, 32, 32)
    modalities: int = Field(4, ge=1)
    test_cases: int = Field(2, ge=0)
    seed: int = 0


#: keys an older distmis wrote into ``data.prepare`` that no longer have an effect: ``shards``
#: (every case is its own file since cases are read on demand)
_RETIRED_PREPARE_KEYS = frozenset({"shards"})


class PrepareConfig(_Section):
    """How an MSD directory becomes a prepared dataset (see ``distmis prepare``)."""

    shape: Vec3 = (32, 32, 32)
    resize: Literal["crop_pad", "resample"] = "crop_pad"
    label_mode: Literal["binary", "multiclass", "regions"] = "binary"
    split: tuple[float, float, float] = (0.7, 0.15, 0.15)
    seed: int = 0
    #: per channel: ``auto`` (CT by the training foreground's range, others z-scored per case),
    #: ``zscore``, ``ct`` or ``none``; one value for every channel, or a list with one per channel
    normalization: NormalizationScheme | list[NormalizationScheme] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _drop_retired_keys(cls, data: Any) -> Any:
        # every model a finalized search saved records its whole config, retired keys included; a
        # model trained by an older distmis must still load for predict and evaluate
        if isinstance(data, dict) and any(key in data for key in _RETIRED_PREPARE_KEYS):
            return {key: value for key, value in data.items() if key not in _RETIRED_PREPARE_KEYS}
        return data

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(x < 0 for x in v) or not math.isclose(sum(v), 1.0, abs_tol=1e-6):
            raise ValueError(f"split fractions must be >= 0 and sum to 1, got {list(v)}")
        if v[0] == 0:
            raise ValueError(f"the train fraction must be > 0, got {list(v)}")
        return v


class FoldConfig(_Section):
    """Train on fold ``index`` of a ``folds``-fold cross-validation of the train + validation cases
    (``distmis finalize`` sets it; the test split is never used)."""

    index: int = Field(ge=0)
    folds: int = Field(ge=2)
    seed: int = 0

    @model_validator(mode="after")
    def _index_in_range(self) -> FoldConfig:
        if self.index >= self.folds:
            raise ValueError(f"fold index {self.index} out of range for {self.folds} folds (0..{self.folds - 1})")
        return self


class DataConfig(_Section):
    """Where the data comes from.

    ``source`` is ``synthetic``, an MSD directory (holding ``dataset.json``; prepared on first
    use and cached) or an already prepared directory (holding ``info.json``).
    """

    source: str = "synthetic"
    synthetic: SyntheticConfig = SyntheticConfig()
    prepare: PrepareConfig = PrepareConfig()
    cache_dir: str | None = None
    #: a cross-validation fold to train on instead of the prepared train/val split
    fold: FoldConfig | None = None
    #: evaluation regions, e.g. ``{WT: [1, 2, 3], TC: [2, 3], ET: [3]}``, or the preset ``msd_task01`` (that one)
    #: or ``brats21`` (labels 1, 2, 4):
    #: trained on with ``prepare.label_mode: regions``, reported per region in every label mode
    regions: dict[str, list[int]] | None = None

    @field_validator("regions", mode="before")
    @classmethod
    def _preset(cls, v: Any) -> Any:
        from distmis.labels import PRESETS

        if isinstance(v, str):
            if v not in PRESETS:
                raise ValueError(
                    f"unknown regions preset {v!r}; expected one of {sorted(PRESETS)} or a mapping "
                    "{name: [label values]}"
                )
            return {k: list(vals) for k, vals in PRESETS[v].items()}
        return v

    @model_validator(mode="after")
    def _regions_fit(self) -> DataConfig:
        import re as _re

        from distmis.labels import paint_order

        if self.regions is not None:
            if not self.regions:
                raise ValueError("regions: empty; give at least one region or leave it out")
            for name, values in self.regions.items():
                if not _re.fullmatch(r"[A-Za-z0-9_]+", name):
                    raise ValueError(f"regions: name {name!r} must be letters, digits and '_' (it names metrics)")
                if not values or any(not 1 <= v <= 255 for v in values):
                    raise ValueError(f"regions.{name}: expected label values 1..255, got {values}")
        if self.prepare.label_mode == "regions":
            if not self.regions:
                raise ValueError("prepare.label_mode 'regions' needs data.regions (e.g. regions: msd_task01)")
            paint_order(self.regions)  # a region model must be writable back as labels
        return self

    def cache_dir_origin(self) -> str:
        """Who chose :meth:`resolved_cache_dir`, for an error about it to name."""
        if self.cache_dir:
            return "data.cache_dir"
        return "$DISTMIS_DATA_HOME" if os.environ.get("DISTMIS_DATA_HOME") else "the default data cache"

    def resolved_cache_dir(self) -> Path:
        """Where synthetic / prepared data is cached: ``cache_dir``, ``$DISTMIS_DATA_HOME`` or ``~/.cache/distmis``."""
        if self.cache_dir:
            return Path(self.cache_dir).expanduser().resolve()
        env = os.environ.get("DISTMIS_DATA_HOME")
        if env:
            return Path(env).expanduser().resolve()
        return Path("~/.cache/distmis").expanduser()


# --------------------------------------------------------------------------- train / model / optimiser
class AugmentConfig(_Section):
    flip: bool = True
    intensity: float = Field(0.1, ge=0, description="max relative scale / shift of intensities")
    noise: float = Field(0.0, ge=0, description="std of additive Gaussian noise")
    # nnU-Net's transforms (distmis.data._augment), off until measured to help here: nnU-Net uses
    # rotation 30 for 3D patches (180 in-plane for anisotropic data), scale [0.7, 1.4] and its
    # intensity transforms at strength 1
    rotation: float = Field(
        0.0,
        ge=0,
        le=180,
        description="max rotation in degrees (p 0.2 per patch): about each axis, or in-plane only for anisotropic data",
    )
    scale: tuple[float, float] = Field((1.0, 1.0), description="zoom range (p 0.2); [1, 1] is off")
    nnunet_intensity: float = Field(
        0.0, ge=0, le=1, description="nnU-Net's noise, blur, brightness, contrast, low-res, gamma: 0 off, 1 its ranges"
    )

    @field_validator("scale")
    @classmethod
    def _scale_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not (0 < v[0] <= v[1] and all(math.isfinite(x) for x in v)):
            raise ValueError(f"expected [low, high] with 0 < low <= high, got {list(v)}")
        return v


class TrainConfig(_Section):
    epochs: int = Field(6, ge=1)
    batch_size_per_replica: int = Field(2, ge=1)
    patch: Vec3 | None = None
    steps_per_epoch: int | None = Field(None, ge=1)
    augment: AugmentConfig = AugmentConfig()
    # auto: Dice for binary labels, Dice + cross-entropy for multi-class and region labels
    # (nnU-Net's default: the cross-entropy term gives every voxel of a thin structure a gradient)
    loss: Literal["auto", "dice", "dice_bce", "dice_ce"] = Field(
        "auto", description="auto = dice for binary labels, dice_ce for multi-class and regions"
    )
    lr_schedule: Literal["constant", "poly", "cosine"] = Field(
        "constant", description="after the warm-up; poly is nnU-Net's (1 - epoch/epochs)^0.9"
    )
    warmup_epochs: int = Field(0, ge=0, description="linear learning-rate warm-up")
    # the others are placed uniformly; matters for small and thin structures
    foreground_oversampling: float = Field(
        0.0, ge=0, le=1, description="share of patches centred on a foreground voxel of a random class (nnU-Net 0.33)"
    )
    validation: Literal["window", "patch"] = Field(
        "window",
        description="window: each validation case whole, by the sliding window predict uses; patch: a few "
        "fixed patch-sized crops of each (nnU-Net's pseudo-Dice), for volumes whose window costs more than an epoch",
    )
    validation_patches: int = Field(4, ge=1, description="crops of each validation case with validation: patch")
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    threads: int | None = Field(None, ge=1, description="TensorFlow intra/inter-op threads; default: the CPUs given")
    seed: int = 0
    lr_scaling: Literal["none", "linear"] = "none"

    @model_validator(mode="after")
    def _warmup_within_epochs(self) -> TrainConfig:
        if self.warmup_epochs and self.warmup_epochs >= self.epochs:
            after = "reach its peak" if self.lr_schedule == "constant" else f"decay ({self.lr_schedule}) after it"
            raise ValueError(
                f"warmup_epochs ({self.warmup_epochs}) must be fewer than epochs ({self.epochs}): the learning rate "
                f"would never {after}"
            )
        return self


class ModelConfig(_Section):
    #: recompute each convolution block's activations in the backward pass (gradient
    #: checkpointing): less accelerator memory for a bigger volume, at the cost of step time
    remat: bool = False
    depth: int = Field(3, ge=1, le=6)
    filters: int = Field(8, ge=1)
    kernel_size: int = Field(3, ge=1)
    #: group by default: batch statistics of 1-2 patches are noise at 3D batch sizes (the recipe's
    #: figures on real anatomy: docs/benchmarks.md, benchmarks/recipe.py)
    norm: Literal["batch", "sync_batch", "group", "instance", "none"] = Field(
        "group", description="batch | sync_batch | group (default) | instance | none"
    )
    groups: int = Field(4, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    max_filters: int | None = Field(
        None, ge=1, description="cap on the filters of a level (nnU-Net: 320 in 3D); null: doubled at every level"
    )
    activation: Literal["relu", "leaky_relu"] = Field(
        "relu", description="after each normalisation; leaky_relu is nnU-Net's (negative slope 0.01)"
    )
    downsample: Literal["maxpool", "strided"] = Field(
        "maxpool", description="between levels: 2x max pooling, or the level's first convolution at stride 2 (nnU-Net)"
    )
    deep_supervision: bool = Field(
        False,
        description="a 1x1 head on every decoder level but the lowest, each trained on labels down-sampled to it "
        "with weights 1/2^i normalised (nnU-Net); inference uses the full-resolution head",
    )
    pools: list[Vec3] | None = Field(
        None,
        description="per level below the first, how much each axis is down-sampled into it (1 or 2), depth - 1 "
        "of them: nnU-Net halves an axis only while its spacing is under twice the finest, so thick slices keep "
        "their number while the in-plane axes halve; null: every axis halved at every level",
    )
    kernels: list[Vec3] | None = Field(
        None,
        description="per level, top to bottom, the convolutions' size along each axis (odd), depth of them: "
        "nnU-Net convolves an axis with 1 while its spacing is twice the finest or more; null: kernel_size "
        "along every axis",
    )

    def level_filters(self) -> list[int]:
        """The filters of each level, top to bottom: ``filters`` doubled per level, capped at ``max_filters``."""
        return level_widths(self.depth, self.filters, self.max_filters)

    def level_pools(self) -> list[Vec3]:
        """Each axis's down-sampling into each level below the first (``pools``, or 2 along every axis)."""
        return level_pools(self.depth, self.pools)

    def level_kernels(self) -> list[Vec3]:
        """Each level's convolution size along each axis (``kernels``, or ``kernel_size`` along every axis)."""
        k = self.kernel_size
        return [tuple(v) for v in self.kernels] if self.kernels is not None else [(k, k, k)] * self.depth  # type: ignore[misc]

    def divisors(self) -> Vec3:
        """What every side of a patch or volume must be a multiple of along each axis: the product of
        the axis's pooling (2^(depth-1) along every axis without ``pools``)."""
        return self.level_scales()[-1]

    def level_scales(self) -> list[Vec3]:
        """How much smaller each level's maps are than the input along each axis, top to bottom: the
        voxel step at which deep supervision takes the labels of a level's head."""
        return level_scales(self.depth, self.pools)

    @model_validator(mode="after")
    def _groups_divide_filters(self) -> ModelConfig:
        if self.norm == "group" and any(f % self.groups for f in self.level_filters()):
            raise ValueError(
                f"group normalisation needs groups to divide filters at every level, got groups={self.groups}, "
                f"filters={self.level_filters()}"
            )
        if self.deep_supervision and self.depth < 2:
            raise ValueError("deep_supervision needs depth >= 2: a one-level U-Net has no decoder levels to supervise")
        if self.pools is not None:
            if len(self.pools) != self.depth - 1:
                raise ValueError(
                    f"pools: one per level below the first, depth - 1 = {self.depth - 1}, got {len(self.pools)}"
                )
            if any(v not in (1, 2) for pool in self.pools for v in pool):
                raise ValueError(f"pools: each axis's factor is 1 or 2, got {[list(p) for p in self.pools]}")
        if self.kernels is not None:
            if len(self.kernels) != self.depth:
                raise ValueError(f"kernels: one per level, depth = {self.depth}, got {len(self.kernels)}")
            if any(v < 1 or v % 2 == 0 for kernel in self.kernels for v in kernel):
                raise ValueError(
                    f"kernels: each axis's size is odd and at least 1 (the maps keep their size), "
                    f"got {[list(k) for k in self.kernels]}"
                )
        return self


class OptimizerConfig(_Section):
    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0)
    beta_1: float = Field(0.9, ge=0, lt=1)
    beta_2: float = Field(0.999, ge=0, lt=1)
    amsgrad: bool = False
    weight_decay: float = Field(0.0, ge=0, description="decoupled weight decay of adamw and sgd (nnU-Net: 3e-5)")
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = Field(False, description="Nesterov momentum for sgd (nnU-Net: true, momentum 0.99)")
    global_clipnorm: float | None = Field(
        None, gt=0, description="clip the gradient's global norm to this (nnU-Net: 12); null: no clipping"
    )


# --------------------------------------------------------------------------- search
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int | float) -> float:
    """Seconds of a wall time written as SLURM users think of it: ``90s``, ``30m``, ``24h``, ``1h30m``,
    ``2d``, or a plain number of seconds.

    Raises:
        ValueError: anything else, or a duration that is not positive.
    """
    import re

    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        seconds = float(raw)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([smhd])", raw)
        if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([smhd])", "", raw).strip():
            raise ValueError(f"expected a duration such as 90s, 30m, 24h or 1h30m, got {text!r}")
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return seconds


class SchedulerConfig(_Section):
    """Early stopping of unpromising trials: Ray Tune's ASHA, over ``brackets`` brackets (more than
    one is asynchronous Hyperband), or none. ``grace_period`` epochs run before a trial can be stopped."""

    type: Literal["asha", "none"] = "asha"
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(2, gt=1)
    brackets: int = Field(1, ge=1)


#: the samplers that model the results after their random start-up trials, and what each models with
MODEL_SAMPLERS = {"optuna": "TPE", "gp": "GP", "cmaes": "CMA-ES"}
#: trials at once from which a search with few rounds samples at random (see SearchConfig.sampler_startup_trials)
CLUSTER_SCALE = 16
#: rounds of concurrent trials (num_samples / concurrency) above which TPE beats random sampling at that scale
ROUNDS_FOR_TPE = 8


class SearchConfig(_Section):
    """``points``: with algorithm ``points``, exactly the listed configurations (``{param: value}``
    per trial), in order (``distmis compare`` uses it so that every parallelism mode trains the
    same ones); with ``optuna`` or ``random``, configurations tried first, before the sampler
    proposes its own (a known-good configuration; a parameter a point
    leaves out is sampled).

    Samplers: ``optuna`` is Optuna's TPE (multivariate, constant liar), ``random`` Optuna's
    random sampler, ``gp`` Optuna's Gaussian-process sampler (it models the running trials too;
    needs PyTorch on the machine that runs the search), ``cmaes`` Optuna's CMA-ES over the
    numeric parameters, the categorical ones sampled at random (needs the ``cmaes`` package)."""

    algorithm: Literal["optuna", "random", "gp", "cmaes", "grid", "points"] = "optuna"
    points: list[dict[str, Any]] | None = None
    metric: str = VAL_DICE
    mode: Literal["max", "min"] = "max"
    num_samples: int = Field(8, ge=1)
    max_concurrent_trials: int | None = Field(None, ge=1)
    seed: int = 0
    startup_trials: int | None = Field(
        None,
        ge=1,
        description="random trials before the sampler (TPE, GP, CMA-ES) models the results; default "
        "max(2 x concurrency, min(10, num_samples/4)), "
        "and every trial when 16 or more run at once for 8 rounds or fewer",
    )
    scheduler: SchedulerConfig = SchedulerConfig()
    max_failures: int = Field(2, ge=0)
    time_budget: str | None = Field(
        None,
        description="wall time of the whole search, e.g. 90s, 30m, 24h or 1h30m: no trial starts after it, "
        "those still running are stopped, the best so far is kept; a resumed search counts the time already spent",
    )

    @field_validator("time_budget")
    @classmethod
    def _duration(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    def time_budget_seconds(self) -> float | None:
        return None if self.time_budget is None else parse_duration(self.time_budget)

    def sampler_startup_trials(self, concurrency: int) -> int:
        """Random trials the sampler (TPE, GP, CMA-ES) starts with: ``startup_trials``, else the rule
        in its description.

        At cluster scale with few rounds (``num_samples <= 8 x concurrency`` with 16 or more trials
        at once) every trial is random: simulated on the shipped anatomy curves, random sampling with
        ASHA reached random search's final best sooner and more often than TPE there, whose model
        sees too few finished trials between rounds (``benchmarks/search_scale.py``, docs/simulate.md).
        """
        if self.startup_trials:
            return self.startup_trials
        if concurrency >= CLUSTER_SCALE and self.num_samples <= ROUNDS_FOR_TPE * concurrency:
            return self.num_samples
        return max(2 * concurrency, min(10, self.num_samples // 4))

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        # per class / region: val_dice_<name> (which names exist is checked against the data)
        if not is_known_metric(v):
            hint = difflib.get_close_matches(v, SEARCH_METRICS, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(
                f"unknown metric {v!r}{extra}; expected one of {list(SEARCH_METRICS)} or "
                "val_dice_<class or region> / val_iou_<class or region>"
            )
        return v


class ParallelismConfig(_Section):
    mode: Literal["experiment", "data", "hybrid"] = "experiment"
    workers_per_trial: int = Field(1, ge=1)
    cpus_per_worker: float = Field(1, gt=0)
    gpus_per_worker: float = Field(0, ge=0)

    @model_validator(mode="after")
    def _experiment_is_single_worker(self) -> ParallelismConfig:
        if self.mode == "experiment" and self.workers_per_trial != 1:
            raise ValueError(
                f"mode 'experiment' runs single-worker trials, got workers_per_trial={self.workers_per_trial}; "
                "use mode 'data' or 'hybrid' for multi-worker trials"
            )
        return self


class FinalizeConfig(_Section):
    """What ``distmis finalize`` of this search does where its command line is silent (an option
    given there wins; a key left out takes finalize's own default). ``distmis init --budget B
    --finalize`` writes it, so that the search and its finalize together spend B."""

    top: int | None = Field(None, ge=1, description="configurations to cross-validate, best first (default 2)")
    folds: int | None = Field(None, ge=2, description="cross-validation folds (default 5, as nnU-Net)")
    seed: int | None = Field(None, ge=0, description="how cases are dealt into folds (default 0)")
    tta: bool | None = Field(None, description="test-time mirroring in the out-of-fold predictions (default true)")
    pairs: bool | None = Field(None, description="consider ensembles of two configurations (default true)")
    postprocess: bool | None = Field(
        None, description="consider keeping the largest connected component (default true)"
    )

    def described(self) -> str:
        """``top 1, folds 4, pairs false``: the keys set, as a user reads them ("" when none is)."""
        planned = {k: v for k, v in self.model_dump().items() if v is not None}
        return ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in planned.items())


class TrackingConfig(_Section):
    """MLflow: ``uri`` (default: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<out>/../mlflow.db``),
    ``experiment`` (default: the search name), and how long the end of a search waits for an
    unreachable server before leaving the queued tracking on disk."""

    uri: str | None = None
    experiment: str | None = None
    parent_run_id: str | None = None  # nest the search's run under this one (distmis compare)
    final_flush_seconds: float = Field(30.0, ge=0)


class ExperimentConfig(_Section):
    """The whole file. ``search`` and ``space`` are only needed by ``distmis tune``."""

    name: str = Field("distmis", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    search: SearchConfig = SearchConfig()
    space: dict[str, ParamSpec] = Field(default_factory=dict)
    parallelism: ParallelismConfig = ParallelismConfig()
    tracking: TrackingConfig = TrackingConfig()
    finalize: FinalizeConfig = FinalizeConfig()

    @model_validator(mode="after")
    def _patch_fits_unet(self) -> ExperimentConfig:
        divisors = self.model.divisors()
        what = (
            f"2**(model.depth-1)={divisors[0]} in every axis"
            if self.model.pools is None
            else f"{list(divisors)} along its axes (model.pools)"
        )
        for label, shape in (("train.patch", self.train.patch), ("data.prepare.shape", self.data.prepare.shape)):
            if shape is not None and any(s % d for s, d in zip(shape, divisors, strict=True)):
                raise ValueError(f"{label} must be divisible by {what}, got {list(shape)}")
        return self

    @model_validator(mode="after")
    def _points_match_space(self) -> ExperimentConfig:
        s = self.search
        if s.algorithm == "points" and self.space and not s.points:  # (a trial's own config has no space left)
            raise ValueError("search.points: algorithm 'points' needs a non-empty list of configurations")
        if s.points is not None and s.algorithm == "grid":
            raise ValueError("search.points: a grid runs its own points; use algorithm points or a sampler")
        if s.points and self.space:
            problems = point_problems(self.space, s.points, exact=s.algorithm == "points")
            if problems:
                loc, message = problems[0]
                raise ValueError(f"{'.'.join(str(p) for p in loc)}: {message}")
        return self

    def planned_trials(self) -> int:
        """The trials a search runs: its points or its grid where it has them (``num_samples``
        counts only a sampler's), so that what a search announces is what it runs."""
        from distmis.space import grid_points

        s = self.search
        if s.algorithm == "points":
            return len(s.points or [])
        if s.algorithm == "grid":
            return len(grid_points(self.space))
        return s.num_samples

    def to_yaml_dict(self) -> dict[str, Any]:
        """A plain dict that round-trips through YAML and this model."""
        return self.model_dump(mode="json", exclude_none=False)


# --------------------------------------------------------------------------- search-space names
SEARCHABLE_SECTIONS = ("model", "optimizer", "train")


def _section_fields(section: str) -> dict[str, Any]:
    """The fields of one searchable section's model (``model`` -> ModelConfig's fields)."""
    annotation = ExperimentConfig.model_fields[section].annotation
    assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return dict(annotation.model_fields)


def _field_paths(section: str) -> list[str]:
    """Every field a search may set in ``section``: its own, and those of a nested section
    (``augment.rotation`` in ``train``), so that a search varies one transform, not the whole group."""
    paths = []
    for name, info in _section_fields(section).items():
        paths.append(name)
        nested = info.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            paths += [f"{name}.{leaf}" for leaf in nested.model_fields]
    return paths


def resolve_param_name(name: str) -> str:
    """Map a ``space`` key to the dotted field it sets (``lr`` -> ``optimizer.lr``, ``rotation``
    -> ``train.augment.rotation``).

    Short names (a field's own name) are accepted when they are unique across the searchable
    sections, which keeps the common search-space files short; dotted names are always accepted.
    """
    if "." in name:
        section, _, fld = name.partition(".")
        if section not in SEARCHABLE_SECTIONS or fld not in _field_paths(section):
            raise ValueError(f"unknown field {name!r}; expected <{'|'.join(SEARCHABLE_SECTIONS)}>.<field>")
        return name
    owners = [f"{s}.{path}" for s in SEARCHABLE_SECTIONS for path in _field_paths(s) if path.split(".")[-1] == name]
    if len(owners) == 1:
        return owners[0]
    if len(owners) > 1:
        raise ValueError(f"{name!r} is ambiguous: write one of {owners}")
    known = [path.split(".")[-1] for s in SEARCHABLE_SECTIONS for path in _field_paths(s)]
    hint = difflib.get_close_matches(name, known, n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ValueError(f"unknown searchable field {name!r}{extra}")


#: keys a trial's parameters may set besides the searchable fields: the fold of a finalize trial
TRIAL_KEYS = ("data.fold",)


def apply_params(config: ExperimentConfig, params: dict[str, Any]) -> ExperimentConfig:
    """Return a copy of ``config`` with searched ``params`` set (validated like the file)."""
    data = config.to_yaml_dict()
    for key, value in params.items():
        section, *parents, fld = (key if key in TRIAL_KEYS else resolve_param_name(key)).split(".")
        target = data[section]
        for parent in parents:  # a nested section's field (train.augment.rotation)
            target = target.setdefault(parent, {})
        target[fld] = value
    data["space"] = {}
    return ExperimentConfig.model_validate(data)


def _check_space(config: ExperimentConfig) -> list[tuple[tuple[Any, ...], str]]:
    """What pydantic cannot check field by field: every ``space`` key names a searchable field,
    and the space's own rules (conditions on searched parameters)."""
    problems: list[tuple[tuple[Any, ...], str]] = []
    for key in config.space:
        try:
            resolve_param_name(key)
        except ValueError as exc:
            problems.append((("space", key), str(exc)))
    return problems + structure_problems(config.space)


# --------------------------------------------------------------------------- loading with line numbers
_LineLoader = StrictYamlLoader  # duplicate keys refused; lines come from the composed node graph


def _line_map(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[path + (key,)] = key_node.start_mark.line + 1
            _line_map(value_node, path + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), out)


def _located(message: str) -> tuple[tuple[Any, ...], str]:
    """(the YAML path a message starts with, the rest): its line can then be found."""
    import re

    match = re.match(r"^([A-Za-z_]\w*(?:\.\w+)+): (.*)$", message, re.DOTALL)
    if not match:
        return (), message
    path = tuple(int(p) if p.isdigit() else p for p in match.group(1).split("."))
    return path, match.group(2)


def _nearest_line(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int | None:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            return lines[loc[:cut]]
    return None


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """For an unknown key, the closest field name of the section it was found in."""
    model: Any = ExperimentConfig
    for part in loc[:-1]:
        if model is None:
            return ""
        if isinstance(part, str) and isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(part)
            if field is None:
                return ""
            ann = field.annotation
            model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
            if part == "space" and model is None:
                model = ParamSpec if len(loc) > 2 else None
        else:
            continue
    if model is None:
        return ""
    hint = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def load_config(path: str | os.PathLike[str], *, require_space: bool = False) -> ExperimentConfig:
    """Read and validate a configuration file.

    Args:
        path: the YAML file.
        require_space: ``True`` for ``distmis tune``: an empty ``space`` is then an error.

    Raises:
        ConfigError: one message listing every problem as ``file:line: yaml.path: what``.
    """
    p = Path(path)
    if not p.is_file():
        found = "not a regular file (a directory, a FIFO or a device)" if p.exists() else "no such configuration file"
        raise ConfigError(f"{p}: {found}")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the file as UTF-8") from None
    try:
        node = yaml.compose(text, Loader=_LineLoader)
        size = expanded_size(node)
        if size > MAX_YAML_NODES:
            raise ConfigError(
                f"{p}: expands to more than {MAX_YAML_NODES} YAML nodes (aliases counted at every use); "
                "a configuration is a few hundred: refusing what looks like an alias bomb"
            )
        raw = yaml.load(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise ConfigError(f"{where}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to be a configuration file") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}:1: expected a mapping of sections (name, data, train, ...), got {type(raw).__name__}")
    lines: dict[tuple[Any, ...], int] = {}
    if node is not None:
        _line_map(node, (), lines)

    problems: list[tuple[tuple[Any, ...], str]] = []
    config: ExperimentConfig | None = None
    try:
        config = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        for loc, msg in validation_problems(exc):
            if msg == "unknown key":
                msg += _did_you_mean(loc)
            if not loc:  # a check of the whole file that names its own field ("search.points.0.lr: ...")
                loc, msg = _located(msg)
            problems.append((loc, msg))
    if config is not None:
        problems.extend(_check_space(config))
        if require_space and not config.space:
            problems.append((("space",), "the search space is empty: add at least one parameter to search"))
    if problems:
        located = [f"{p}:{_nearest_line(lines, loc) or '?'}: {format_field(loc)}: {msg}" for loc, msg in problems]
        if len(located) == 1:
            raise ConfigError(located[0])
        body = "\n".join(f"  {line}" for line in located)
        raise ConfigError(f"{p}: invalid configuration ({len(located)} problems)\n{body}")
    assert config is not None
    return config


def dump_config(config: ExperimentConfig, path: str | os.PathLike[str]) -> None:
    """Write ``config`` as YAML atomically (temp file + rename)."""
    from distmis.files import write_text_atomic

    write_text_atomic(Path(path), yaml.safe_dump(config.to_yaml_dict(), sort_keys=False))


# --------------------------------------------------------------------------- the keys, for --help
def _kind(annotation: Any) -> str:
    """A short spelling of a field's type: ``a|b|c`` for a Literal, ``[x, y, z]`` for a Vec3."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "|".join(str(a).lower() if isinstance(a, bool) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_kind(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin is tuple:
        return "[" + ", ".join(_kind(a) for a in args) + "]"
    if origin in (list, dict):
        return "list" if origin is list else "mapping"
    if annotation is bool:
        return "true|false"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: Any) -> str:
    if info.default_factory is not None or info.is_required():
        return ""
    value = info.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return str(list(value))
    return "null" if value is None else str(value)


def config_reference(model: type[BaseModel] = ExperimentConfig, prefix: str = "") -> list[str]:
    """Every key of the configuration file with its values and default, drawn from the models
    themselves, so that ``--help`` cannot drift from what ``validate`` accepts."""
    lines: list[str] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = info.annotation
        sub = next(
            (a for a in (annotation, *__import__("typing").get_args(annotation))
             if isinstance(a, type) and issubclass(a, BaseModel)),
            None,
        )  # fmt: skip
        if sub is not None and sub is not ParamSpec:
            lines.extend(config_reference(sub, f"{key}."))
            continue
        default = _default(info)
        text = f"  {key}: {_kind(annotation)}" + (f" (default {default})" if default else "")
        if info.description:
            text += f"; {info.description}"
        lines.append(text)
    return lines


__all__ = [
    "AugmentConfig",
    "config_reference",
    "DataConfig",
    "FinalizeConfig",
    "FoldConfig",
    "ExperimentConfig",
    "MODEL_SAMPLERS",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "ParamSpec",
    "PrepareConfig",
    "SchedulerConfig",
    "SearchConfig",
    "SyntheticConfig",
    "TrackingConfig",
    "TrainConfig",
    "apply_params",
    "parse_duration",
    "dump_config",
    "load_config",
    "resolve_param_name",
]
