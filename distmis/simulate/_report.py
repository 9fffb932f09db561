"""How a search found its best: time and compute to a target, best so far at fractions of a horizon, over seeds.

One reading for real searches (``benchmarks/search_efficiency.py`` reads them from their run
directories) and simulated ones (:func:`~distmis.simulate.simulate_search`), so that the two are
compared figure by figure. A run is ``{"events": [(seconds, signed value)], "intervals": [(start,
end)], "wall", "epochs", "trials", "sign"}``, times from the first trial's start; the sign makes
larger better whatever the search's mode.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

FRACTIONS = (0.25, 0.5, 1.0)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """Median and interquartile range (linear interpolation; an infinite value stays infinite)."""
    xs = sorted(values)
    if not xs:
        return math.nan, math.nan, math.nan

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        if xs[lo] == xs[hi]:
            return xs[lo]
        if math.isinf(xs[hi]):
            return math.inf if pos > lo else xs[lo]
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return q(0.5), q(0.25), q(0.75)


def fmt_stat(median: float, q1: float, q3: float, digits: int, *, infinite: str = "inf") -> str:
    """``median [q1-q3]``; an infinite value is written ``infinite`` (what it means in its column:
    a target never reached, a best not yet reported)."""

    def f(x: float) -> str:
        return infinite if math.isinf(x) else "-" if math.isnan(x) else f"{x:.{digits}f}"

    return f"{f(median)} [{f(q1)}-{f(q3)}]"


def best_so_far(events: list[tuple[float, float]], at: float) -> float:
    best = -math.inf
    for t, v in events:
        if t > at:
            break
        best = max(best, v)
    return best


def time_to(events: list[tuple[float, float]], target: float) -> float:
    return next((t for t, v in events if v >= target), math.inf)


def compute_until(intervals: list[tuple[float, float]], at: float) -> float:
    return sum(max(0.0, min(end, at) - start) for start, end in intervals if start < at)


def auc(events: list[tuple[float, float]], horizon: float, floor: float) -> float:
    """Mean of the best-so-far curve over [0, horizon] (``floor`` before the first result)."""
    area, last_t, best = 0.0, 0.0, floor
    for t, v in events:
        if t > horizon:
            break
        area += (t - last_t) * best
        last_t, best = t, max(best, v)
    area += (horizon - last_t) * best
    return area / horizon


def horizon_of(runs: dict[str, dict[Any, dict]], reference: str | None) -> tuple[float, str]:
    """The time the fractions refer to: the reference method's median wall time, else the longest run's."""
    walls = [r["wall"] for r in runs.get(reference or "", {}).values()]
    if walls:
        return quartiles(walls)[0], f"{reference}'s median wall time"
    return max(r["wall"] for m in runs.values() for r in m.values()), "the longest run"


def analyse(
    runs: dict[str, dict[Any, dict]],
    target: float,
    sign: float,
    *,
    horizon_from: str | None = "grid",
    horizon: tuple[float, str] | None = None,
) -> dict[str, Any]:
    """Per method and seed, and per method as median and IQR: time and compute to ``target``, best at
    fractions of the horizon, the best-so-far curve's mean over it (AUC), the work done.

    The horizon is ``horizon`` (seconds, its description) where given, else ``horizon_from``'s
    median wall time (:func:`horizon_of`)."""
    horizon_seconds, horizon_text = horizon or horizon_of(runs, horizon_from)
    signed_target = sign * target
    floor = min(v for m in runs.values() for r in m.values() for _, v in r["events"][:1])
    table: dict[str, Any] = {
        "horizon_seconds": horizon_seconds,
        "horizon": horizon_text,
        "target": target,
        "methods": {},
    }
    for method, seeds in runs.items():
        per_seed = {}
        for seed, r in seeds.items():
            ttt = time_to(r["events"], signed_target)
            per_seed[seed] = {
                "time_to_target": ttt,
                "compute_to_target": compute_until(r["intervals"], ttt) if math.isfinite(ttt) else math.inf,
                **{f"best_at_{int(f * 100)}": sign * best_so_far(r["events"], f * horizon_seconds) for f in FRACTIONS},
                "auc": sign * auc(r["events"], horizon_seconds, floor),
                "best": sign * max(v for _, v in r["events"]),
                "compute": compute_until(r["intervals"], math.inf),
                "epochs": r["epochs"],
                "trials": r["trials"],
                "wall": r["wall"],
                "reached": math.isfinite(ttt),
            }
        summary: dict[str, Any] = {}
        for key in next(iter(per_seed.values())):
            if key == "reached":
                summary[key] = sum(s[key] for s in per_seed.values())
                continue
            med, lo, hi = quartiles([s[key] for s in per_seed.values()])
            summary[key] = {"median": med, "q1": lo, "q3": hi}
        table["methods"][method] = {"seeds": per_seed, "summary": summary}
    return table


def _fmt(stat: dict[str, float], digits: int, *, infinite: str = "inf") -> str:
    return fmt_stat(stat["median"], stat["q1"], stat["q3"], digits, infinite=infinite)


def table_text(table: dict[str, Any], metric: str, *, baseline: str = "default") -> str:
    """The table as Markdown, with each method's median time to target against ``baseline``'s."""
    h = table["horizon_seconds"]
    lines = [
        f"target {metric} {table['target']:.4g}; horizon = {table['horizon']} {h:.1f} s; "
        "median [IQR] over seeds; times from the first trial's start",
        "",
        "| method | reached | time to target (s) | compute to target (trial-s) | best @25% | best @50% | best @100% "
        "| AUC | compute (trial-s) | epochs | trials | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, m in table["methods"].items():
        s = m["summary"]
        lines.append(
            f"| {method} | {s['reached']}/{len(m['seeds'])} | {_fmt(s['time_to_target'], 1, infinite='never')} | "
            f"{_fmt(s['compute_to_target'], 0, infinite='never')} | {_fmt(s['best_at_25'], 4, infinite='not yet')} | "
            f"{_fmt(s['best_at_50'], 4, infinite='not yet')} | "
            f"{_fmt(s['best_at_100'], 4, infinite='not yet')} | {_fmt(s['auc'], 4)} | {_fmt(s['compute'], 0)} | {_fmt(s['epochs'], 0)} | "
            f"{_fmt(s['trials'], 0)} | {_fmt(s['wall'], 1)} |"
        )
    methods = table["methods"]
    if baseline in methods:
        d = methods[baseline]["summary"]["time_to_target"]["median"]
        comparisons = [
            f"{baseline} / {other}: median time to target {d:.1f} / {o:.1f} s = {d / o:.2f}"
            for other in methods
            if other != baseline and math.isfinite(o := methods[other]["summary"]["time_to_target"]["median"]) and o > 0
        ]
        if comparisons:
            lines += ["", *comparisons]
    return "\n".join(lines)


def plot(runs: dict[str, dict[Any, dict]], table: dict[str, Any], path: Path, metric: str, *, title: str) -> None:
    """Median best-so-far against time per method, IQR shaded, written (atomically) to ``path``."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from distmis.files import atomic_file

    longest = max(r["wall"] for m in runs.values() for r in m.values())
    ts = np.linspace(0, longest, 300)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for method, seeds in runs.items():
        curves = []
        for r in seeds.values():
            sign = r["sign"]
            # a run that has ended keeps its final best: its median does not drop when it stops
            curves.append([sign * best_so_far(r["events"], t) for t in ts])
        arr = np.array(curves, dtype=float)
        arr[~np.isfinite(arr)] = np.nan
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a time no seed has reached yet is an all-NaN column
            med = np.nanmedian(arr, axis=0)
            lo, hi = np.nanpercentile(arr, 25, axis=0), np.nanpercentile(arr, 75, axis=0)
        (line,) = ax.plot(ts, med, label=f"{method} ({len(seeds)} seeds)")
        ax.fill_between(ts, lo, hi, color=line.get_color(), alpha=0.15)
    ax.axhline(table["target"], color="grey", ls="--", lw=1, label=f"target {table['target']:.4g}")
    ax.axvline(table["horizon_seconds"], color="grey", ls=":", lw=1, label=table["horizon"])
    ax.set(xlabel="seconds since the first trial started", ylabel=f"best {metric} so far", title=title)
    lows = [s["best_at_25"] for m in table["methods"].values() for s in m["seeds"].values()]
    finite = [v for v in lows if math.isfinite(v)]
    if finite:
        ax.set_ylim(max(0.0, min(finite) - 0.05), min(1.0, max(table["target"] + 0.03, ax.get_ylim()[1])))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    with atomic_file(Path(path)) as tmp:
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": "distmis"})
    plt.close(fig)


def finite_json(value: Any) -> Any:
    """JSON has no infinity: a target never reached is written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


__all__ = [
    "FRACTIONS",
    "analyse",
    "auc",
    "best_so_far",
    "compute_until",
    "finite_json",
    "fmt_stat",
    "horizon_of",
    "plot",
    "quartiles",
    "table_text",
    "time_to",
]
