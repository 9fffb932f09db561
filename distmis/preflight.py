"""Checks that must pass before any work starts: what would otherwise fail after hours.

``distmis validate`` runs them, and so do ``tune``, ``train`` and ``compare`` before Ray
starts or a model is built. They look at everything a search could sample, not only the
defaults: every value of every parameter (both ends of a range), the combinations of
those values (so ``groups`` that do not divide ``filters`` are found), the data the search
will read (prepared shape, split sizes), and the search settings themselves.

Continuous parameters are checked at both ends of their range: every constraint of a
configuration field is a bound (``ge``, ``gt``, ``le``, ``lt``), so if both ends pass, every
value between them does.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from distmis.config import ExperimentConfig, apply_params, resolve_param_name
from distmis.documents import format_field, validation_problems
from distmis.exceptions import ConfigError, DistmisError
from distmis.metrics import SEARCH_METRICS, better_direction
from distmis.schema import RunFile
from distmis.space import candidates, condition_holds, condition_problems, grid_problems, ordered_params

#: corner combinations checked exhaustively up to this many (then parameter by parameter)
MAX_COMBINATIONS = 4096


@dataclass(frozen=True)
class DataFacts:
    """What a search will train on, known without preparing anything."""

    source: str
    shape: tuple[int, int, int]
    train: int
    val: int
    where: str  # where the shape comes from, for messages
    labels: dict[int, str] | None = None
    label_mode: str = "binary"
    num_classes: int = 1
    regions: dict[str, list[int]] | None = None

    def metric_names(self) -> list[str]:
        """Every metric a search on this data can optimise."""
        from distmis.labels import metric_names

        return [*SEARCH_METRICS, *metric_names(self.labels or {}, self.label_mode, self.num_classes, self.regions)]


def _refusal(exc: Exception) -> str:
    """Why the configuration refuses a value, worded as every document's errors are."""
    if isinstance(exc, ValidationError):
        (loc, msg), *_ = validation_problems(exc)
        return f"{format_field(loc)}: {msg}" if loc else msg
    return str(exc)


def _check_values(config: ExperimentConfig) -> list[tuple[tuple[Any, ...], str]]:
    problems: list[tuple[tuple[Any, ...], str]] = []
    for i, point in enumerate(config.search.points or []):
        try:
            apply_params(config, point)
        except (ValidationError, ValueError) as exc:
            problems.append((("search", "points", i), f"{point} is refused: {_refusal(exc)}"))
    for name, spec in config.space.items():
        for value in candidates(spec):
            try:
                apply_params(config, {name: value})
            except (ValidationError, ValueError) as exc:
                problems.append(
                    (
                        ("space", name),
                        f"can sample {value!r}, which {resolve_param_name(name)} refuses: {_refusal(exc)}",
                    )
                )
                break
    return problems


def _check_combinations(config: ExperimentConfig) -> list[tuple[tuple[Any, ...], str]]:
    """Combinations of corner values, conditions respected (``groups`` x ``filters`` and the like)."""
    order = ordered_params(config.space)
    sizes = [len(candidates(config.space[n])) for n in order]
    if math.prod(sizes) > MAX_COMBINATIONS:
        return []
    for combo in itertools.product(*(candidates(config.space[n]) for n in order)):
        point: dict[str, Any] = {}
        for name, value in zip(order, combo, strict=True):
            if condition_holds(config.space[name], point):
                point[name] = value
        try:
            apply_params(config, point)
        except (ValidationError, ValueError) as exc:
            return [(("space",), f"the combination {point} can be sampled and is refused: {_refusal(exc)}")]
    return []


def _check_search(config: ExperimentConfig) -> list[tuple[tuple[Any, ...], str]]:
    problems: list[tuple[tuple[Any, ...], str]] = []
    s = config.search
    better = better_direction(s.metric)
    if better is not None and better != s.mode:
        what = "higher" if better == "max" else "lower"
        problems.append(
            (
                ("search", "mode"),
                f"{s.mode!r} with metric {s.metric}, where {what} is better: the search would "
                f"look for the worst model; use mode: {better}",
            )
        )
    if s.algorithm == "grid" and config.space:
        problems += grid_problems(config.space)
    missing = _missing_sampler_package(s.algorithm)
    if missing:
        problems.append((("search", "algorithm"), missing))
    return problems


