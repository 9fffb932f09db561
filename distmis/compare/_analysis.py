"""The figures of a comparison, computed from measured records only.

Speed-up is measured against the sequential 1-worker baseline, which ran only the first few
configurations. A mode's sequential-equivalent time is estimated from the work it actually
did (training samples, so ASHA-stopped trials and weak scaling are accounted for)::

    T_seq(mode) = F_b + (P_b / S_b) x S_mode

with ``F_b`` the baseline's fixed cost (wall time outside its trial phase: Ray start-up,
tracking, summary), ``P_b`` its trial phase (first trial start to last trial end) and ``S``
the training samples processed. Speed-up = T_seq / wall; parallel efficiency = speed-up / k
(the k worker slots every mode was given). The trial-phase speed-up leaves ``F_b`` out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from distmis.compare._plan import BASELINE
from distmis.compare._records import ModeRecord, TrialRecord


@dataclass
class ModeStats:
    mode: str
    slots: int
    workers_per_trial: int
    concurrent_trials: int
    max_concurrent_observed: int
    global_batch: int
    lr_scaling: str
    scaling: str
    wall_seconds: float
    trial_phase_seconds: float
    sequential_estimate_seconds: float | None
    speedup: float | None
    efficiency: float | None
    trial_phase_speedup: float | None
    trials: int
    finished: int
    stopped_early: int
    failed: int
    trials_per_hour: float
    samples: float
    samples_per_second: float
    best_value: float | None
    time_to_target_seconds: float | None
    # start-up, separated: once per slot (cold) and per trial on a warm slot
    slot_processes: int = 0
    cold_startup_seconds: float | None = None
    warm_trials: int = 0
    trial_overhead_seconds: float | None = None
    first_trial_overhead_seconds: float | None = None
    # what a shared cluster charges: the resources the mode held, for its wall time and to the target
    cpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    cpu_seconds_to_target: float | None = None
    gpu_seconds_to_target: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def trial_phase(mode: ModeRecord) -> tuple[float, float]:
    """(start, end) of the trial phase: first trial start to last trial end (measured)."""
    starts = [t.started for t in mode.trials if t.started is not None]
    ends = [t.finished for t in mode.trials if t.finished is not None]
    if not starts or not ends:
        return mode.started_at, mode.started_at + mode.wall_seconds
    return min(starts), max(ends)


def best_so_far(mode: ModeRecord) -> list[tuple[float, float]]:
    """(seconds since the mode started, best metric so far) at every epoch report."""
    events = sorted((e.time, e.value) for t in mode.trials for e in t.epochs)
    out, best = [], -math.inf
    for t, v in events:
        best = max(best, v)
        out.append((t - mode.started_at, best))
    return out


def _best(mode: ModeRecord) -> float | None:
    values = [e.value for t in mode.trials for e in t.epochs]
    return max(values) if values else None


def choose_target(modes: dict[str, ModeRecord], target: float | None) -> float | None:
    """``--target``, else the baseline's best, else the lowest best over the modes (reached by all)."""
    if target is not None:
        return target
    if BASELINE in modes and _best(modes[BASELINE]) is not None:
        return _best(modes[BASELINE])
    bests = [b for b in (_best(m) for m in modes.values()) if b is not None]
    return min(bests) if bests else None


def time_to_target(mode: ModeRecord, target: float | None) -> float | None:
    if target is None:
        return None
    times = [e.time for t in mode.trials for e in t.epochs if e.value >= target - 1e-12]
    return min(times) - mode.started_at if times else None


def _counts(trials: list[TrialRecord]) -> tuple[int, int, int]:
    failed = sum(t.status == "ERROR" for t in trials)
    stopped = sum(t.stopped_early and t.status != "ERROR" for t in trials)
    return len(trials) - failed - stopped, stopped, failed


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def startup_figures(mode: ModeRecord) -> dict[str, Any]:
    """Cold start-up per slot (each slot counted once) and per-trial overhead, warm and cold."""
    slots: dict[str, float] = {}
    for t in mode.trials:
        if t.slot is not None and t.group_startup is not None:
            slots.setdefault(t.slot, t.group_startup)
    warm = [t.overhead for t in mode.trials if t.warm and t.overhead is not None]
    cold = [t.overhead for t in mode.trials if t.warm is False and t.overhead is not None]
    return {
        "slot_processes": len(slots),
        "cold_startup_seconds": _mean(list(slots.values())),
        "warm_trials": sum(1 for t in mode.trials if t.warm),
        "trial_overhead_seconds": _mean(warm),
        "first_trial_overhead_seconds": _mean(cold),
    }


