"""The ``space`` section of a search: its parameters, their rules, and how they are sampled.

One place for everything about a search space that does not need the rest of the configuration:
a parameter's distribution (:class:`ParamSpec`), its conditions (``when``), the values that stand
for all it can sample, the rules a space must follow (checked by ``distmis validate``, by the
configuration loader and by preflight), the grid it spans, and the define-by-run function every
sampler runs. Conditional parameters are only *sampled* when their condition holds, not sampled
and discarded, and grid search enumerates the same definition.
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

from distmis.exceptions import ConfigError

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

#: a problem found in a space: (YAML path, message)
Problem = tuple[tuple[Any, ...], str]
KINDS = ("uniform", "loguniform", "randint", "choice")


class ParamSpec(BaseModel):
    """One searched parameter: exactly one distribution key, plus an optional condition."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    choice: list[Any] | None = None
    when: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _exactly_one_distribution(self) -> ParamSpec:
        given = [k for k in KINDS if getattr(self, k) is not None]
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
        return next(k for k in KINDS if getattr(self, k) is not None)

    def admits(self, value: Any) -> bool:
        """Whether ``value`` is one this parameter can take (a choice, or inside the range)."""
        if self.choice is not None:
            return any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in self.choice)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.randint is not None:
            return isinstance(value, int) and self.randint[0] <= value < self.randint[1]
        low, high = self.uniform or self.loguniform or (0.0, 0.0)
        return low <= value <= high


Space = dict[str, ParamSpec]


# --------------------------------------------------------------------------- conditions
def condition_holds(spec: ParamSpec, values: dict[str, Any]) -> bool:
    """``when: {norm: group}`` holds when ``norm`` was sampled and equals ``group`` (or is in a list)."""
    for target, wanted in (spec.when or {}).items():
        if target not in values:
            return False
        allowed = wanted if isinstance(wanted, list) else [wanted]
        if values[target] not in allowed:
            return False
    return True


def ordered_params(space: Space) -> list[str]:
    """Parameter names with every condition's target before the parameters that depend on it.

    Raises:
        ConfigError: conditions that form a cycle.
    """
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


def param_values(spec: ParamSpec) -> list[Any]:
    """The values of a grid axis: a ``choice`` list or every integer of a ``randint`` range."""
    if spec.randint is not None:
        return list(range(spec.randint[0], spec.randint[1]))
    return list(spec.choice or [])


def candidates(spec: ParamSpec) -> list[Any]:
    """Values that stand for everything ``spec`` can sample: every choice, both ends of a range.

    Every constraint of a configuration field is a bound (``ge``, ``gt``, ``le``, ``lt``), so if
    both ends of a range pass, every value between them does.
    """
    if spec.choice is not None:
        return list(spec.choice)
    if spec.randint is not None:
        low, high = spec.randint
        return sorted({low, high - 1})
    bounds = spec.uniform if spec.uniform is not None else spec.loguniform
    assert bounds is not None  # the spec model guarantees exactly one kind
    return [bounds[0], bounds[1]]


# --------------------------------------------------------------------------- the rules a space follows
def structure_problems(space: Space) -> list[Problem]:
    """Conditions that name no searched parameter, or the parameter itself (found when a file is read)."""
    problems: list[Problem] = []
    for key, spec in space.items():
        for target in spec.when or {}:
            if target not in space:
                hint = difflib.get_close_matches(target, list(space), n=1)
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


def condition_problems(space: Space) -> list[Problem]:
    """Conditions that can never hold: on a continuous parameter, or on a value it never takes."""
    problems: list[Problem] = []
    for name, spec in space.items():
        for target, wanted in (spec.when or {}).items():
            if target not in space or target == name:
                continue  # a structure problem
            tspec = space[target]
            allowed = wanted if isinstance(wanted, list) else [wanted]
            if tspec.kind in ("uniform", "loguniform"):
                problems.append(
                    (
                        ("space", name, "when", target),
                        f"condition on the continuous parameter {target!r} can never hold exactly; "
                        "condition on a choice or randint parameter",
                    )
                )
                continue
            values = param_values(tspec)
            if not any(v in allowed for v in values):  # the same test as condition_holds
                problems.append(
                    (
                        ("space", name, "when", target),
                        f"condition {target} == {wanted!r} can never hold: {target} takes {values}, so "
                        f"{name} would never be searched",
                    )
                )
    return problems


def point_problems(space: Space, points: list[dict[str, Any]], *, exact: bool) -> list[Problem]:
    """Starting points (``exact``: the configurations of algorithm ``points``) against the space.

    A starting point must name searched parameters with values the sampler could propose; an
    exact configuration may set any value of a searched parameter (preflight checks the field).
    """
    problems: list[Problem] = []
    for i, point in enumerate(points):
        unknown = sorted(set(point) - set(space))
        if unknown:
            problems.append((("search", "points", i), f"{unknown} are not parameters of space {sorted(space)}"))
            continue
        if exact:
            continue
        for name, value in point.items():
            spec = space[name]
            if not spec.admits(value):
                problems.append(
                    (
                        ("search", "points", i, name),
                        f"{value!r} is outside its {spec.kind} {getattr(spec, spec.kind)}; a starting point must "
                        "be one the sampler could propose",
                    )
                )
    return problems


