"""One search on a virtual clock: recorded curves replayed through the searcher and scheduler ``distmis tune`` builds.

Written by hand rather than taken from a library: Syne Tune's simulator backend and OptunaHub's
asynchronous simulator drive their own schedulers and samplers, and none drives Ray Tune's
``Searcher`` and ``TrialScheduler``, which are what a distmis search runs. The loop calls them
as Ray Tune's controller does (``suggest``; per result the scheduler's ``on_trial_result``, then
the searcher's unless the trial stops; at a trial's end both ``on_trial_complete``).

Events are a trial's epoch ends. A reporting trial waits for the driver's decision, as a Tune
function trainable waits in ``report``, and the driver takes one decision at a time: each call's
real duration on this machine is charged to the virtual clock, so a slow sampler at 128 workers
costs what it would. Ray Tune's own work in the driver (its bookkeeping, distmis's callbacks) is
charged too, per result and per trial, as measured by ``benchmarks/tune_driver_load.py``: at a
few trials it hides in the recorded seconds, and at 128 trials with short epochs it queues.
"""

from __future__ import annotations

import contextlib
import heapq
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np

from distmis.config import ExperimentConfig
from distmis.simulate._curves import Curve, architecture, architecture_medians
from distmis.simulate._surrogate import NearestCurves
from distmis.space import GRID_KEY, sampled_params

T = TypeVar("T")

#: The seconds Ray Tune's driver is kept from its next decision by its own work per result and per
#: trial (its start and end) of a distmis search: its bookkeeping and checkpoint registration,
#: distmis's MLflow and progress callbacks. ``benchmarks/tune_driver_load.py`` measures them; the
#: figures, their machine and their date are in docs/benchmarks.md ("The driver at scale").
DRIVER_SECONDS_PER_RESULT = 0.011
DRIVER_SECONDS_PER_TRIAL = 0.020

#: The seconds a trial spends between two epochs (its checkpoint written, its result through Tune
#: and back) where the curves did not record them, as the shipped tables do not: leaving them out
#: would make every epoch a few per cent short of what it costs. The median gap in real searches'
#: ``metrics.csv`` (``benchmarks/curve_timing.py``; docs/benchmarks.md, "Seed by seed, the engine
#: alone"). A cluster's shared file system is slower: ``--clock-of`` a pilot search there replaces
#: it with what that search recorded.
REPORT_SECONDS = 0.06


