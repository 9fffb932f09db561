"""A search file planned from a dataset's fingerprint, by stated rules (``distmis init``).

nnU-Net plans a configuration from the dataset's fingerprint instead of asking users to edit
one made for other data; this does the same for a search. Each choice is a rule applied to the
fingerprint, and the file says which rule gave it, in a comment beside the value, so that a
user can see why and change it knowingly.

The rules (the recipe's evidence is ``benchmarks/recipe.py`` on the MNI152 anatomy task):

- **shape**: the median case shape rounded up to a multiple of 2^(depth-1); cases whose spacing
  differs from the median are resampled, the others cropped or padded;
- **depth**: one level per halving of the volume's smallest side while the deepest maps keep
  16 voxels, 3 to 5 (3 at 64³);
- **patch**: the whole prepared volume when its estimated training memory fits the budget
  (``--gpu-memory``, or 4 GiB of host memory for a CPU), else the largest axis shrunk first;
  batch 2 (nnU-Net's); a third of the patches centred on foreground when a patch is smaller
  than the volume;
- **labels**: one foreground label -> binary and Dice; several -> multi-class and Dice +
  cross-entropy (thin structures need the per-voxel term); BraTS's three nested tumour labels ->
  the regions WT, TC and ET, as BraTS scores them;
- **normalisation**: CT channels by the training foreground's range, others z-scored per case;
  group normalisation in the network (batch statistics of two 3D patches are noise);
- **optimiser**: Adam, learning rate searched on a log scale over 1e-3 .. 2e-2 (what the
  recipe's searches select from on both tasks), and beta_2;
- **budget**: 8 trials of 12 epochs; no early stopping at that size (every trial finishes; ASHA
  pays off once there are more trials than the budget can finish).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmis.data._inspect import activation_bytes

#: the first line of every file ``distmis init`` writes (what ``--overwrite`` may replace)
HEADER = "# written by distmis init"
#: the memory a CPU-only search plans a patch for, per trial
CPU_BUDGET_GB = 4.0
TRIALS, EPOCHS, BATCH, FILTERS = 8, 12, 2, 8


def _depth(smallest_side: int) -> int:
    """One level per halving of the patch's smallest side while the deepest maps stay >= 16 voxels."""
    return max(3, min(5, int(math.log2(max(smallest_side, 16) / 16)) + 1))


def _patch(shape: list[int], *, budget_gb: float, depth: int, channels: int) -> list[int]:
    """The whole volume if it fits the budget, else shrink the largest axis, one divisor at a time."""
    divisor = 2 ** (depth - 1)
    patch = list(shape)

    def fits(p: list[int]) -> bool:
        need = activation_bytes(tuple(p), depth=depth, filters=FILTERS, batch=BATCH, channels=channels)  # type: ignore[arg-type]
        return need <= budget_gb * 2**30

    while not fits(patch) and max(patch) > divisor:
        axis = patch.index(max(patch))
        patch[axis] -= divisor
    return patch


def _is_brats(labels: dict[str, Any]) -> bool:
    """Labels 1, 2, 3 named as BraTS's nested tumour sub-regions (MSD Task01 and its copies)."""
    names = {v: str(row["name"]).lower() for v, row in labels.items()}
    return (
        set(names) == {"1", "2", "3"}
        and "edema" in names["1"]
        and any(w in names["2"] for w in ("non-enhancing", "necrotic", "core"))
        and "enhancing" in names["3"]
    )


@dataclass(frozen=True)
class _Plan:
    """Every choice, decided from the fingerprint before any text is written."""

    fp: dict[str, Any]
    modalities: list[str]
    foreground: list[str]
    binary: bool
    brats: bool
    resize: str
    median: list[int]
    depth: int
    shape: list[int]
    budget: float
    patch: list[int]
    gpus: int

    @property
    def divisor(self) -> int:
        return 2 ** (self.depth - 1)

    @property
    def whole(self) -> bool:
        return self.patch == self.shape

    @property
    def estimate_gb(self) -> float:
        need = activation_bytes(
            tuple(self.patch),  # type: ignore[arg-type]
            depth=self.depth,
            filters=FILTERS,
            batch=BATCH,
            channels=len(self.modalities),
        )
        return need / 2**30


def _decide(fp: dict[str, Any], gpu_memory_gb: float | None, modalities: list[str]) -> _Plan:
    foreground = list(fp["labels"])
    median = [int(s) for s in fp["median_shape"]]
    depth = _depth(min(median))
    shape = [int(math.ceil(s / 2 ** (depth - 1)) * 2 ** (depth - 1)) for s in median]
    budget = gpu_memory_gb if gpu_memory_gb is not None else CPU_BUDGET_GB
    return _Plan(
        fp=fp,
        modalities=modalities,
        foreground=foreground,
        binary=len(foreground) <= 1,
        brats=_is_brats(fp["labels"]),
        resize="resample" if any("inconsistent spacing" in w for w in fp["warnings"]) else "crop_pad",
        median=median,
        depth=depth,
        shape=shape,
        budget=budget,
        patch=_patch(shape, budget_gb=budget, depth=depth, channels=len(modalities)),
        gpus=1 if gpu_memory_gb is not None else 0,
    )


