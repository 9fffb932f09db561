"""The one configuration file: a validated YAML document.

``distmis train`` reads the sections ``name``, ``data``, ``train``, ``model`` and
``optimizer``; ``distmis tune`` additionally reads ``search``, ``space``, ``parallelism`` and
``tracking``. Every section is a pydantic model with ``extra="forbid"``, so a typo is an
error naming the YAML path, its line and the closest valid key instead of being silently
ignored (the prototype's hard-coded keyword defaults let typos pass unnoticed).
"""

from __future__ import annotations

import difflib
import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from distmis.documents import MAX_YAML_NODES, StrictYamlLoader, expanded_size
from distmis.exceptions import ConfigError

Vec3 = tuple[int, int, int]


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


class PrepareConfig(_Section):
    """How an MSD directory becomes TFRecords (see ``distmis prepare``)."""

    shape: Vec3 = (32, 32, 32)
    resize: Literal["crop_pad", "resample"] = "crop_pad"
    label_mode: Literal["binary", "multiclass", "regions"] = "binary"
    split: tuple[float, float, float] = (0.7, 0.15, 0.15)
    shards: int = Field(4, ge=1)
    seed: int = 0

    @field_validator("split")
    @classmethod
    def _split_sums_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(x < 0 for x in v) or not math.isclose(sum(v), 1.0, abs_tol=1e-6):
            raise ValueError(f"split fractions must be >= 0 and sum to 1, got {list(v)}")
        if v[0] == 0:
            raise ValueError(f"the train fraction must be > 0, got {list(v)}")
        return v


class DataConfig(_Section):
    """Where the data comes from.

    ``source`` is ``synthetic``, an MSD directory (holding ``dataset.json``; prepared on first
    use and cached) or an already prepared directory (holding ``info.json``).
    """

    source: str = "synthetic"
    synthetic: SyntheticConfig = SyntheticConfig()
    prepare: PrepareConfig = PrepareConfig()
    cache_dir: str | None = None
    #: evaluation regions, e.g. ``{WT: [1, 2, 3], TC: [2, 3], ET: [3]}`` or the preset ``msd_task01``:
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


class TrainConfig(_Section):
    epochs: int = Field(6, ge=1)
    batch_size_per_replica: int = Field(2, ge=1)
    patch: Vec3 | None = None
    steps_per_epoch: int | None = Field(None, ge=1)
    augment: AugmentConfig = AugmentConfig()
    loss: Literal["dice", "dice_bce", "dice_ce"] = "dice"
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    threads: int | None = Field(None, ge=1, description="TensorFlow intra/inter-op threads; default: the CPUs given")
    seed: int = 0
    lr_scaling: Literal["none", "linear"] = "none"
    warmup_epochs: int = Field(0, ge=0)


class ModelConfig(_Section):
    #: recompute each convolution block's activations in the backward pass (gradient
    #: checkpointing): less accelerator memory for a bigger volume, at the cost of step time
    remat: bool = False
    depth: int = Field(3, ge=1, le=6)
    filters: int = Field(8, ge=1)
    kernel_size: int = Field(3, ge=1)
    norm: Literal["batch", "sync_batch", "group", "instance", "none"] = "batch"
    groups: int = Field(4, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _groups_divide_filters(self) -> ModelConfig:
        if self.norm == "group" and self.filters % self.groups:
            raise ValueError(
                f"group normalisation needs groups to divide filters, got groups={self.groups}, filters={self.filters}"
            )
        return self


class OptimizerConfig(_Section):
    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0)
    beta_1: float = Field(0.9, ge=0, lt=1)
    beta_2: float = Field(0.999, ge=0, lt=1)
    amsgrad: bool = False
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)


# --------------------------------------------------------------------------- search
class SchedulerConfig(_Section):
    type: Literal["asha", "none"] = "asha"
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(2, gt=1)


METRICS = ("val_dice", "val_loss", "val_iou", "dice", "loss")