@dataclass(frozen=True)
class StartupCosts:
    """Seconds a worker spends outside its epochs, as measured in the recorded search.

    slot: a fresh slot's cold start (its process) before its first trial starts.
    cold: from a fresh slot's first trial's start to its first epoch.
    warm: from the end of a trial to the first epoch of the next trial on the same slot.
    search: the search's fixed cost before its first trial (not in a run's times, which start
        with the first trial, as ``benchmarks/search_efficiency.py`` reads real runs).
    report: from an epoch's end to the next epoch's start on the same trial (its checkpoint, its
        result's way through the driver and back). The gap was measured with a driver that
        decided in milliseconds; a trial waits for the longer of this and the driver's decision,
        so a driver queueing decisions at scale still holds it.
    report_recorded: whether ``report`` is the curves' own median, or :data:`REPORT_SECONDS`
        because they did not record it (what a simulation's header says).
    cold_first_epoch: the seconds a fresh slot's first trial's first epoch takes beyond a warm
        trial's first epoch of the same architecture (:func:`cold_first_epoch_seconds`). A recorded
        curve's first epoch is cold or warm as its slot was in the recording, and a simulated
        trial's slot may be the other: the engine adds or takes away this much.
    driver_per_result, driver_per_trial: the Tune driver's own serial work after a result (its
        bookkeeping, the callbacks) and for a trial's start and end. It keeps the driver from its
        next decision, not the trial it was for: that trial's recorded seconds already hold its own
        share, so only queueing behind other trials' work adds time.
    """

    slot: float
    cold: float
    warm: float
    search: float = 0.0
    report: float = 0.0
    driver_per_result: float = 0.0
    driver_per_trial: float = 0.0
    report_recorded: bool = True
    cold_first_epoch: float = 0.0

    @classmethod
    def of_curves(
        cls,
        curves: list[Curve],
        *,
        driver_per_result: float = DRIVER_SECONDS_PER_RESULT,
        driver_per_trial: float = DRIVER_SECONDS_PER_TRIAL,
    ) -> StartupCosts:
        """Medians over the recorded trials (a warm trial's slot state differs in a simulation);
        the seconds between epochs as measured where the curves did not record them; the
        driver's own work as measured, unless given (no table records it)."""
        cold = [c for c in curves if not c.warm]
        warm = [c for c in curves if c.warm]
        slots = [c.slot_startup_seconds for c in cold if c.slot_startup_seconds is not None]

        def median(values: list[float], fallback: float) -> float:
            return float(np.median(values)) if values else fallback

        cold_trial = median([c.startup_seconds for c in cold], 0.0)
        gaps = [r for c in curves for r in c.report_seconds if r is not None]
        return cls(
            slot=median(slots, 0.0),
            cold=cold_trial,
            warm=median([c.startup_seconds for c in warm], cold_trial),
            search=median([c.search_fixed_seconds for c in curves if c.search_fixed_seconds is not None], 0.0),
            report=median(gaps, REPORT_SECONDS),
            driver_per_result=driver_per_result,
            driver_per_trial=driver_per_trial,
            report_recorded=bool(gaps),
            cold_first_epoch=cold_first_epoch_seconds(curves),
        )

    def first_epoch(self, curve: Curve, *, cold_slot: bool) -> float:
        """``curve``'s first epoch on a fresh slot (``cold_slot``) or a reused one."""
        recorded = curve.epoch_seconds[0]
        if cold_slot and curve.warm:
            return recorded + self.cold_first_epoch
        if not cold_slot and not curve.warm:
            return max(0.0, recorded - self.cold_first_epoch)
        return recorded


def cold_first_epoch_seconds(curves: list[Curve]) -> float:
    """The median of each cold trial's first epoch less the median first epoch of the warm trials of
    its architecture; 0 where no architecture has both, or where that median is below 0.

    A fresh process's first epoch sets up TensorFlow's runtime (its thread pools, and on a GPU the
    device's context, cuDNN's handles and autotuning), which a reused slot's trials find ready. It
    is a cost per process, not per trial, so the engine charges it to each fresh slot's first trial
    whichever curve that trial replays. A median below 0 is the shared cores' noise: a process
    does not get faster by being new.
    """
    warm_firsts = architecture_medians(curves, lambda c: c.epoch_seconds[0] if c.warm and c.epochs else None)
    extra = [
        c.epoch_seconds[0] - warm_firsts[a]
        for c in curves
        if not c.warm and c.epochs and (a := architecture(c)) in warm_firsts
    ]
    return max(0.0, float(np.median(extra))) if extra else 0.0


@dataclass
class SimulatedTrial:
    """What Ray Tune's scheduler reads of a trial (its id), and what the loop needs of it."""

    trial_id: str
    params: dict[str, Any]
    curve: Curve
    worker: int
    started: float
    epochs_done: int = 0
    status: str = "RUNNING"


class Report(NamedTuple):
    """One result as the scheduler was given it, and what it decided: ``CONTINUE`` or ``STOP``."""

    trial_id: str
    epoch: int
    value: float  # the metric as reported, not signed
    decision: str


@dataclass
class SearchRun:
    """One simulated search, in the shape ``benchmarks/search_efficiency.py`` reads from a real one."""

    events: list[tuple[float, float]]  # (seconds since the first trial's start, signed metric)
    intervals: list[tuple[float, float]]
    wall: float
    epochs: int
    trials: int
    sign: float
    decision_seconds: float
    stopped_early: int
    best_params: dict[str, Any] = field(default_factory=dict)
    # every result in the order the driver dealt with it, with the scheduler's decision: which
    # trials stopped where, to be checked against what Ray's scheduler decides on the same results
    reports: list[Report] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "intervals": self.intervals,
            "wall": self.wall,
            "epochs": self.epochs,
            "trials": self.trials,
            "sign": self.sign,
        }