# --------------------------------------------------------------------------- the grid
#: a grid larger than this is refused: at minutes per trial it would run for years (a
#: 6e12-point grid once exhausted the driver's memory while being enumerated)
MAX_GRID_POINTS = 100_000


def _hashable(value: Any) -> Any:
    """A hashable stand-in for a parameter value (list-valued choices such as a patch shape)."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else (type(value).__name__, value)


def grid_size_bound(space: Space) -> int:
    """An upper bound of the grid size (conditions ignored), computed without enumerating."""
    bound = 1
    for spec in space.values():
        if spec.randint is not None:
            bound *= max(1, spec.randint[1] - spec.randint[0])
        elif spec.choice is not None:
            bound *= max(1, len(spec.choice))
    return bound


def grid_points(space: Space, *, limit: int = MAX_GRID_POINTS) -> list[dict[str, Any]]:
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


def grid_problems(space: Space) -> list[Problem]:
    try:
        grid_points(space)
    except ConfigError as exc:
        return [(("space",), str(exc).removeprefix("space: "))]
    return []


# --------------------------------------------------------------------------- sampling
#: the key under which a grid point (or a fixed configuration) reaches a trial
GRID_KEY = "grid_point"


def sampled_params(config: dict[str, Any]) -> dict[str, Any]:
    """The searched parameters of a Tune config (a grid search nests each point under :data:`GRID_KEY`)."""
    params = {k: v for k, v in config.items() if not k.startswith("_") and k != GRID_KEY}
    params.update(config.get(GRID_KEY) or {})
    return params


def needs_encoding(spec: ParamSpec) -> bool:
    """Whether a ``choice`` holds values Optuna cannot store (lists, mappings)."""
    return spec.choice is not None and any(not isinstance(c, (type(None), bool, int, float, str)) for c in spec.choice)


def decode_params(space: Space, params: dict[str, Any]) -> dict[str, Any]:
    """Sampled parameters as configuration values (the JSON text of list-valued choices decoded)."""
    out = dict(params)
    for name, value in params.items():
        spec = space.get(name)
        if spec is not None and needs_encoding(spec) and isinstance(value, str):
            out[name] = json.loads(value)
    return out


def optuna_distribution(spec: ParamSpec) -> BaseDistribution:
    """A parameter as Optuna's distribution: the one translation of the space to Optuna.

    ``randint``'s upper bound is exclusive, as in Ray Tune, where Optuna's is inclusive; a choice
    of lists or mappings is a choice of their JSON text, the only form Optuna's storage keeps.
    """
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if spec.loguniform is not None:
        return FloatDistribution(*spec.loguniform, log=True)
    if spec.uniform is not None:
        return FloatDistribution(*spec.uniform)
    if spec.randint is not None:
        return IntDistribution(spec.randint[0], spec.randint[1] - 1)
    if needs_encoding(spec):
        return CategoricalDistribution([json.dumps(c) for c in spec.choice or []])
    return CategoricalDistribution(list(spec.choice or []))


class DefineByRun:
    """An Optuna define-by-run function sampling ``space`` (conditions respected).

    A class rather than a closure: Ray Tune pickles the searcher, and with it this function,
    into the experiment state that ``--resume`` restores.
    """

    def __init__(self, space: Space) -> None:
        self.space = dict(space)
        self.order = ordered_params(self.space)

    def __call__(self, trial: optuna.Trial) -> dict[str, Any] | None:
        """Sample every parameter whose condition holds.

        Returns the values of list-valued choices (e.g. a patch shape) as constants: Optuna
        persists only None/bool/int/float/str choices, so those are suggested as their JSON
        text and handed back decoded (the searcher merges them over the suggested values).
        """
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        values: dict[str, Any] = {}
        decoded: dict[str, Any] = {}
        for name in self.order:
            spec = self.space[name]
            if not condition_holds(spec, values):
                continue
            dist = optuna_distribution(spec)
            if isinstance(dist, FloatDistribution):
                values[name] = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
            elif isinstance(dist, IntDistribution):
                values[name] = trial.suggest_int(name, dist.low, dist.high)
            else:
                assert isinstance(dist, CategoricalDistribution)
                values[name] = trial.suggest_categorical(name, dist.choices)
                if needs_encoding(spec):
                    values[name] = decoded[name] = json.loads(str(values[name]))
        return decoded or None

    def encoded(self, point: dict[str, Any]) -> dict[str, Any]:
        """A configuration as Optuna stores it (list-valued choices as their JSON text)."""
        return {k: json.dumps(v) if k in self.space and needs_encoding(self.space[k]) else v for k, v in point.items()}


def define_by_run(space: Space) -> DefineByRun:
    """The define-by-run sampler of ``space`` (see :class:`DefineByRun`)."""
    return DefineByRun(space)


__all__ = [
    "GRID_KEY",
    "MAX_GRID_POINTS",
    "DefineByRun",
    "ParamSpec",
    "Problem",
    "Space",
    "candidates",
    "condition_holds",
    "condition_problems",
    "decode_params",
    "define_by_run",
    "grid_points",
    "grid_problems",
    "grid_size_bound",
    "needs_encoding",
    "optuna_distribution",
    "ordered_params",
    "param_values",
    "point_problems",
    "sampled_params",
    "structure_problems",
]
