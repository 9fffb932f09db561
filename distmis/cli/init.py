"""Write a search file for an MSD dataset, planned from its fingerprint by stated rules.

Reads every training case once (as `distmis inspect` does), then chooses the prepared shape, the
patch and batch for the memory given, the label mode and loss, the normalisation, the recipe
(distmis's by default, nnU-Net's with --recipe nnunet; the recipe's own configuration is the
search's first point) and how the time budget is spent, each with a comment saying which rule
gave it. With --budget, the planned network's training steps are timed on this machine for a few
seconds (or --step-seconds gives the time of one step on the machine the search will run on).
Search the file with `distmis tune FILE`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distmis.cli._common import positive_float, positive_int


def _duration(text: str) -> str:
    from distmis.config import parse_duration

    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def add_arguments(p: argparse.ArgumentParser) -> None:
    from distmis.recipes import DEFAULT_RECIPE, RECIPES

    p.add_argument("dataset", help="MSD dataset directory (holding dataset.json)")
    p.add_argument(
        "--gpu-memory",
        type=positive_float,
        default=None,
        help="memory of each GPU in GiB: plan the patch for it and one GPU per trial (default: a CPU search)",
    )
    p.add_argument(
        "--budget",
        type=_duration,
        default=None,
        help="wall time of the search (e.g. 5m, 30m, 24h): trials, epochs and steps are sized to it and the "
        "search stops at it (default: 8 trials of 12 epochs, no deadline)",
    )
    p.add_argument(
        "--finalize",
        action="store_true",
        help="the budget pays for distmis finalize too: the search gets half of it, and the file's finalize "
        "section cross-validates the best configuration in the other half (needs --budget)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="trials at once: GPUs with --gpu-memory, else CPU slots sharing this machine's cores (default 1 GPU, "
        "2 CPU); with --budget on a CPU, fewer where each would get under 1,000 steps (250 with --finalize) "
        "and, timed, the fewer step at least two thirds as much in all",
    )
    p.add_argument(
        "--step-seconds",
        type=positive_float,
        default=None,
        help="seconds of one training step of the recipe's network, at the planned batch, on the machine the "
        "search will run on "
        "(default: timed here over a few seconds of steps; needed for a GPU plan made on a machine without one)",
    )
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default=DEFAULT_RECIPE,
        help=f"the training recipe the search starts from (default {DEFAULT_RECIPE}): see distmis.recipes",
    )
    p.add_argument("--out", default=None, help="the search file to write (default <dataset name>.yaml here)")
    p.add_argument("--overwrite", action="store_true", help="replace a file distmis init wrote earlier")
    p.add_argument(
        "--processes", type=positive_int, default=None, help="processes reading the cases (default: all cores)"
    )


def run(args: argparse.Namespace) -> int:
    from distmis.config import parse_duration
    from distmis.console import progress_bar as progress
    from distmis.data import INIT_HEADER as HEADER
    from distmis.data import (
        PlanOptions,
        dataset_text,
        fingerprint,
        plan_search,
        read_dataset_json,
        relative_source,
        unplannable,
    )
    from distmis.exceptions import ConfigError, DataError, OutputError
    from distmis.files import atomic_file
    from distmis.links import refuse_link

    dataset = Path(args.dataset)
    meta = read_dataset_json(dataset)  # a missing or malformed dataset.json: one line, before any work
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset.resolve().name).lstrip("._-") or "search"
    out = Path(args.out or f"{name}.yaml")
    refuse_link(out, what="the search file")
    if out.resolve().is_relative_to(dataset.resolve()):
        raise OutputError(f"--out {out}: inside the dataset {dataset}; distmis never writes into its inputs")
    if out.exists():
        if out.is_dir():
            raise OutputError(f"--out {out}: a directory; give a file name")
        if not args.overwrite:
            raise OutputError(f"--out {out}: exists; give --overwrite to replace it, or another --out")
        if not out.read_text(errors="replace").startswith(HEADER):
            raise OutputError(f"--out {out}: not written by distmis init; it is left as it is (choose another --out)")
    budget = parse_duration(args.budget) if args.budget else None
    if args.finalize and budget is None:
        raise ConfigError("--finalize: give --budget too; it splits a budget between the search and finalize")
    if budget is not None and args.gpu_memory is not None and args.step_seconds is None and not _has_gpu():
        raise ConfigError(
            "--budget with --gpu-memory: this machine has no GPU to time a step on; give --step-seconds "
            "(one training step of the planned network on the search's GPUs)"
        )
    with progress("reading cases") as update:
        fp = fingerprint(dataset, workers=args.processes, progress=update)
    reason = unplannable(fp)
    if reason:
        raise DataError(f"{dataset}: {reason}")
    options = PlanOptions(
        gpu_memory_gb=args.gpu_memory,
        recipe=args.recipe,
        budget_seconds=budget,
        budget_text=args.budget,
        finalize=args.finalize,
        concurrency=args.workers,
        cores=os.cpu_count() or 1,
        step_seconds=_step_timer(args, fp, channels=len(meta.modalities)) if budget is not None else None,
        step_timed=args.step_seconds is None,
    )
    text = plan_search(
        fp,
        source=_yaml_string(relative_source(dataset, out)),
        name=name,
        modalities=list(meta.modalities),
        options=options,
    )
    with atomic_file(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
        _check(tmp, out, ConfigError)
    for warning in fp["warnings"]:
        print(f"distmis: warning: {warning}")
    print(f"wrote {out}: {dataset_text(fp['dataset'])}, {fp['cases']} cases; search it with: distmis tune {out}")
    return 0


def _yaml_string(value: str) -> str:
    """A path as a YAML scalar that reads back unchanged whatever it holds (``#``, ``:``, spaces)."""
    return json.dumps(value)


def _check(tmp: Path, out: Path, error: type[Exception]) -> None:
    """The planned file must load as a search (a rule that wrote an invalid value is a bug, named here)."""
    from distmis.config import load_config
    from distmis.exceptions import DistmisError

    try:
        load_config(tmp, require_space=True)
    except DistmisError as exc:
        raise error(f"{out}: the planned search file does not load ({exc}); please report this") from None


def _has_gpu() -> bool:
    from distmis.tensorflow_env import import_tensorflow

    return bool(import_tensorflow().config.list_physical_devices("GPU"))


def _step_timer(
    args: argparse.Namespace, fp: dict[str, Any], *, channels: int
) -> Callable[[int, tuple, int, int], float]:
    """(filters, patch, batch, trials at once) -> seconds of one training step: ``--step-seconds`` for the
    recipe's own width at the planned patch (scaled to a narrower one here, to a smaller patch by the
    plan), else timed here with the threads a trial will get when that many trials step at once."""
    from distmis.console import notify
    from distmis.training import TIMED_SECONDS

    given = args.step_seconds
    cache: dict[tuple[int, tuple, int, int], float] = {}

    def seconds(filters: int, patch: tuple, batch: int, at_once: int) -> float:
        if given is not None:
            return float(given) if filters == _recipe_filters(args.recipe) else _scaled(given, filters, args.recipe)
        key = (filters, tuple(patch), batch, at_once)
        if key not in cache:
            together = f"; {at_once} trials at once" if at_once > 1 else ""
            notify(
                f"distmis: timing training steps ({filters} filters, patch {list(patch)}, batch {batch}{together})"
                f" on this machine for {TIMED_SECONDS:.0f} s"
            )
            cache[key] = _measure(args, fp, filters, tuple(patch), channels, batch, at_once)
        return cache[key]

    return seconds


def _recipe_filters(recipe: str) -> int:
    from distmis.recipes import RECIPES

    return int(RECIPES[recipe].model["filters"])


def _scaled(given: float, filters: int, recipe: str) -> float:
    """A narrower network's step from the given one's, by the ratio of their convolutions' work."""
    return given * (filters / _recipe_filters(recipe)) ** 2


def _measure(
    args: argparse.Namespace, fp: dict[str, Any], filters: int, patch: tuple, channels: int, batch: int, at_once: int
) -> float:
    """A step of the planned network, timed as the planned trials will step it: as many processes at
    once as trials will run at once on this machine's CPUs (one process for a GPU plan)."""
    from distmis.data import plan_topology
    from distmis.exceptions import TrainingError
    from distmis.recipes import RECIPES
    from distmis.training import measure_recipe_step_seconds

    recipe = RECIPES[args.recipe]
    gpu = args.gpu_memory is not None
    topology = plan_topology(recipe, fp)
    levels = {} if topology.pools is None else {"pools": topology.pools, "kernels": topology.kernels}
    try:
        return measure_recipe_step_seconds(
            recipe,
            depth=topology.depth,
            trials_at_once=at_once,
            gpu=gpu,
            patch=patch,
            channels=channels,
            classes=len(fp["labels"]) + 1 if len(fp["labels"]) > 1 else 1,
            changes={"filters": filters, **levels},
            batch=batch,
        )
    except RuntimeError as exc:
        raise TrainingError(f"{args.dataset}: {exc}; give --step-seconds instead") from None
