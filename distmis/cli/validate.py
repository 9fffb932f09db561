"""Check a configuration / search-space file without running it: the YAML, every value the
search space can sample, the search settings, and the data it would train on (shape, splits)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distmis.config import ExperimentConfig, SearchConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    from distmis.cli._common import ConfigKeysHelp

    p.formatter_class = ConfigKeysHelp
    p.add_argument("config", help="YAML file")
    p.add_argument("--train-only", action="store_true", help="a `distmis train` config: an empty space is fine")
    p.add_argument("--no-data", action="store_true", help="do not read the data source (shape, split sizes)")


def run(args: argparse.Namespace) -> int:
    from distmis.config import load_config
    from distmis.preflight import preflight

    cfg = load_config(args.config, require_space=not args.train_only)
    facts = preflight(cfg, path=args.config, base_dir=Path(args.config).resolve().parent, check_data=not args.no_data)
    if cfg.space:
        print(describe_space(cfg))
    print(describe_recipe(cfg))
    if facts is not None:
        print(
            f"  data: {facts.source}: volumes {list(facts.shape)}, {facts.train} training / {facts.val} validation cases"
        )
    print(f"{args.config}: valid")
    return 0


def describe_recipe(config: ExperimentConfig) -> str:
    """The training recipe each trial gets (loss as resolved for the label mode, schedule, patches)."""
    from distmis.model import resolve_loss

    t = config.train
    mode = config.data.prepare.label_mode
    loss = resolve_loss(t.loss, mode)
    loss_text = f"{loss} (auto for {mode} labels)" if t.loss == "auto" else loss
    schedule = t.lr_schedule + (f" after {t.warmup_epochs} warm-up epoch(s)" if t.warmup_epochs else "")
    patches = f"patch {list(t.patch)}" if t.patch else "whole volumes"
    return (
        f"  training: {t.epochs} epochs, loss {loss_text}, lr schedule {schedule}, {patches}, "
        f"{t.foreground_oversampling:.0%} of patches on foreground"
    )


def _describe_sampler(s: SearchConfig) -> str:
    """TPE's random start-up at the file's concurrency, or at the scales it may run at when the
    cluster decides it (:meth:`~distmis.config.SearchConfig.sampler_startup_trials`): a search of few
    rounds at cluster scale samples every trial at random."""

    from distmis.config import MODEL_SAMPLERS

    model = MODEL_SAMPLERS[s.algorithm]

    def at(k: int) -> str:
        startup = s.sampler_startup_trials(k)
        if startup >= s.num_samples:
            return f"all {s.num_samples} trials random (random search)"
        return f"{model} after {startup} random start-up trials"

    if s.startup_trials or s.max_concurrent_trials:
        return f"{s.algorithm} ({at(s.max_concurrent_trials or 1)})"
    scales = "; ".join(f"{k} at once: {at(k)}" for k in (1, 8, 32, 128))
    return f"{s.algorithm} (the concurrency decides: {scales})"


def describe_space(config: ExperimentConfig) -> str:
    """What the search will do: algorithm, budget, metric, and every parameter with the field it sets."""
    from distmis.config import MODEL_SAMPLERS, resolve_param_name
    from distmis.space import grid_points, ordered_params

    s = config.search
    scheduler = (
        "no scheduler"
        if s.scheduler.type == "none"
        else f"ASHA (grace {s.scheduler.grace_period}, factor {s.scheduler.reduction_factor:g}, "
        f"{s.scheduler.brackets} bracket(s))"
    )
    if s.algorithm in ("gp", "cmaes") and s.scheduler.type != "none":
        # Optuna's GP and CMA-ES model only complete trials, so a trial ASHA stops teaches them nothing
        scheduler += f"; {MODEL_SAMPLERS[s.algorithm]} models only the trials it lets train every epoch"
    algorithm = _describe_sampler(s) if s.algorithm in MODEL_SAMPLERS else s.algorithm
    deadline = f", stopped at {s.time_budget}" if s.time_budget else ""
    lines = [
        f"search '{config.name}': {algorithm}, {config.planned_trials()} trials{deadline}, {scheduler}, "
        f"metric {s.metric} ({s.mode}), parallelism {config.parallelism.mode}"
    ]
    for name in ordered_params(config.space):
        spec = config.space[name]
        dist = getattr(spec, spec.kind)
        cond = f"  when {spec.when}" if spec.when else ""
        lines.append(f"  {name:<12} -> {resolve_param_name(name):<22} {spec.kind} {dist}{cond}")
    if s.algorithm == "points":
        lines.append(f"  fixed configurations: {len(s.points or [])}")
    elif s.points:
        lines.append(f"  starting points: {len(s.points)} (tried first, then the sampler's own)")
    if s.algorithm == "grid":
        lines.append(f"  grid size: {len(grid_points(config.space))}")
    if config.finalize.described():
        lines.append(f"  then distmis finalize with {config.finalize.described()} (the file's finalize section)")
    return "\n".join(lines)