#: the package each optional Optuna sampler imports, and how a user installs it
_SAMPLER_PACKAGES = {
    "gp": ("torch", "PyTorch (pip install 'distmis[gp]', or torch)"),
    "cmaes": ("cmaes", "the cmaes package (pip install 'distmis[cmaes]', or cmaes)"),
}


def _missing_sampler_package(algorithm: str) -> str | None:
    """Why ``algorithm`` cannot run here, where Optuna would only fail at the first proposal: the
    sampler runs in the driver, so the check belongs to the machine that starts the search."""
    import importlib.util

    if algorithm not in _SAMPLER_PACKAGES:
        return None
    module, install = _SAMPLER_PACKAGES[algorithm]
    if importlib.util.find_spec(module) is not None:
        return None
    return f"{algorithm!r} needs {install}, which is not installed in this Python"


def data_facts(config: ExperimentConfig, base_dir: Path) -> DataFacts:
    """Shape and split sizes of the data ``config`` will train on, read without preparing it.

    Raises:
        DataError: the source does not exist or is malformed (naming the file).
    """
    from distmis.data import load_manifest, read_dataset_json, split_cases
    from distmis.exceptions import DataError

    data = config.data
    prep = data.prepare

    def labelling(labels: dict[int, str]) -> dict[str, Any]:
        mode = prep.label_mode
        classes = {"binary": 1, "regions": len(data.regions or {})}.get(mode, max(labels) + 1)
        return {"labels": labels, "label_mode": mode, "num_classes": classes, "regions": data.regions}

    if data.source == "synthetic":
        from distmis.data import SYNTH_LABELS as LABELS

        ids = [f"SYNTH_{i:03d}" for i in range(data.synthetic.cases)]
        split = split_cases(ids, prep.split, prep.seed)
        return DataFacts(
            "synthetic",
            (prep.shape[0], prep.shape[1], prep.shape[2]),
            len(split["train"]),
            len(split["val"]),  # type: ignore[arg-type]
            "data.prepare.shape",
            **labelling(dict(LABELS)),
        )
    src = Path(data.source).expanduser()
    if not src.is_absolute():
        src = (base_dir / src).resolve()
    if (src / RunFile.PREPARED_INFO).is_file():
        manifest = load_manifest(src)
        return DataFacts(
            str(src),
            manifest.info.shape,
            manifest.num_cases("train"),
            manifest.num_cases("val"),
            f"{src / RunFile.PREPARED_INFO}",
            labels=manifest.info.label_names,
            label_mode=manifest.info.label_mode,
            num_classes=manifest.info.num_classes,
            regions=manifest.info.regions,
        )
    if (src / "dataset.json").is_file():
        dataset = read_dataset_json(src)
        split = split_cases([c.case_id for c in dataset.training], prep.split, prep.seed)
        return DataFacts(
            str(src),
            (prep.shape[0], prep.shape[1], prep.shape[2]),
            len(split["train"]),
            len(split["val"]),  # type: ignore[arg-type]
            "data.prepare.shape",
            **labelling(dataset.labels),
        )
    raise DataError(f"data.source: {src} holds neither dataset.json (MSD) nor {RunFile.PREPARED_INFO} (prepared)")


def _sampled(config: ExperimentConfig, field: str) -> list[Any]:
    """Every value ``field`` (dotted) can take in this search: the base value and the space's."""
    section, _, name = field.partition(".")
    values = [getattr(getattr(config, section), name)]
    for key, spec in config.space.items():
        try:
            if resolve_param_name(key) == field:
                values.extend(candidates(spec))
        except ValueError:
            continue
    return values