def held_resources(mode: ModeRecord, slots: int) -> tuple[float, float]:
    """CPUs and GPUs the mode held all along: its slots (the baseline: one)."""
    return slots * mode.cpus_per_worker, slots * mode.gpus_per_worker


def analyse(
    modes: dict[str, ModeRecord], *, slots: int, target: float | None = None
) -> tuple[float | None, list[ModeStats]]:
    """(target used, one ``ModeStats`` per mode, the baseline first)."""
    target = choose_target(modes, target)
    base = modes.get(BASELINE)
    rate = fixed = None
    if base is not None:
        start, end = trial_phase(base)
        samples = sum(t.samples for t in base.trials)
        if samples > 0:
            rate = (end - start) / samples
            fixed = max(base.wall_seconds - (end - start), 0.0)
    stats = []
    for name in sorted(modes, key=lambda n: (n != BASELINE, n)):
        mode = modes[name]
        start, end = trial_phase(mode)
        phase = max(end - start, 1e-9)
        samples = sum(t.samples for t in mode.trials)
        finished, stopped, failed = _counts(mode.trials)
        k = 1 if name == BASELINE else slots
        seq = speedup = eff = phase_speedup = None
        if rate is not None and fixed is not None:
            seq = fixed + rate * samples
            speedup = seq / mode.wall_seconds if mode.wall_seconds > 0 else None
            eff = speedup / k if speedup is not None else None
            phase_speedup = rate * samples / phase
        cpus, gpus = held_resources(mode, k)
        to_target = time_to_target(mode, target)
        stats.append(
            ModeStats(
                mode=name,
                slots=k,
                workers_per_trial=mode.workers_per_trial,
                concurrent_trials=mode.concurrent_trials,
                max_concurrent_observed=mode.max_concurrent_observed,
                global_batch=mode.global_batch,
                lr_scaling=mode.lr_scaling,
                scaling=mode.scaling,
                wall_seconds=mode.wall_seconds,
                trial_phase_seconds=phase,
                sequential_estimate_seconds=seq,
                speedup=speedup,
                efficiency=eff,
                trial_phase_speedup=phase_speedup,
                trials=len(mode.trials),
                finished=finished,
                stopped_early=stopped,
                failed=failed,
                trials_per_hour=len(mode.trials) / mode.wall_seconds * 3600 if mode.wall_seconds > 0 else 0.0,
                samples=samples,
                samples_per_second=samples / phase,
                best_value=_best(mode),
                time_to_target_seconds=to_target,
                **startup_figures(mode),
                cpu_seconds=cpus * mode.wall_seconds,
                gpu_seconds=gpus * mode.wall_seconds,
                cpu_seconds_to_target=None if to_target is None else cpus * to_target,
                gpu_seconds_to_target=None if to_target is None else gpus * to_target,
            )
        )
    return target, stats


def config_key(params: dict[str, Any]) -> tuple:
    """A comparable form of one configuration (values from YAML, CSV or MLflow strings)."""

    def norm(v: Any) -> Any:
        if isinstance(v, bool) or str(v) in ("True", "False", "true", "false"):
            return str(v).lower()
        try:
            return float(f"{float(v):.10g}")
        except (TypeError, ValueError):
            return str(v)

    return tuple(sorted((k, norm(v)) for k, v in params.items() if v not in (None, "")))


def same_configurations(modes: dict[str, ModeRecord]) -> bool:
    """Did every (non-baseline) mode run exactly the same multiset of configurations?"""
    keys = [sorted(config_key(t.params) for t in m.trials) for n, m in modes.items() if n != BASELINE]
    return all(k == keys[0] for k in keys)