class _Driver:
    """The driver's clock: one decision at a time, each charged with its real duration, then its
    own work (:meth:`occupy`), which delays the next decision."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.spent = 0.0

    def decide(self, at: float, call: Callable[[], T]) -> tuple[T, float]:
        start = max(at, self.free_at)
        t0 = time.perf_counter()
        value = call()
        took = time.perf_counter() - t0
        self.spent += took
        self.free_at = start + took
        return value, self.free_at

    def occupy(self, seconds: float) -> None:
        """The driver works ``seconds`` more after its last decision, whoever waits for it."""
        self.free_at += seconds


class _Simulation:
    """The event loop of one search: idle workers, running trials as a heap of epoch ends, the driver."""

    def __init__(
        self,
        config: ExperimentConfig,
        surrogate: NearestCurves,
        work: Path,
        *,
        workers: int,
        costs: StartupCosts,
        training_seed: int | None,
    ) -> None:
        from distmis.tuning import scheduler, searcher

        s = config.search
        self.metric, self.epochs, self.costs, self.surrogate = s.metric, config.train.epochs, costs, surrogate
        self.training_seed = training_seed
        self.search_alg, param_space, self.budget = searcher(config, work, workers)
        self.points = list(param_space[GRID_KEY]["grid_search"]) if param_space else []
        if param_space:
            self.budget = len(self.points)
        self.scheduler = scheduler(config)
        if self.scheduler is not None:
            self.scheduler.set_search_properties(s.metric, s.mode)
        self.driver = _Driver()
        self.heap: list[tuple[float, int, SimulatedTrial]] = []
        self.idle = [(w, False) for w in reversed(range(workers))]  # (worker, has run a trial)
        self.run = SearchRun([], [], 0.0, 0, 0, 1.0 if s.mode == "max" else -1.0, 0.0, 0)
        self.starts: list[float] = []
        self.best = -np.inf

    def _suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self.search_alg is None:
            return {GRID_KEY: self.points[self.run.trials]}
        suggested: dict[str, Any] | None = self.search_alg.suggest(trial_id)
        return suggested

    def start_trials(self, now: float, rng: np.random.Generator) -> None:
        """Fill the idle workers with new trials while the budget lasts."""
        while self.idle and self.run.trials < self.budget:
            tid = f"{self.run.trials:05d}"
            suggested, ready = self.driver.decide(now, partial(self._suggest, tid))
            if suggested is None:
                return
            params = sampled_params(suggested)
            worker, warm = self.idle.pop()
            started = ready if warm else ready + self.costs.slot
            curve = self.surrogate.curve(params, rng, training_seed=self.training_seed)
            trial = SimulatedTrial(tid, params, curve, worker, started)
            if self.scheduler is not None:
                _, ready = self.driver.decide(ready, partial(self.scheduler.on_trial_add, None, trial))
            self.driver.occupy(self.costs.driver_per_trial)
            self.starts.append(started)
            self.run.trials += 1
            first_epoch = (
                started
                + (self.costs.warm if warm else self.costs.cold)
                + self.costs.first_epoch(trial.curve, cold_slot=not warm)
            )
            heapq.heappush(self.heap, (first_epoch, self.run.trials, trial))

    def _decide(self, trial: SimulatedTrial, result: dict[str, Any]) -> bool:
        """Tune's order: the scheduler, then the searcher unless the trial stops; at its end both. True: it ends."""
        from ray.tune.schedulers import TrialScheduler

        sched, search_alg = self.scheduler, self.search_alg
        decision = sched.on_trial_result(None, trial, result) if sched is not None else TrialScheduler.CONTINUE
        if decision != TrialScheduler.STOP and search_alg is not None:
            search_alg.on_trial_result(trial.trial_id, result)
        self.run.reports.append(Report(trial.trial_id, trial.epochs_done, result[self.metric], decision))
        ends = bool(decision == TrialScheduler.STOP or trial.epochs_done >= self.epochs)
        if ends:
            if sched is not None:
                sched.on_trial_complete(None, trial, result)
            if search_alg is not None:
                search_alg.on_trial_complete(trial.trial_id, result=result)
        return ends

    def step(self, rng: np.random.Generator) -> None:
        """The next epoch end: its decision, then the trial's next epoch or a new trial on its worker."""
        at, order, trial = heapq.heappop(self.heap)
        trial.epochs_done += 1
        e, run = trial.epochs_done, self.run
        result: dict[str, Any] = {**trial.curve.result(e), "done": e >= self.epochs, "trial_id": trial.trial_id}
        ends, now = self.driver.decide(at, partial(self._decide, trial, result))
        value = run.sign * result[self.metric]
        run.events.append((at, value))
        run.epochs += 1
        if value > self.best:
            self.best, run.best_params = value, dict(trial.params)
        if not ends:
            # the result reached the driver as the epoch ended; the trial's checkpoint and Tune's
            # round trip keep it from its next epoch for the report's seconds, or the decision's
            next_start = max(now, at + self.costs.report)
            self.driver.occupy(self.costs.driver_per_result)
            heapq.heappush(self.heap, (next_start + trial.curve.epoch_seconds[e], order, trial))
            return
        trial.status = "TERMINATED"
        run.stopped_early += int(e < self.epochs)
        run.intervals.append((trial.started, at))
        self.idle.append((trial.worker, True))
        # the worker's next trial does not wait for this result's driver work: its recorded warm
        # start-up already holds it; the trials after it do
        self.start_trials(now, rng)
        self.driver.occupy(self.costs.driver_per_result)

    def finish(self) -> SearchRun:
        run = self.run
        t0 = min(self.starts) if self.starts else 0.0
        run.events = sorted((t - t0, v) for t, v in run.events)
        run.intervals = [(a - t0, b - t0) for a, b in run.intervals]
        run.wall = max((b for _, b in run.intervals), default=0.0)
        run.decision_seconds = self.driver.spent
        return run