def _check_data(config: ExperimentConfig, facts: DataFacts) -> list[tuple[tuple[Any, ...], str]]:
    problems: list[tuple[tuple[Any, ...], str]] = []
    depths = [d for d in _sampled(config, "model.depth") if isinstance(d, int)]
    divisors = [2 ** (max(depths) - 1) if depths else 1] * 3
    if config.model.pools is not None:  # they fix the depth: a sampled other depth fails the model's own check
        divisors = list(config.model.divisors())
    divisor = divisors[0] if len(set(divisors)) == 1 else divisors
    if any(s % d for s, d in zip(facts.shape, divisors, strict=False)):
        problems.append(
            (
                ("data",),
                f"the prepared volumes are {list(facts.shape)} ({facts.where}); a depth-{max(depths)} "
                f"U-Net needs every side divisible by {divisor} (validation runs on whole volumes)",
            )
        )
    for patch in _sampled(config, "train.patch"):
        if patch is None:
            continue
        patch = tuple(patch)
        if any(p > s for p, s in zip(patch, facts.shape, strict=False)):
            problems.append(
                (
                    ("train", "patch"),
                    f"{list(patch)} is larger than the prepared volumes {list(facts.shape)} ({facts.where})",
                )
            )
        elif any(p % d for p, d in zip(patch, divisors, strict=False)):
            problems.append(
                (
                    ("train", "patch"),
                    f"{list(patch)}: a depth-{max(depths)} U-Net needs every side divisible by {divisor}",
                )
            )
    valid = facts.metric_names()
    if config.search.metric not in valid:
        import difflib

        hint = difflib.get_close_matches(config.search.metric, valid, n=1)
        problems.append(
            (
                ("search", "metric"),
                f"{config.search.metric!r} is not reported for this data "
                f"({facts.label_mode} labels){f' (did you mean {hint[0]!r}?)' if hint else ''}; "
                f"expected one of {valid}",
            )
        )
    if config.search.metric.startswith("val_") and facts.val == 0:
        problems.append(
            (
                ("search", "metric"),
                f"{config.search.metric} needs validation cases, but the validation "
                f"split of {facts.source} is empty; give it cases (data.prepare.split, "
                "distmis prepare --split) or use metric dice / loss",
            )
        )
    batches = [b for b in _sampled(config, "train.batch_size_per_replica") if isinstance(b, int)]
    global_batch = max(batches) * config.parallelism.workers_per_trial
    if facts.train < global_batch:
        problems.append(
            (
                ("train", "batch_size_per_replica"),
                f"one global batch is {global_batch} cases ({max(batches)} per replica x "
                f"{config.parallelism.workers_per_trial} worker(s)), the training split has {facts.train}",
            )
        )
    return problems


def preflight(
    config: ExperimentConfig, *, path: str | Path, base_dir: Path | None = None, check_data: bool = True
) -> DataFacts | None:
    """Refuse a configuration that would fail (or mislead) after the work has started.

    Args:
        config: the loaded configuration.
        path: its file, for messages.
        base_dir: what relative ``data.source`` paths are relative to (the file's directory).
        check_data: also read the data source (shape, split sizes).

    Returns:
        The data facts when ``check_data``.

    Raises:
        ConfigError: one message listing every problem, each naming its YAML field.
        DataError: the data source is missing or malformed.
    """
    problems = _check_values(config)
    values_ok = not problems
    if values_ok:
        problems += _check_combinations(config)
    problems += condition_problems(config.space) + _check_search(config)
    facts = None
    if check_data:
        try:
            facts = data_facts(config, base_dir or Path(path).resolve().parent)
        except DistmisError:
            if problems:
                raise _error(path, problems) from None
            raise
        if values_ok:  # data checks reason over the sampled values: only once those are known good
            problems += _check_data(config, facts)
    if problems:
        raise _error(path, problems)
    return facts


def _error(path: str | Path, problems: list[tuple[tuple[Any, ...], str]]) -> ConfigError:
    located = [f"{path}: {'.'.join(str(p) for p in loc)}: {msg}" for loc, msg in problems]
    if len(located) == 1:
        return ConfigError(located[0])
    return ConfigError(f"{path}: {len(located)} problems\n" + "\n".join(f"  {line}" for line in located))


__all__ = ["DataFacts", "data_facts", "preflight"]
