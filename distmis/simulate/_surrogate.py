"""What a configuration the table does not hold would have reported: its nearest recorded neighbour's
curve, moved to the level of its few nearest.

A sampler proposes configurations anywhere in the space, and a table holds a few hundred. The
answer for one it does not hold is the curve of the nearest recorded configuration. Distance is
measured per parameter and summed in squares: a numeric parameter (every recorded value a
number) on [0, 1] of the range that the table and the search space span together, on a log
scale where the space says log-uniform or the values span more than 20x; any other as 0 when
equal and 1 when not; a parameter that a condition left unsampled on one side only as 1.

One neighbour's value is a noisy guess: the best of many such guesses (what a search reports) is
higher than the best of what those configurations really reach. So the replayed curve is moved by
a constant to the mean best value of the k nearest configurations, with k (1 to 4) and the
parameters' weights those of the least leave-one-out error on the table. A recorded curve, not an
average of several, is what moves: it keeps the noise and the shape a real trial has, which an
average smooths away and a scheduler reacts to.

Where a configuration has curves for several training seeds, a lookup replays the one of the
search's training seed. Every trial of a real search trains with the file's ``train.seed``, and
that seed moves the whole search (its data order, its initial weights): replaying a seed drawn
for each trial on its own would give every configuration its luckiest seed in the best of many.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from distmis.simulate._curves import Curve, CurveTable, cell
from distmis.space import Space


def config_key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, cell(v)) for k, v in params.items() if v is not None))


@dataclass
class LeaveOneOut:
    """How well the nearest neighbour predicts a configuration's best value, against seed noise."""

    configs: int
    mean_absolute_error: float
    rank_correlation: float
    seed_pairs: int
    seed_mean_absolute_difference: float
    weights: dict[str, float] | None = None  # fitted per-parameter weights, None: all 1
    neighbours: int = 1

    def line(self, metric: str) -> str:
        seeds = (
            f"; two training seeds of one configuration differ by {self.seed_mean_absolute_difference:.4f} "
            f"(mean of {self.seed_pairs})"
            if self.seed_pairs
            else ""
        )
        distance = (
            "weighted " + ", ".join(f"{k} {v:g}" for k, v in self.weights.items()) if self.weights else "unweighted"
        )
        level = f", moved to the mean of its {self.neighbours} nearest" if self.neighbours > 1 else ""
        return (
            f"surrogate (nearest recorded configuration{level}, {distance}), leave-one-out over {self.configs} "
            "configurations: "
            f"best {metric} mean absolute error {self.mean_absolute_error:.4f}, rank correlation "
            f"{self.rank_correlation:.3f}{seeds}"
        )


