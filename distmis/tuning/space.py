"""The ``space`` section turned into something a searcher samples.

One definition serves every algorithm: Optuna's TPE and random sampling both run the same
define-by-run function (so conditional parameters are only *sampled* when their condition
holds, not sampled and discarded), and grid search enumerates the same definition.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from distmis.config import ExperimentConfig, ParamSpec
from distmis.exceptions import ConfigError

if TYPE_CHECKING:
    import optuna


def condition_holds(spec: ParamSpec, values: dict[str, Any]) -> bool:
    """``when: {norm: group}`` holds when ``norm`` was sampled and equals ``group`` (or is in a list)."""
    for target, wanted in (spec.when or {}).items():
        if target not in values:
            return False
        allowed = wanted if isinstance(wanted, list) else [wanted]
        if values[target] not in allowed:
            return False
    return True


def ordered_params(space: dict[str, ParamSpec]) -> list[str]:
    """Parameter names with every condition's target before the parameters that depend on it."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ConfigError(f"space: conditions form a cycle through {name!r}")
        visiting.add(name)
        for target in space[name].when or {}:
            if target in space:
                visit(target)
        visiting.discard(name)
        order.append(name)

    for name in space:
        visit(name)
    return order


class DefineByRun:
    """An Optuna define-by-run function sampling ``space`` (conditions respected).

    A class rather than a closure: Ray Tune pickles the searcher, and with it this function,
    into the experiment state that ``--resume`` restores.
    """

    def __init__(self, space: dict[str, ParamSpec]) -> None:
        self.space = dict(space)
        self.order = ordered_params(self.space)

    def __call__(self, trial: optuna.Trial) -> dict[str, Any] | None:
        """Sample every parameter whose condition holds.

        Returns the values of list-valued choices (e.g. a patch shape) as constants: Optuna
        persists only None/bool/int/float/str choices, so those are suggested as their JSON
        text and handed back decoded (Ray's OptunaSearch merges returned constants over the
        suggested values).
        """
        values: dict[str, Any] = {}
        decoded: dict[str, Any] = {}
        for name in self.order:
            spec = self.space[name]
            if not condition_holds(spec, values):
                continue
            if spec.loguniform is not None:
                values[name] = trial.suggest_float(name, *spec.loguniform, log=True)
            elif spec.uniform is not None:
                values[name] = trial.suggest_float(name, *spec.uniform)
            elif spec.randint is not None:
                values[name] = trial.suggest_int(
                    name, spec.randint[0], spec.randint[1] - 1
                )  # high exclusive, like Tune
            elif needs_encoding(spec):
                text = trial.suggest_categorical(name, [json.dumps(c) for c in spec.choice or []])
                values[name] = decoded[name] = json.loads(text)
            else:
                values[name] = trial.suggest_categorical(name, list(spec.choice or []))
        return decoded or None


def needs_encoding(spec: ParamSpec) -> bool:
    """Whether a ``choice`` holds values Optuna cannot store (lists, mappings)."""
    return spec.choice is not None and any(not isinstance(c, (type(None), bool, int, float, str)) for c in spec.choice)


def decode_params(space: dict[str, ParamSpec], params: dict[str, Any]) -> dict[str, Any]:
    """Sampled parameters as configuration values (the JSON text of list-valued choices decoded)."""
    out = dict(params)
    for name, value in params.items():
        spec = space.get(name)
        if spec is not None and needs_encoding(spec) and isinstance(value, str):
            out[name] = json.loads(value)
    return out


def define_by_run(space: dict[str, ParamSpec]) -> DefineByRun:
    """The define-by-run sampler of ``space`` (see :class:`DefineByRun`)."""
    return DefineByRun(space)


#: a grid larger than this is refused: at minutes per trial it would run for years (a
#: 6e12-point grid once exhausted the driver's memory while being enumerated)
MAX_GRID_POINTS = 100_000


def _hashable(value: Any) -> Any:
    """A hashable stand-in for a parameter value (list-valued choices such as a patch shape)."""
    import json

    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else (type(value).__name__, value)


def param_values(spec: ParamSpec) -> list[Any]:
    """The values of a grid axis: a ``choice`` list or every integer of a ``randint`` range."""
    if spec.randint is not None:
        return list(range(spec.randint[0], spec.randint[1]))
    return list(spec.choice or [])


def grid_size_bound(space: dict[str, ParamSpec]) -> int:
    """An upper bound of the grid size (conditions ignored), computed without enumerating."""
    bound = 1
    for spec in space.values():
        if spec.randint is not None:
            bound *= max(1, spec.randint[1] - spec.randint[0])
        elif spec.choice is not None:
            bound *= max(1, len(spec.choice))
    return bound


def grid_points(space: dict[str, ParamSpec], *, limit: int = MAX_GRID_POINTS) -> list[dict[str, Any]]:
    """Every combination of a grid search: ``choice`` lists and integer ranges, conditions respected.

    Raises:
        ConfigError: for continuous parameters, which have no grid, and for a grid of more
            than ``limit`` points (found without building it).
    """
    order = ordered_params(space)
    for name in order:
        if space[name].kind in ("uniform", "loguniform"):
            raise ConfigError(f"space.{name}: grid search needs `choice` (or `randint`) values, got {space[name].kind}")
    points: list[dict[str, Any]] = [{}]
    for name in order:
        spec = space[name]
        values = param_values(spec)
        grown: list[dict[str, Any]] = []
        for point in points:
            if condition_holds(spec, point):
                grown.extend({**point, name: v} for v in values)
            else:
                grown.append(point)
            if len(grown) > limit:
                raise ConfigError(
                    f"space: the grid has more than {limit:,} points (at most {grid_size_bound(space):.3g} without "
                    "conditions); at minutes per trial it could never finish: search fewer values, or use "
                    "algorithm optuna / random with num_samples"
                )
        points = grown
    unique = {tuple(sorted(((k, _hashable(v)) for k, v in p.items()), key=lambda kv: kv[0])): p for p in points}
    return list(unique.values())


def describe_space(config: ExperimentConfig) -> str:
    """A human-readable summary used by ``distmis validate``."""
    from distmis.config import resolve_param_name

    lines = [
        f"search '{config.name}': {config.search.algorithm}, {config.search.num_samples} samples, "
        f"metric {config.search.metric} ({config.search.mode}), parallelism {config.parallelism.mode}"
    ]
    for name in ordered_params(config.space):
        spec = config.space[name]
        dist = getattr(spec, spec.kind)
        cond = f"  when {spec.when}" if spec.when else ""
        lines.append(f"  {name:<12} -> {resolve_param_name(name):<22} {spec.kind} {dist}{cond}")
    if config.search.algorithm == "points":
        lines.append(f"  fixed configurations: {len(config.search.points or [])}")
    if config.search.algorithm == "grid":
        lines.append(f"  grid size: {len(grid_points(config.space))}")
    return "\n".join(lines)