def simulate_search(
    config: ExperimentConfig,
    surrogate: NearestCurves,
    *,
    workers: int,
    costs: StartupCosts,
    seed: int,
    match_training_seed: bool = False,
    work: Path | None = None,
) -> SearchRun:
    """Run ``config``'s search with ``workers`` concurrent trials on the recorded curves.

    Every trial replays one recorded training seed, as every trial of a real search trains with
    one ``train.seed``. ``match_training_seed``: that seed is the file's ``train.seed`` where the
    table holds it (what a real search with that seed trains); else, and without it, a recorded
    seed drawn once for the search.
    ``work``: the folder that holds the searcher's files (its Optuna journal) and keeps them, so a
    simulated study can be read afterwards or given its trials before it starts; else a temporary one.
    """
    np.random.seed(seed)  # ASHA draws each trial's bracket from NumPy's global generator
    rng = np.random.default_rng(seed)
    with contextlib.ExitStack() as stack:
        folder = (
            work
            if work is not None
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="distmis-simulate-")))
        )
        sim = _Simulation(
            config,
            surrogate,
            folder,
            workers=workers,
            costs=costs,
            training_seed=surrogate.search_seed(config.train.seed if match_training_seed else None, rng),
        )
        sim.start_trials(0.0, rng)
        while sim.heap:
            sim.step(rng)
    return sim.finish()


__all__ = [
    "DRIVER_SECONDS_PER_RESULT",
    "DRIVER_SECONDS_PER_TRIAL",
    "Report",
    "SearchRun",
    "SimulatedTrial",
    "StartupCosts",
    "cold_first_epoch_seconds",
    "simulate_search",
]