def plan_search(
    fingerprint: dict[str, Any], *, source: str, name: str, gpu_memory_gb: float | None, modalities: list[str]
) -> str:
    """The search file's text (YAML with a comment for each rule) for the fingerprinted dataset."""
    plan = _decide(fingerprint, gpu_memory_gb, modalities)
    fp = fingerprint
    lines = [
        HEADER + f" from the fingerprint of {fp['dataset']} ({fp['cases']} cases); each value says which rule gave it.",
        "# Search it:  distmis tune THIS_FILE        Then:  distmis evaluate runs/<name>/best --split test",
        f"name: {name}",
        *_data_lines(plan, source),
        *_training_lines(plan),
        *_search_lines(plan),
    ]
    return "\n".join(lines) + "\n"


def _data_lines(plan: _Plan, source: str) -> list[str]:
    schemes = [plan.fp["normalization"][m] for m in plan.modalities]
    if plan.binary:
        mode, why = "binary", "one foreground label"
    elif plan.brats:
        mode, why = "regions", "BraTS's nested tumour labels: trained and scored as regions WT, TC, ET (nnU-Net, BraTS)"
    else:
        mode, why = "multiclass", f"{len(plan.foreground)} foreground labels, one softmax class each"
    return [
        "data:",
        f"  source: {source}",
        *(["  regions: msd_task01          # WT = 1,2,3; TC = 2,3; ET = 3"] if plan.brats else []),
        "  prepare:",
        f"    shape: {plan.shape}            # the median case shape {plan.median}, rounded up to a multiple of "
        f"2^(depth-1) = {plan.divisor}",
        f"    resize: {plan.resize}          # "
        + (
            "the cases' spacings differ: resample them to one grid"
            if plan.resize == "resample"
            else "one spacing for all cases: crop or pad, no interpolation"
        ),
        f"    label_mode: {mode}      # {why}",
        f"    normalization: [{', '.join(schemes)}]   # per modality {plan.modalities}: CT by the training "
        "foreground's range, others z-scored per case",
        "    split: [0.7, 0.15, 0.15]     # test cases kept for distmis evaluate; finalize cross-validates the rest",
    ]


def _training_lines(plan: _Plan) -> list[str]:
    where = "GPU" if plan.gpus else "CPU"
    rare = min((plan.fp["labels"][v]["voxel_fraction"] for v in plan.foreground), default=0.0)
    return [
        "train:",
        f"  epochs: {EPOCHS}",
        f"  batch_size_per_replica: {BATCH}     # nnU-Net's batch; normalisation does not depend on it (group)",
        f"  patch: {plan.patch}            # "
        + (
            f"the whole volume: it fits the {plan.budget:g} GiB {where} budget (~{plan.estimate_gb:.2f} GiB estimated)"
            if plan.whole
            else f"the largest patch whose estimated training memory (~{plan.estimate_gb:.2f} GiB) fits "
            f"{plan.budget:g} GiB of {where} memory"
        ),
        f"  loss: {'dice' if plan.binary else 'dice_ce'}               # "
        + (
            "Dice for one binary label"
            if plan.binary
            else "Dice + cross-entropy: thin structures need the per-voxel term"
        ),
        f"  foreground_oversampling: {0.0 if plan.whole else 0.33}   # "
        + (
            "the patch is the whole volume: nothing to centre"
            if plan.whole
            else "a third of the patches centred on a foreground class (nnU-Net)"
            + (f"; the rarest label is {100 * rare:.2f}% of voxels" if plan.foreground else "")
        ),
        f"model: {{depth: {plan.depth}, filters: {FILTERS}, norm: group, groups: 4}}   # depth: a level per "
        f"halving of the smallest side ({min(plan.median)}) down to 16 voxels; group norm: batch statistics of "
        f"{BATCH} patches are noise",
        "optimizer: {name: adam}",
    ]


def _search_lines(plan: _Plan) -> list[str]:
    return [
        "search:",
        "  algorithm: optuna",
        "  metric: val_dice"
        + ("" if plan.binary else f"               # the mean over the {'regions' if plan.brats else 'classes'}"),
        "  mode: max",
        f"  num_samples: {TRIALS}                 # the quickstart budget; raise it on a cluster",
        f"  max_concurrent_trials: {1 if plan.gpus else 2}",
        "  seed: 0",
        f"  # no scheduler: with {TRIALS} trials of {EPOCHS} epochs every trial can finish; add",
        "  # scheduler: {type: asha, grace_period: 3, reduction_factor: 2} for a search of many more trials",
        "space:",
        "  lr: {loguniform: [1.0e-3, 2.0e-2]}   # Adam with group norm: where the recipe's searches pick",
        "  beta_2: {choice: [0.99, 0.999]}",
        f"parallelism: {{mode: experiment, workers_per_trial: 1, cpus_per_worker: 1, gpus_per_worker: {plan.gpus}}}",
    ]


def relative_source(dataset: Path, file: Path) -> str:
    """``data.source`` as the written file will read it (paths in a search file are relative to it)."""
    import os

    try:
        return os.path.relpath(dataset.resolve(), file.resolve().parent)
    except ValueError:  # another drive (Windows): an absolute path
        return str(dataset.resolve())


__all__ = ["HEADER", "plan_search", "relative_source"]
