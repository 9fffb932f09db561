"""Pictures and the written report of a comparison (PNG, Markdown, self-contained HTML)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from distmis.compare._analysis import BASELINE, ModeStats, best_so_far, config_key, trial_phase
from distmis.compare._records import ModeRecord
from distmis.metrics import VAL_DICE

COLORS = {
    "baseline": "#7f7f7f",
    "experiment": "#1f77b4",
    "data": "#d62728",
    "hybrid": "#2ca02c",
    "data-lr": "#ff9896",
    "hybrid-lr": "#98df8a",
}


def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    from distmis import __version__
    from distmis.files import atomic_file

    with atomic_file(path, own_directory=True) as tmp:
        fig.savefig(tmp, dpi=100, format="png", metadata={"Software": f"distmis compare {__version__}"})
    _plt().close(fig)
    return path


def plot_best_so_far(modes: dict[str, ModeRecord], target: float | None, path: Path) -> Path:
    """Best-so-far metric against wall time since each mode started."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5.0))
    metric = next(iter(modes.values())).metric if modes else VAL_DICE
    for name, mode in modes.items():
        curve = best_so_far(mode)
        if curve:
            xs, ys = zip(*curve, strict=True)
            ax.step(
                xs,
                ys,
                where="post",
                label=f"{name} (best {ys[-1]:.3f}, wall {mode.wall_seconds:.0f} s)",
                color=COLORS.get(name),
                linewidth=2 if name != BASELINE else 1.2,
                linestyle="--" if name == BASELINE else "-",
            )
    if target is not None:
        ax.axhline(target, color="black", linewidth=0.8, linestyle=":", label=f"target {target:.3f}")
    ax.set_xlabel("wall time since the mode started (s)")
    ax.set_ylabel(f"best {metric} so far")
    ax.set_title("Best-so-far accuracy against wall time")
    # below the axes: inside them it hid the curves it names
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_speedup(stats: list[ModeStats], path: Path) -> Path:
    """Speed-up over the sequential baseline against workers per trial, with the accuracy reached."""
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    modes = [s for s in stats if s.mode != BASELINE]
    k = max((s.slots for s in modes), default=1)
    for s in modes:
        if s.speedup is None:
            continue
        ax.scatter(
            [s.workers_per_trial],
            [s.speedup],
            s=60,
            color=COLORS.get(s.mode),
            zorder=3,
            label=f"{s.mode}: {s.speedup:.2f}x (eff. {s.efficiency:.2f})",
        )
        ax.scatter([s.workers_per_trial], [s.trial_phase_speedup], s=40, marker="x", color=COLORS.get(s.mode), zorder=3)
    ax.axhline(k, color="black", linestyle=":", linewidth=0.8, label=f"ideal: {k} slots")
    ax.axhline(1, color="grey", linewidth=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"workers per trial (k = {k} slots in every mode)")
    ax.set_ylabel("speed-up vs sequential 1 worker")
    ax.set_title("Speed-up (o end to end, x trial phase)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    names = [s.mode for s in stats]
    ax2.bar(names, [s.best_value or 0 for s in stats], color=[COLORS.get(n, "grey") for n in names])
    for i, s in enumerate(stats):
        ax2.text(
            i,
            (s.best_value or 0) + 0.01,
            f"{s.best_value:.3f}" if s.best_value is not None else "-",
            ha="center",
            fontsize=8,
        )
    ax2.set_ylim(0, 1.08)
    ax2.set_title("Best validation metric reached", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _assign_slots(intervals: list[tuple[float, float, int]], slots: int) -> list[list[int]]:
    """Give each (start, end, width) interval ``width`` worker slots free at its start (greedy).

    The slots are a reconstruction: Ray does not pin trials to numbered slots, but the
    measured intervals and widths determine a valid packing, which is what the picture shows.
    """
    free_at = [-math.inf] * max(slots, 1)
    out = []
    for start, end, width in intervals:
        order = sorted(range(len(free_at)), key=lambda i: (free_at[i] > start + 1e-6, i))
        chosen = order[:width]
        for i in chosen:
            free_at[i] = end
        out.append(sorted(chosen))
    return out


def plot_timeline(modes: dict[str, ModeRecord], points: list[dict[str, Any]], slots: int, path: Path) -> Path:
    """Which configuration ran on which worker slot when, per mode (colour = configuration)."""
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    index = {config_key(p): i for i, p in enumerate(points)}
    fig, axes = plt.subplots(
        len(modes),
        1,
        figsize=(
            9,
            1.2
            + 1.0 * sum(max(m.workers_per_trial * m.concurrent_trials, 1) for m in modes.values()) * 0.45
            + len(modes) * 0.6,
        ),
        squeeze=False,
        sharex=True,
    )
    x_max = max((max(m.wall_seconds, trial_phase(m)[1] - m.started_at) for m in modes.values()), default=1.0) * 1.02
    for ax, (name, mode) in zip(axes[:, 0], modes.items(), strict=True):
        spans = sorted(
            ((t.started, t.finished, t) for t in mode.trials if t.started is not None and t.finished is not None),
            key=lambda span: (span[0], span[1]),
        )
        width = mode.workers_per_trial
        lanes = _assign_slots([(s, f, width) for s, f, _ in spans], 1 if name == BASELINE else slots)
        for (started, finished, t), lane in zip(spans, lanes, strict=True):
            i = index.get(config_key(t.params), -1)
            for slot in lane:
                ax.barh(
                    slot,
                    finished - started,
                    left=started - mode.started_at,
                    height=0.8,
                    color=cmap(i % 20) if i >= 0 else "grey",
                    edgecolor="black",
                    linewidth=0.4,
                    hatch="//" if t.stopped_early else None,
                )
                ax.text(started - mode.started_at + 0.2, slot, f"c{i}", va="center", fontsize=7)
        start, end = trial_phase(mode)
        ax.axvline(start - mode.started_at, color="grey", linewidth=0.6)
        ax.axvline(end - mode.started_at, color="grey", linewidth=0.6)
        ax.set_ylabel(f"{name}\nslot", fontsize=8)
        n_slots = 1 if name == BASELINE else slots
        ax.set_yticks(range(n_slots))
        ax.set_ylim(-0.6, n_slots - 0.4)
        ax.set_xlim(0, x_max)  # one time axis for every mode: lengths compare directly
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the mode started (c<i> = configuration i; hatched = stopped early)")
    fig.suptitle("Utilisation: configurations on worker slots over time", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def make_plots(
    modes: dict[str, ModeRecord],
    stats: list[ModeStats],
    target: float | None,
    points: list[dict[str, Any]],
    slots: int,
    directory: Path,
) -> list[Path]:
    return [
        plot_best_so_far(modes, target, directory / "best_so_far.png"),
        plot_speedup(stats, directory / "speedup.png"),
        plot_timeline(modes, points, slots, directory / "timeline.png"),
    ]


# --------------------------------------------------------------------------- written report
def _fmt(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{spec}}{suffix}"


COLUMNS = (
    "mode",
    "trials x workers",
    "global batch",
    "lr scaling",
    "wall s",
    "speed-up",
    "efficiency",
    "trial-phase speed-up",
    "trials/h",
    "samples/s",
    "time to target s",
    "best",
    "finished / stopped / failed",
    "max concurrent seen",
    "cold start-up s per slot (slots)",
    "per-trial overhead s, warm (cold)",
    "CPU-s held",
    "CPU-s to target",
    "GPU-s held",
)


def table_rows(stats: list[ModeStats]) -> list[list[str]]:
    rows = []
    for s in stats:
        rows.append(
            [
                s.mode,
                f"{s.concurrent_trials} x {s.workers_per_trial}",
                str(s.global_batch),
                s.lr_scaling,
                _fmt(s.wall_seconds, ".1f"),
                _fmt(s.speedup, ".2f", "x"),
                _fmt(s.efficiency, ".2f"),
                _fmt(s.trial_phase_speedup, ".2f", "x"),
                _fmt(s.trials_per_hour, ".0f"),
                _fmt(s.samples_per_second, ".1f"),
                _fmt(s.time_to_target_seconds, ".1f") if s.time_to_target_seconds is not None else "not reached",
                _fmt(s.best_value, ".4f"),
                f"{s.finished} / {s.stopped_early} / {s.failed}",
                str(s.max_concurrent_observed),
                f"{_fmt(s.cold_startup_seconds, '.1f')} ({s.slot_processes})",
                f"{_fmt(s.trial_overhead_seconds, '.2f')} ({_fmt(s.first_trial_overhead_seconds, '.2f')})",
                _fmt(s.cpu_seconds, ".0f"),
                _fmt(s.cpu_seconds_to_target, ".0f"),
                _fmt(s.gpu_seconds, ".0f"),
            ]
        )
    return rows


def headline(s: ModeStats, metric: str, target: float | None) -> str:
    """One sentence per mode: every speed figure next to the accuracy reached."""
    speed = (
        f"{s.speedup:.2f}x the sequential baseline (efficiency {s.efficiency:.2f} on {s.slots} slots)"
        if s.speedup is not None
        else "no baseline to compare with"
    )
    reach = (
        f"reached {metric} {target:.3f} after {s.time_to_target_seconds:.1f} s"
        if s.time_to_target_seconds is not None and target is not None
        else f"did not reach {metric} {target:.3f}"
        if target is not None
        else "no target"
    )
    best = f"best {metric} {s.best_value:.4f}" if s.best_value is not None else f"no {metric}"
    return f"**{s.mode}** ({s.concurrent_trials} trial(s) x {s.workers_per_trial} worker(s)): {speed}; {best}; {reach}."


def write_reports(
    out: Path,
    *,
    name: str,
    stats: list[ModeStats],
    target: float | None,
    metric: str,
    setup: dict[str, Any],
    plots: list[Path],
) -> tuple[Path, Path]:
    from distmis.reports import write_report

    rows = table_rows(stats)
    scaling = {s.mode: f"{s.scaling} scaling, global batch {s.global_batch}, lr scaling {s.lr_scaling}" for s in stats}
    notes = [
        f"Same resources in every mode: {setup['slots']} worker slots of {setup['cpus_per_worker']:g} CPU / "
        f"{setup['gpus_per_worker']:g} GPU. Same configurations: {setup['budget']} fixed in advance "
        f"({'identical in every mode: yes' if setup['same_configurations'] else 'NOT identical: see comparison.json'}).",
        f"Baseline: the first {setup['baseline_trials']} configuration(s), one at a time on one worker. Speed-up = "
        "estimated sequential time for the same training samples / the mode's wall time (see comparison.json: "
        "sequential_estimate_seconds); efficiency = speed-up / slots.",
        f"Target {metric}: {_fmt(target, '.4f')} ({setup['target_source']}).",
        *(
            [
                "Slots share cores here (cpus_per_worker < 1): the baseline's single worker ran alone and had a whole "
                "core, so speed-ups over it are understated on this host."
            ]
            if setup["cpus_per_worker"] < 1
            else []
        ),
        "Start-up is counted apart from the trials: every mode keeps its slots warm (one process per "
        "single-worker slot, one worker group per multi-worker trial slot, reused across trials); 'cold start-up' "
        "is paid once per slot, 'per-trial overhead' is a trial's own set-up on a warm slot (first epoch's end - "
        "trial start - that epoch's time). Warm trials per mode: "
        + ", ".join(f"{s.mode} {s.warm_trials}/{s.trials}" for s in stats)
        + ".",
        "Resources held: slots x CPUs (GPUs) per slot for the mode's wall time, and to the target: what a "
        "shared cluster charges.",
        "Scaling per mode: " + "; ".join(f"{m}: {v}" for m, v in scaling.items()) + ". Strong scaling: an epoch is "
        "one pass over the training cases, so more workers take fewer, larger steps; weak scaling: fixed "
        "steps_per_epoch, so more workers process more samples per epoch.",
    ]
    return write_report(
        out,
        title=f"distmis compare: {name}",
        headlines=[headline(s, metric, target) for s in stats],
        columns=COLUMNS,
        rows=rows,
        notes=notes,
        plots=plots,
    )