class SearchConfig(_Section):
    """``points`` runs exactly the listed configurations (``{param: value}`` per trial), in
    order: ``distmis compare`` uses it so that every parallelism mode trains the same ones."""

    algorithm: Literal["optuna", "random", "grid", "points"] = "optuna"
    points: list[dict[str, Any]] | None = None
    metric: str = "val_dice"
    mode: Literal["max", "min"] = "max"
    num_samples: int = Field(8, ge=1)
    max_concurrent_trials: int | None = Field(None, ge=1)
    seed: int = 0
    scheduler: SchedulerConfig = SchedulerConfig()
    max_failures: int = Field(2, ge=0)

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        import re as _re

        # per class / region: val_dice_<name> (which names exist is checked against the data)
        if v not in METRICS and not _re.fullmatch(r"val_(dice|iou)_[A-Za-z0-9_]+", v):
            hint = difflib.get_close_matches(v, METRICS, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(
                f"unknown metric {v!r}{extra}; expected one of {list(METRICS)} or "
                "val_dice_<class or region> / val_iou_<class or region>"
            )
        return v


class ParamSpec(_Section):
    """One searched parameter: exactly one distribution key, plus an optional condition."""

    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    choice: list[Any] | None = None
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _exactly_one_distribution(self) -> ParamSpec:
        given = [k for k in ("uniform", "loguniform", "randint", "choice") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a parameter needs exactly one of uniform, loguniform, randint, choice; got {given or 'none'}"
            )
        for key in ("uniform", "loguniform", "randint"):
            bounds = getattr(self, key)
            if bounds is not None and not bounds[0] < bounds[1]:
                raise ValueError(f"`low < high` must hold for {key}, but got (low={bounds[0]}, high={bounds[1]})")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError(f"loguniform needs low > 0, but got low={self.loguniform[0]}")
        if self.choice is not None and not self.choice:
            raise ValueError("choice needs at least one value")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("uniform", "loguniform", "randint", "choice") if getattr(self, k) is not None)


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

    @model_validator(mode="after")
    def _patch_fits_unet(self) -> ExperimentConfig:
        factor = 2 ** (self.model.depth - 1)
        for label, shape in (("train.patch", self.train.patch), ("data.prepare.shape", self.data.prepare.shape)):
            if shape is not None and any(s % factor for s in shape):
                raise ValueError(
                    f"{label} must be divisible by 2**(model.depth-1)={factor} in every axis, got {list(shape)}"
                )
        return self

    @model_validator(mode="after")
    def _points_match_space(self) -> ExperimentConfig:
        s = self.search
        if s.algorithm == "points" and self.space:  # (a trial's own config has no space left to check)
            if not s.points:
                raise ValueError("search.points: algorithm 'points' needs a non-empty list of configurations")
            for i, point in enumerate(s.points):
                unknown = sorted(set(point) - set(self.space))
                if unknown:
                    raise ValueError(f"search.points[{i}]: {unknown} are not parameters of space {sorted(self.space)}")
        elif s.points is not None and s.algorithm != "points":
            raise ValueError(f"search.points is only used with algorithm 'points', not {s.algorithm!r}")
        return self

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


def resolve_param_name(name: str) -> str:
    """Map a ``space`` key to the dotted field it sets (``lr`` -> ``optimizer.lr``).

    Short names are accepted when they are unique across the searchable sections, which keeps
    the common search-space files short; dotted names are always accepted.
    """
    if "." in name:
        section, _, fld = name.partition(".")
        if section not in SEARCHABLE_SECTIONS or fld not in _section_fields(section):
            raise ValueError(f"unknown field {name!r}; expected <{'|'.join(SEARCHABLE_SECTIONS)}>.<field>")
        return name
    owners = [s for s in SEARCHABLE_SECTIONS if name in _section_fields(s)]
    if len(owners) == 1:
        return f"{owners[0]}.{name}"
    if len(owners) > 1:
        raise ValueError(f"{name!r} is ambiguous: write one of {[f'{o}.{name}' for o in owners]}")
    known = [f for s in SEARCHABLE_SECTIONS for f in _section_fields(s)]
    hint = difflib.get_close_matches(name, known, n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ValueError(f"unknown searchable field {name!r}{extra}")


def apply_params(config: ExperimentConfig, params: dict[str, Any]) -> ExperimentConfig:
    """Return a copy of ``config`` with searched ``params`` set (validated like the file)."""
    data = config.to_yaml_dict()
    for key, value in params.items():
        section, _, fld = resolve_param_name(key).partition(".")
        data[section][fld] = value
    data["space"] = {}
    return ExperimentConfig.model_validate(data)


def _check_space(config: ExperimentConfig) -> list[tuple[tuple[Any, ...], str]]:
    """Cross-field checks of ``space`` that pydantic cannot express; returns (loc, message)."""
    problems: list[tuple[tuple[Any, ...], str]] = []
    for key, spec in config.space.items():
        try:
            resolve_param_name(key)
        except ValueError as exc:
            problems.append((("space", key), str(exc)))
        for target, _ in (spec.when or {}).items():
            if target not in config.space:
                hint = difflib.get_close_matches(target, list(config.space), n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                problems.append(
                    (
                        ("space", key, "when", target),
                        f"condition on {target!r}, which is not a searched parameter{extra}",
                    )
                )
            elif target == key:
                problems.append((("space", key, "when"), "a parameter cannot depend on itself"))
    return problems


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


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


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


def _clean_pydantic_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    # pydantic inserts union member names (e.g. 'tuple[int, int, int]') into locations
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in ("function-after",))))


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
        raise ConfigError(f"{p}: no such configuration file")
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
        for err in exc.errors():
            loc = _clean_pydantic_loc(tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown key{_did_you_mean(loc)}"
            elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict):
                msg = f"{msg} (got {err['input']!r})"
            problems.append((loc, msg))
    if config is not None:
        problems.extend(_check_space(config))
        if require_space and not config.space:
            problems.append((("space",), "the search space is empty: add at least one parameter to search"))
    if problems:
        located = [f"{p}:{_nearest_line(lines, loc) or '?'}: {_format_loc(loc)}: {msg}" for loc, msg in problems]
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


__all__ = [
    "AugmentConfig",
    "DataConfig",
    "ExperimentConfig",
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
    "dump_config",
    "load_config",
    "resolve_param_name",
]