class NearestCurves:
    """The recorded curves of a (typed) table, looked up by configuration."""

    def __init__(self, table: CurveTable, space: Space, *, metric: str, mode: str) -> None:
        self.space, self.metric, self.sign = dict(space), metric, 1.0 if mode == "max" else -1.0
        groups: dict[tuple[tuple[str, str], ...], list[Curve]] = {}
        for curve in table.curves:
            groups.setdefault(config_key(curve.params), []).append(curve)
        self.keys = list(groups)
        self.curves = [groups[k] for k in self.keys]
        self.index = {k: i for i, k in enumerate(self.keys)}
        self.names = list(self.space)
        self.axes = [self._axis(name, [c[0].params.get(name) for c in self.curves]) for name in self.names]
        self.coords = np.array([self._coords(c[0].params) for c in self.curves], dtype=float)
        self.weights = np.ones(len(self.names))
        self.neighbours = 1
        self.truth = np.array([float(np.mean([self.best(c) for c in curves])) for curves in self.curves])

    def _axis(self, name: str, recorded: list[Any]) -> tuple[str, float, float] | list[str]:
        """A numeric axis (scale, low, high) or the categories of a parameter."""
        spec = self.space[name]
        values = [v for v in recorded if v is not None]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not values or len(numbers) != len(values):
            return sorted({cell(v) for v in values})
        bounds = list(spec.loguniform or spec.uniform or spec.randint or [])
        bounds += [c for c in spec.choice or [] if isinstance(c, (int, float)) and not isinstance(c, bool)]
        lo, hi = min(numbers + bounds), max(numbers + bounds)
        log = lo > 0 and (spec.loguniform is not None or hi > 20 * lo)
        return ("log", math.log(lo), math.log(hi)) if log else ("linear", lo, hi)

    def _coords(self, params: dict[str, Any]) -> list[float]:
        """One number per parameter: its place on [0, 1] of its axis, a category's index, NaN when unsampled."""
        out = []
        for name, axis in zip(self.names, self.axes, strict=True):
            value = params.get(name)
            if value is None:
                out.append(math.nan)
            elif isinstance(axis, list):
                out.append(float(axis.index(cell(value))) if cell(value) in axis else -1.0)
            else:
                scale, lo, hi = axis
                x = math.log(float(value)) if scale == "log" and float(value) > 0 else float(value)
                out.append((x - lo) / (hi - lo) if hi > lo else 0.0)
        return out

    def _differences(self, q: np.ndarray) -> np.ndarray:
        """Per recorded configuration and parameter, the squared difference to the point ``q``."""
        categorical = np.array([isinstance(axis, list) for axis in self.axes])
        diff = np.where(categorical, (self.coords != q).astype(float), (self.coords - q) ** 2)
        one_missing = np.isnan(self.coords) ^ np.isnan(q)
        both_missing = np.isnan(self.coords) & np.isnan(q)
        return np.asarray(np.where(one_missing, 1.0, np.where(both_missing, 0.0, diff)))

    def distances(self, params: dict[str, Any]) -> np.ndarray:
        """Weighted squared distances from ``params`` to every recorded configuration."""
        return np.asarray(self._differences(np.array(self._coords(params), dtype=float)) @ self.weights)

    @cached_property
    def pairs(self) -> np.ndarray:
        """Per pair of recorded configurations and parameter, the squared difference (n, n, parameters):
        what fitting the weights and every leave-one-out estimate read, computed once."""
        return np.stack([self._differences(q) for q in self.coords])

    def fit_weights(self, options: tuple[float, ...] = (0.0, 0.25, 1.0, 4.0), rounds: int = 3) -> None:
        """Weigh each parameter by how much it moves the result: coordinate descent on the leave-one-out
        error of the best value. A parameter that does not matter (weight 0) then no longer pulls a
        configuration towards a neighbour that differs where it counts."""
        everyone = list(range(len(self.truth)))
        self.weights = _fitted(self.pairs, self.truth, options, rounds, everyone, self.neighbours)

    def curve(self, params: dict[str, Any], rng: np.random.Generator, *, training_seed: int | None = None) -> Curve:
        """A recorded curve for ``params``: its own where recorded, else its nearest neighbour's, moved
        by a constant to the mean best value of its ``neighbours`` nearest.

        Of a configuration's seeds, the one recorded with ``training_seed`` where given and held
        (training is deterministic: a real trial with that seed reports that very curve); where
        given and not held, always the same one of those it holds, as a search replays one seed;
        where not given, one drawn at random.
        """
        own = self.index.get(config_key(params))
        if own is not None:
            return _one_seed(self.curves[own], rng, training_seed)
        d = self.distances(params)
        i = int(np.argmin(d))
        chosen = _one_seed(self.curves[i], rng, training_seed)
        if self.neighbours == 1:
            return chosen
        level = float(self.truth[np.argpartition(d, self.neighbours - 1)[: self.neighbours]].mean())
        return self._moved(chosen, level - float(self.truth[i]))

    def _moved(self, curve: Curve, by: float) -> Curve:
        """``curve`` with its metric moved by ``by``, kept inside the range the table recorded: the
        shape, the noise and the epochs' seconds stay a real trial's."""
        moved = [min(max(v + by, self.recorded_range[0]), self.recorded_range[1]) for v in curve.values[self.metric]]
        return replace(curve, values={**curve.values, self.metric: moved})

    @cached_property
    def training_seeds(self) -> list[int]:
        """Every training seed the table holds a curve of, in order."""
        return sorted({c.training_seed for curves in self.curves for c in curves})

    def search_seed(self, wanted: int | None, rng: np.random.Generator) -> int | None:
        """The recorded training seed one simulated search replays: ``wanted`` where the table holds
        it, else one of the table's drawn once for the whole search."""
        held = self.training_seeds
        if wanted in held or not held:
            return wanted
        return held[int(rng.integers(len(held)))]

    @cached_property
    def recorded_range(self) -> tuple[float, float]:
        """The least and greatest value of the metric the table holds: a moved curve stays inside."""
        values = [v for curves in self.curves for c in curves for v in c.values[self.metric]]
        return min(values), max(values)

    def best(self, curve: Curve) -> float:
        return self.sign * max(self.sign * v for v in curve.values[self.metric])

    def choose_weights(self, neighbours: tuple[int, ...] = (1, 2, 3, 4)) -> LeaveOneOut:
        """The number of neighbours, and fitted weights where they predict held-out configurations
        better than none, that give the least leave-one-out error; returns that error."""
        if len(self.truth) < 16:
            return self.leave_one_out()
        found = []
        for k in neighbours:
            self.neighbours, self.weights = k, np.ones(len(self.names))
            found.append((self.leave_one_out(), k, self.weights))
            self.fit_weights()
            fitted = self.leave_one_out()
            fitted.weights = dict(zip(self.names, map(float, self.weights), strict=True))
            found.append((fitted, k, self.weights))
        best, self.neighbours, self.weights = min(found, key=lambda f: (f[0].mean_absolute_error, f[1]))
        return best

    def leave_one_out(self) -> LeaveOneOut:
        """Predict each configuration's best value (mean over its seeds) from its ``neighbours`` nearest
        other configurations.

        With fitted weights the error is measured honestly: the configurations are split in two
        halves, the weights fitted on one predict the other, and the two halves' errors are pooled.
        """
        truth = self.truth
        if len(truth) < 4:
            return LeaveOneOut(len(truth), math.nan, math.nan, 0, math.nan)
        pairs = self.pairs
        k = self.neighbours
        if np.all(self.weights == 1.0):
            predicted = _predict(pairs, self.weights, truth, range(len(truth)), k)
        else:
            order = np.random.default_rng(0).permutation(len(truth))
            halves = [list(order[: len(order) // 2]), list(order[len(order) // 2 :])]
            predicted = np.empty(len(truth))
            for fit_on, judged in (halves, halves[::-1]):
                weights = _fitted(pairs, truth, (0.0, 0.25, 1.0, 4.0), 3, fit_on, k)
                predicted[judged] = _predict(pairs, weights, truth, judged, k)
        seeds = [abs(self.best(c[0]) - self.best(c[1])) for c in self.curves if len(c) > 1]
        return LeaveOneOut(
            configs=len(truth),
            mean_absolute_error=float(np.mean(np.abs(truth - predicted))),
            rank_correlation=_spearman(list(truth), list(predicted)),
            seed_pairs=len(seeds),
            seed_mean_absolute_difference=float(np.mean(seeds)) if seeds else math.nan,
            neighbours=k,
        )


def _one_seed(options: list[Curve], rng: np.random.Generator, training_seed: int | None) -> Curve:
    """Of one configuration's curves, the one recorded with ``training_seed``; where that seed is not
    among them, the same one of them for that seed every time (a search's trials share its seed);
    with no seed given, one drawn."""
    if len(options) == 1:
        return options[0]
    if training_seed is None:
        return options[int(rng.integers(len(options)))]
    same = [c for c in options if c.training_seed == training_seed]
    if same:
        return same[0]
    ordered = sorted(options, key=lambda c: c.training_seed)
    return ordered[training_seed % len(ordered)]


def _predict(pairs: np.ndarray, weights: np.ndarray, truth: np.ndarray, judged: Any, k: int = 1) -> np.ndarray:
    """The mean value of the ``k`` nearest other configurations for each configuration in ``judged``."""
    judged = list(judged)
    d = pairs[judged] @ weights
    d[np.arange(len(judged)), judged] = np.inf  # not itself
    if k == 1:
        return np.asarray(truth[np.argmin(d, axis=1)])
    nearest = np.argpartition(d, k - 1, axis=1)[:, :k]
    return np.asarray(truth[nearest].mean(axis=1))


def _fitted(
    pairs: np.ndarray, truth: np.ndarray, options: tuple[float, ...], rounds: int, fit_on: list[int], k: int = 1
) -> np.ndarray:
    """Per-parameter weights minimising the leave-one-out error over the configurations ``fit_on``."""
    sub = pairs[np.ix_(fit_on, fit_on)]
    values = truth[fit_on]
    everyone = list(range(len(fit_on)))
    weights = np.ones(pairs.shape[2])

    def error(w: np.ndarray) -> float:
        return float(np.mean(np.abs(values - _predict(sub, w, values, everyone, k))))

    best = error(weights)
    for _ in range(rounds):
        for d in range(len(weights)):
            for option in options:
                trial = weights.copy()
                trial[d] = option
                if trial.any() and (e := error(trial)) < best - 1e-9:
                    best, weights = e, trial
    return weights


def _ranks(values: list[float]) -> np.ndarray:
    """Ranks with ties sharing their mean rank (as Spearman's coefficient needs)."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    _, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks)
    counts = np.bincount(inverse)
    return np.asarray(sums[inverse] / counts[inverse])


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


__all__ = ["LeaveOneOut", "NearestCurves", "config_key"]
