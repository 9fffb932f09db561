"""A search file planned from a dataset's fingerprint, by stated rules (``distmis init``).

nnU-Net plans a configuration from the dataset's fingerprint instead of asking users to edit
one made for other data; this does the same for a search. Each choice is a rule applied to the
fingerprint, and the file says which rule gave it, in a comment beside the value, so that a
user can see why and change it knowingly. Every value a rule decides is written, none is left
to a default.

The rules:

- **recipe** (``--recipe``, :mod:`distmis.recipes`): distmis's by default (nnU-Net's in Keras
  scored lower at short CPU budgets, :data:`distmis.recipes.DEFAULT_RECIPE`), ``--recipe nnunet`` for
  nnU-Net's; the recipe's configuration is the search's first point (``search.points``) and the
  space lies around it;
- **shape**: the median case shape rounded up, along each axis, to what the U-Net's poolings halve
  (2^(depth-1), or the product of the axis's pools); cases whose spacing differs from the median are
  resampled, the others cropped or padded;
- **depth**: the recipe's rule (nnU-Net's: one level per halving while the deepest maps keep 4
  voxels, at most 6); where the median spacing's coarsest axis is twice the finest or more, nnU-Net's
  planner per axis (:meth:`Recipe.topology`): an axis is halved only while its spacing is under twice
  the finest and long enough, and convolved with 1 instead of 3 until then (``model.pools``,
  ``model.kernels``), so that thick slices are not halved and blurred as the in-plane axes are;
- **patch**: the whole prepared volume when its estimated training memory fits the budget
  (``--gpu-memory``, or 4 GiB of host memory for a CPU), else the largest axis shrunk first;
  memory at the planned batch: 2 (nnU-Net's), or every training case when fewer train; with
  ``--budget``, where even one trial of that patch would get fewer than 250 steps, smaller still
  (the same way, at most to half of each axis) until one gets them: a short budget on a large
  volume buys more steps of a smaller patch; a third of the patches centred on foreground when a
  patch is smaller than the volume;
- **labels**: one foreground label -> binary and Dice + binary cross-entropy; several -> multi-class
  and Dice + cross-entropy (nnU-Net's loss for both); BraTS's three nested tumour labels (MSD's 1,
  2, 3 or the challenges' 1, 2, 4) -> the regions WT, TC and ET;
- **split**: 70/15/15, or 80/10/10 below 20 labelled cases so that training keeps most of them
  (finalize's cross-validation then uses every case outside the test split, as nnU-Net's folds do);
- **budget** (``--budget``): a trial is never planned shorter than one nnU-Net epoch (250 steps)
  when the budget allows one; 80 % of the budget, at the seconds per step measured with as many
  trials stepping at once as will run at once, buys two whole rounds of trials at once when each
  then gets 1,000 steps (four nnU-Net epochs; 500 with ``--finalize``, whose folds follow the
  search's rounds), else one round; on a CPU fewer trials at once where each would get fewer than
  1,000 steps (250 with ``--finalize``): the cores a trial leaves idle go to the others, so the
  trials are longer, with no fewer steps in all, unless, timed, the fewer trials step under two
  thirds as much in all, and each trial at once still gets 250 steps: then all run (on a GPU every
  trial runs: an idle GPU would lengthen none, and a trial short of 250 steps gets a smaller patch);
  the steps left over lengthen the trials; fewer trials at once are timed again on a CPU (each has
  more cores), unless even a linear speed-up would leave one trial short of 250 steps: then only the
  smaller patch it gets is timed (and timed once more if it was still too large); no early stopping
  (every trial finishes), and the search stops at the deadline (``search.time_budget``). Without a
  budget: 8 trials of 12 epochs, each at least 250 steps;
- **finalize** (``--budget B --finalize``): the search is planned for half of B, and the file's
  ``finalize`` section has ``distmis finalize`` cross-validate the best configuration alone (no
  pairs) on as many rounds of folds at the search's parallelism as the search ran rounds of trials
  (at least 2 folds, at most the cases of the rarest class), each fold as long as a trial, so that
  the two together take about B;
- **width on a CPU**: the widest of the recipe's CPU widths (:attr:`Recipe.cpu_widths`) that still
  buys two rounds of 250-step trials: nnU-Net's 32 base filters, else 16, else 8 (a 32-filter step is 7x an
  8-filter one on a CPU core at 48 x 56 x 48); distmis's 8 only (16 were level with 8 at 20
  minutes once both had instance norm, and at 40 minutes when init planned them, one seed each); on a
  GPU always the recipe's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distmis.data._inspect import activation_bytes, shrink_to_fit
from distmis.labels import PRESETS
from distmis.recipes import RECIPES, Recipe, Topology, level_widths

if TYPE_CHECKING:
    from distmis.config import Vec3

#: the first line of every file ``distmis init`` writes (what ``--overwrite`` may replace)
HEADER = "# written by distmis init"
#: the memory a CPU-only search plans a patch for, per trial
CPU_BUDGET_GB = 4.0
#: without a budget: trials, epochs, nnU-Net's batch
TRIALS, EPOCHS, BATCH = 8, 12, 2
#: no trial is planned shorter than one nnU-Net epoch of steps
MIN_TRIAL_STEPS = 250
#: a second round of trials only when each trial then still gets this many steps (four nnU-Net
#: epochs): below it a trial's steps buy more than a second round's trials (on the anatomy task, 2
#: trials of 600 steps scored above 4 of 300 at 5 minutes and 2 of 1,180 above 4 of 570-600 at 10, in
#: every seed; 2 of 2,360 were level with 4 of 1,180 at 20: docs/benchmarks.md)
ROUND_TRIAL_STEPS = 4 * MIN_TRIAL_STEPS
#: on a CPU, trials share its cores only when each then gets this many steps, as for a second round,
#: else fewer run at once, each on more cores: on 2 cores two trials at once stepped no more in all
#: than one on both, and on the anatomy task 1 trial on both cores scored above 2 at once in every
#: seed, at 2 minutes (460 steps against 250) and at 5 (1,150 against 630; docs/benchmarks.md)
AT_ONCE_TRIAL_STEPS = ROUND_TRIAL_STEPS
#: fewer trials at once on a CPU only where, timed on the cores they then have, they step at least this
#: share of what every slot's trial steps at once: on 2 cores one trial stepped about as much as two at
#: once (init timed 0.80-0.96 of it, the search 1.04) and its longer trial scored higher, but where a
#: trial's threads scale worse (many cores) fewer trials would give up steps as well as configurations
AT_ONCE_KEPT_SHARE = 2 / 3
#: with ``--finalize``, a second round from two nnU-Net epochs a trial: finalize runs as many rounds
#: of folds as the search ran rounds of trials, and the ensemble measured is 4 folds of about 600
#: steps; one round would leave 2 folds, each trained on half the cases, which is not measured
FINALIZE_ROUND_TRIAL_STEPS = 2 * MIN_TRIAL_STEPS
#: a budget's epochs per trial: enough reports for a curve, each at least a few steps
MAX_EPOCHS, MIN_EPOCH_STEPS = 10, 10
#: the share of a budget planned for training steps; the rest is start-up, preparing and validation
#: (measured on the anatomy task at 5 minutes: 14 s to the first step, 0.4 s of validation an epoch)
TRAINING_SHARE = 0.8
#: with ``--finalize``, the share of the budget the search is planned for: init plans its rounds of
#: trials in it, and finalize's as many rounds of folds, each as long as one of those trials, take
#: about as long again (on the anatomy task at 20 minutes this ensemble scored level with the search
#: given the whole budget, and above nnU-Net v2 by 2-2.5 points: docs/benchmarks.md)
SEARCH_SHARE = 0.5
#: below this many labelled cases the split keeps more of them for training
SMALL_DATASET = 20
#: one case each to train, validate and test on: fewer cannot be split into a search and its test
MIN_CASES = 3


@dataclass(frozen=True)
class PlanOptions:
    """What the user asked of the plan (``distmis init``'s options)."""

    gpu_memory_gb: float | None = None
    recipe: str = "distmis"
    budget_seconds: float | None = None
    budget_text: str | None = None  # as the user wrote it
    #: the budget also pays for ``distmis finalize`` of the search's best configuration (``--finalize``)
    finalize: bool = False
    concurrency: int | None = None  # trials at once (``--workers``)
    cores: int = 2
    #: seconds of one training step of (filters, patch, batch, trials stepping at once): measured by the
    #: caller, or given for the target cluster
    step_seconds: Callable[[int, tuple[int, int, int], int, int], float] | None = None
    #: ``step_seconds`` times each network here; a given step is for the planned patch, and a smaller
    #: one's is estimated from it by the work of their convolutions
    step_timed: bool = False

    @property
    def search_seconds(self) -> float | None:
        """The search's own wall time: the budget, or its :data:`SEARCH_SHARE` with ``finalize``."""
        if self.budget_seconds is None:
            return None
        return self.budget_seconds * SEARCH_SHARE if self.finalize else self.budget_seconds

    @property
    def search_text(self) -> str | None:
        """``search.time_budget`` as written: the user's text, or the search's share spelt out."""
        seconds = self.search_seconds
        if seconds is None or not self.finalize:
            return self.budget_text
        return spell_duration(seconds)


def spell_duration(seconds: float) -> str:
    """``1h30m``, ``10m``, ``2m30s``: a wall time as ``parse_duration`` reads it, to the second."""
    left = max(1, round(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)


@dataclass(frozen=True)
class Sizing:
    """How a search spends its budget."""

    trials: int
    epochs: int
    steps_per_epoch: int
    concurrency: int
    filters: int
    patch: list[int]
    step_seconds: float | None
    why: str
    #: the patch memory allows; ``patch`` is smaller where a short budget needs more steps than it buys
    memory_patch: list[int]

    @property
    def trial_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


def _patch(
    shape: list[int],
    *,
    budget_gb: float,
    topology: Topology,
    channels: int,
    filters: int,
    max_filters: int | None,
    batch: int,
) -> list[int]:
    """The whole volume if it fits the budget, else shrink the largest axis that can shrink, by its
    divisor at a time. Memory is counted at the planned batch: a dataset that trains on one case can
    afford twice the voxels of nnU-Net's batch of 2."""

    def fits(p: list[int]) -> bool:
        need = activation_bytes(
            tuple(p),  # type: ignore[arg-type]
            depth=topology.depth,
            filters=filters,
            batch=batch,
            channels=channels,
            pools=topology.pools,
            max_filters=max_filters,
        )
        return need <= budget_gb * 2**30

    return shrink_to_fit(shape, topology.divisors(), fits)


def conv_work(patch: list[int], *, topology: Topology, filters: int, max_filters: int | None, channels: int) -> float:
    """Multiply-adds of the U-Net's convolutions per voxel-batch (a width's relative step cost), at
    each level's voxels and kernel size: nnU-Net's thick-slice plan pools and convolves fewer axes."""
    depth = topology.depth
    widths = level_widths(depth, filters, max_filters)
    voxels = float(math.prod(patch))
    work, cin = 0.0, channels
    levels = zip(widths, topology.level_scales(), topology.level_kernels(), strict=True)
    for level, (width, scale, kernel) in enumerate(levels):
        at = voxels / math.prod(scale) * math.prod(kernel)
        work += at * (cin * width + width * width)  # encoder
        if level < depth - 1:
            work += at * (2 * width * width + width * width)  # decoder (concatenated input)
        cin = width
    return work


def _brats_regions(labels: dict[str, Any]) -> str | None:
    """The regions preset of BraTS's nested tumour labels, by their values and names: ``msd_task01``
    for MSD Task01's 1 edema, 2 non-enhancing, 3 enhancing; ``brats21`` for the challenges' own 1
    necrotic core, 2 edema, 4 enhancing; None for any other labels."""
    names = {v: str(row["name"]).lower() for v, row in labels.items()}
    if (
        set(names) == {"1", "2", "3"}
        and "edema" in names["1"]
        and any(w in names["2"] for w in ("non-enhancing", "necrotic", "core"))
        and "enhancing" in names["3"]
    ):
        return "msd_task01"
    if (
        set(names) == {"1", "2", "4"}
        and any(w in names["1"] for w in ("necrotic", "ncr", "core"))
        and any(w in names["2"] for w in ("edema", "oedema", "ed"))
        and any(w in names["4"] for w in ("enhancing", "et"))
    ):
        return "brats21"
    return None


@dataclass(frozen=True)
class _Plan:
    """Every choice, decided from the fingerprint before any text is written."""

    fp: dict[str, Any]
    modalities: list[str]
    foreground: list[str]
    binary: bool
    #: the regions preset of BraTS's nested tumour labels (None: not BraTS)
    brats: str | None
    resize: str
    median: list[int]
    topology: Topology
    shape: list[int]
    budget: float
    gpus: int
    recipe: Recipe
    sizing: Sizing
    options: PlanOptions = field(default_factory=PlanOptions)

    @property
    def patch(self) -> list[int]:
        return self.sizing.patch

    @property
    def depth(self) -> int:
        return self.topology.depth

    @property
    def divisors(self) -> Vec3:
        return self.topology.divisors()

    @property
    def whole(self) -> bool:
        return self.patch == self.shape

    @property
    def estimate_gb(self) -> float:
        need = activation_bytes(
            tuple(self.patch),  # type: ignore[arg-type]
            depth=self.depth,
            filters=self.sizing.filters,
            batch=self.batch,
            channels=len(self.modalities),
            pools=self.topology.pools,
            max_filters=self.recipe.model.get("max_filters"),
        )
        return need / 2**30

    @property
    def small(self) -> bool:
        return int(self.fp["cases"]) < SMALL_DATASET

    @property
    def split(self) -> tuple[float, float, float]:
        return split_fractions(int(self.fp["cases"]))

    @property
    def split_sizes(self) -> dict[str, int]:
        """Cases in each split as prepare will deal them (train, val, test)."""
        return split_sizes(int(self.fp["cases"]))

    @property
    def batch(self) -> int:
        return planned_batch(int(self.fp["cases"]))


def split_fractions(cases: int) -> tuple[float, float, float]:
    """The train/val/test fractions init writes for a dataset of ``cases`` labelled cases."""
    return (0.8, 0.1, 0.1) if cases < SMALL_DATASET else (0.7, 0.15, 0.15)


def split_sizes(cases: int) -> dict[str, int]:
    """Cases in each split as prepare will deal them (train, val, test)."""
    from distmis.data._prepare import split_cases

    split = split_cases([str(i) for i in range(cases)], split_fractions(cases), 0)
    return {name: len(ids) for name, ids in split.items()}


def planned_batch(cases: int) -> int:
    """nnU-Net's batch, or as many cases as train when fewer (a batch larger than the training split is
    refused by validate). The plan's step is timed at this batch, so that a 3-case dataset's budget
    buys the steps of its own batch of 1."""
    return min(BATCH, split_sizes(cases)["train"])


def plan_topology(recipe: Recipe, fp: dict[str, Any]) -> Topology:
    """The planned U-Net's levels for the fingerprinted data, with nnU-Net's pooling and kernels per
    axis where its median spacing is anisotropic (:meth:`Recipe.topology`)."""
    spacing = fp.get("median_spacing_mm")
    return recipe.topology([int(s) for s in fp["median_shape"]], [float(v) for v in spacing] if spacing else None)


def _decide(fp: dict[str, Any], options: PlanOptions, modalities: list[str]) -> _Plan:
    recipe = RECIPES[options.recipe]
    foreground = list(fp["labels"])
    median = [int(s) for s in fp["median_shape"]]
    topology = plan_topology(recipe, fp)
    shape = [int(math.ceil(s / d) * d) for s, d in zip(median, topology.divisors(), strict=True)]
    gpu = options.gpu_memory_gb is not None
    budget = float(options.gpu_memory_gb) if options.gpu_memory_gb is not None else CPU_BUDGET_GB
    sizing = _size(
        recipe,
        options,
        shape=shape,
        topology=topology,
        memory_gb=budget,
        channels=len(modalities),
        gpu=gpu,
        batch=planned_batch(int(fp["cases"])),
    )
    return _Plan(
        fp=fp,
        modalities=modalities,
        foreground=foreground,
        binary=len(foreground) <= 1,
        brats=_brats_regions(fp["labels"]),
        resize="resample" if any("inconsistent spacing" in w for w in fp["warnings"]) else "crop_pad",
        median=median,
        topology=topology,
        shape=shape,
        budget=budget,  # type: ignore[arg-type]
        gpus=1 if gpu else 0,
        recipe=recipe,
        sizing=sizing,
        options=options,
    )


def _widths(recipe: Recipe, gpu: bool) -> list[int]:
    """The base widths a plan may take, widest first: the recipe's own on a GPU, its CPU widths on a CPU."""
    if gpu or not recipe.cpu_widths:
        return [int(recipe.model["filters"])]
    return list(recipe.cpu_widths)


def _size(
    recipe: Recipe,
    options: PlanOptions,
    *,
    shape: list[int],
    topology: Topology,
    memory_gb: float,
    channels: int,
    gpu: bool,
    batch: int,
) -> Sizing:
    """Width, patch, trials, epochs and steps: see the module's rules."""
    concurrency = options.concurrency or (1 if gpu else 2)
    widths = _widths(recipe, gpu)
    mf = recipe.model.get("max_filters")
    patches = {
        w: _patch(
            shape, budget_gb=memory_gb, topology=topology, channels=channels, filters=w, max_filters=mf, batch=batch
        )
        for w in widths
    }
    if options.search_seconds is None or options.step_seconds is None:
        return _unbudgeted(concurrency, filters=widths[-1], patch=patches[widths[-1]])
    steps_total = options.search_seconds * TRAINING_SHARE * concurrency  # in step-seconds, per width below
    narrowest = widths[-1]
    base_seconds = options.step_seconds(narrowest, tuple(patches[narrowest]), batch, concurrency)  # type: ignore[arg-type]

    def estimate(w: int) -> float:
        work = conv_work(patches[w], topology=topology, filters=w, max_filters=mf, channels=channels)
        base = conv_work(patches[narrowest], topology=topology, filters=narrowest, max_filters=mf, channels=channels)
        return base_seconds * work / base

    width, seconds = narrowest, base_seconds
    for w in widths[:-1]:  # widest first: the first that still buys two rounds of full trials
        if steps_total / estimate(w) >= 2 * concurrency * MIN_TRIAL_STEPS:
            seconds = options.step_seconds(w, tuple(patches[w]), batch, concurrency)  # type: ignore[arg-type]
            if steps_total / seconds >= 2 * concurrency * MIN_TRIAL_STEPS:
                width = w
                break
            seconds = base_seconds
    patch, slots, need = patches[width], concurrency, at_once_steps(options, gpu=gpu)
    at_once = _fewer_at_once(
        options, width=width, patch=patch, batch=batch, concurrency=concurrency, seconds=seconds, need=need
    )
    concurrency, seconds, total, retime = at_once.concurrency, at_once.seconds, at_once.total, at_once.retime
    memory_patch, floor = patch, _patch_floor(patch, topology.divisors())
    if total / concurrency < MIN_TRIAL_STEPS:  # even each trial at once is short of an nnU-Net epoch
        patch, seconds, one = _smaller_patch(
            options, patch, seconds=seconds, total=total / concurrency, batch=batch, concurrency=concurrency,
            work=lambda p: conv_work(p, topology=topology, filters=width, max_filters=mf, channels=channels),
            filters=width, divisors=topology.divisors(), floor=floor,
        )  # fmt: skip
        total, retime = one * concurrency, retime and patch == memory_patch
    if retime:  # the patch could not shrink: its own step, timed as its trials will step
        seconds = options.step_seconds(width, tuple(patch), batch, concurrency)  # type: ignore[arg-type]
        total = options.search_seconds * TRAINING_SHARE * concurrency / seconds
    # whole rounds of `concurrency` trials (a part round leaves workers idle): two when each trial still
    # gets its round's steps, else one
    round_steps = FINALIZE_ROUND_TRIAL_STEPS if options.finalize else ROUND_TRIAL_STEPS
    rounds = 2 if total >= 2 * concurrency * round_steps else 1
    trials = rounds * concurrency
    trial_steps = max(1, int(total / trials))
    epochs = max(1, min(MAX_EPOCHS, trial_steps // MIN_EPOCH_STEPS))
    why = _budget_text(
        options, seconds=seconds, width=width, rounds=rounds, concurrency=concurrency, total=total,
        trial_steps=epochs * (trial_steps // epochs), round_steps=round_steps,
        patch=patch, memory_patch=memory_patch, floor=floor, slots=(slots, need), kept=at_once.kept,
    )  # fmt: skip
    return Sizing(
        trials=trials,
        epochs=epochs,
        steps_per_epoch=max(1, trial_steps // epochs),
        concurrency=concurrency,
        filters=width,
        patch=patch,
        step_seconds=seconds,
        why=why,
        memory_patch=memory_patch,
    )


def at_once_steps(options: PlanOptions, *, gpu: bool) -> int:
    """The steps each trial needs before trials share a CPU's cores: :data:`AT_ONCE_TRIAL_STEPS`, or
    one nnU-Net epoch with ``--finalize`` (its folds run at the search's parallelism, and one trial at
    a time would leave it one fold a round, where the ensemble measured has 4). On a GPU none: an idle
    GPU would lengthen no other trial."""
    if gpu:
        return 0
    return MIN_TRIAL_STEPS if options.finalize else AT_ONCE_TRIAL_STEPS


@dataclass(frozen=True)
class AtOnce:
    """How many trials run at once, at what step, buying how many steps in all."""

    concurrency: int
    seconds: float
    total: float
    #: the step is still to be timed (it was only estimated, for a patch that will shrink)
    retime: bool = False
    #: (fewer trials timed, the share of these steps they would step) where all of them run anyway
    kept: tuple[int, float] | None = None


def _fewer_at_once(
    options: PlanOptions, *, width: int, patch: list[int], batch: int, concurrency: int, seconds: float, need: int
) -> AtOnce:
    """Where the budget buys fewer than ``need`` steps (:func:`at_once_steps`) for each of
    ``concurrency`` trials at once on a CPU, fewer run, each with the idle slots' cores, and their step
    is timed again as they will step it; if that timing steps under :data:`AT_ONCE_KEPT_SHARE` of what
    all of them would, every trial runs after all, where each still gets 250 steps. Where even a
    linear speed-up leaves one trial short of 250 steps, the patch will shrink, so the step of this one
    is only estimated (linearly) and the patch that is trained gets the timing. On a GPU a trial steps
    on its own GPU however many run, so all of them do (and a short one a smaller patch)."""
    assert options.search_seconds is not None and options.step_seconds is not None
    total = options.search_seconds * TRAINING_SHARE * concurrency / seconds
    if total >= concurrency * need:  # on a GPU always (``need`` 0): an idle GPU lengthens no other trial
        return AtOnce(concurrency, seconds, total)
    fewer = max(1, int(total // need))
    if fewer == concurrency or not options.step_timed:  # a given step: the idle slots' go to the rest
        return AtOnce(fewer, seconds, total)
    if total < MIN_TRIAL_STEPS:
        return AtOnce(fewer, seconds * fewer / concurrency, total, retime=True)
    alone = options.step_seconds(width, tuple(patch), batch, fewer)  # type: ignore[arg-type]
    fewer_total = options.search_seconds * TRAINING_SHARE * fewer / alone
    # the cores speed the fewer trials up too little, and each of all of them still gets an nnU-Net epoch
    if fewer_total < AT_ONCE_KEPT_SHARE * total and total >= concurrency * MIN_TRIAL_STEPS:
        return AtOnce(concurrency, seconds, total, kept=(fewer, fewer_total / total))
    return AtOnce(fewer, alone, fewer_total)


def _unbudgeted(concurrency: int, *, filters: int, patch: list[int]) -> Sizing:
    """Without a budget: :data:`TRIALS` trials of :data:`EPOCHS` epochs, each at least an nnU-Net epoch."""
    return Sizing(
        trials=TRIALS,
        epochs=EPOCHS,
        steps_per_epoch=math.ceil(MIN_TRIAL_STEPS / EPOCHS),
        concurrency=concurrency,
        filters=filters,
        patch=patch,
        step_seconds=None,
        why=f"no --budget: {TRIALS} trials of {EPOCHS} epochs, each at least {MIN_TRIAL_STEPS} steps",
        memory_patch=patch,
    )


def _budget_text(
    options: PlanOptions,
    *,
    seconds: float,
    width: int,
    rounds: int,
    concurrency: int,
    total: float,
    trial_steps: int,
    round_steps: int,
    patch: list[int],
    memory_patch: list[int],
    floor: list[int],
    slots: tuple[int, int],
    kept: tuple[int, float] | None = None,
) -> str:
    """How the budget was spent, as the file's comment on ``train.epochs`` says it. ``slots``: the
    trials that could run at once, and the steps each needs before they do; ``kept``: the fewer
    trials timed, and the share of the steps they would step, where all of them run anyway."""
    why = (
        f"{options.search_text} at {seconds:.2f} s a step ({width} filters): {rounds} round(s) of {concurrency} "
        f"trial(s) of {trial_steps} steps"
    )
    if patch != memory_patch:
        why += f", of a smaller patch than {memory_patch}, which buys a trial fewer than {MIN_TRIAL_STEPS} steps"
        if patch == floor and trial_steps < MIN_TRIAL_STEPS:
            why += f" (the smallest patch planned, and the budget buys fewer than {MIN_TRIAL_STEPS} even of it)"
    elif trial_steps < MIN_TRIAL_STEPS:
        why += f" (the budget buys fewer than {MIN_TRIAL_STEPS} steps even for one trial)"
    else:
        reasons = []
        if concurrency < slots[0]:
            reasons.append(f"{slots[0]} at once would leave each trial under {slots[1]} steps")
        if kept is not None:
            reasons.append(
                f"{kept[0]} at once on all the cores would step {kept[1]:.0%} as much in all, under "
                f"{AT_ONCE_KEPT_SHARE:.0%}, so all {concurrency} run though each gets under {slots[1]} steps"
            )
        if rounds == 1 and total >= 2 * concurrency * MIN_TRIAL_STEPS:
            reasons.append(f"two rounds would leave each trial under {round_steps} steps")
        why += f" ({'; '.join(reasons)})" if reasons else ""
    return why


def _smaller_patch(
    options: PlanOptions,
    patch: list[int],
    *,
    seconds: float,
    total: float,
    batch: int,
    concurrency: int,
    work: Callable[[list[int]], float],
    filters: int,
    divisors: Vec3,
    floor: list[int],
) -> tuple[list[int], float, float]:
    """(patch, step seconds, steps) where ``total`` steps of ``patch`` leave one trial short of an nnU-Net
    epoch: memory is not what limits a short budget on a large volume, the number of steps is. The
    patch shrinks as the memory rule does (the longest axis first) until, at the step's ``seconds``
    scaled by the convolutions' work, one trial gets them, down to ``floor``; its step is then timed
    here, or estimated from the given one by that work. A small patch steps slower than its work says
    (a step has fixed costs), so where the timed step still leaves the trial short, the patch shrinks
    once more from that step and is timed again, and kept only if it buys more steps (a timing varies
    by a fifth between runs, so a smaller patch can time slower than a larger one)."""
    for attempt in range(2 if options.step_timed else 1):
        whole = work(patch)

        def fits(p: list[int], whole: float = whole, total: float = total) -> bool:
            return total * whole / work(p) >= MIN_TRIAL_STEPS

        smaller = shrink_to_fit(patch, divisors, fits, floor=floor)
        if smaller == patch:
            break
        if options.step_timed and options.step_seconds is not None:
            step = options.step_seconds(filters, tuple(smaller), batch, concurrency)  # type: ignore[arg-type]
        else:
            step = seconds * work(smaller) / whole
        if attempt > 0 and step >= seconds:  # the smaller patch buys no more steps: the timed one stays
            break
        patch, seconds, total = smaller, step, total * seconds / step
        if total >= MIN_TRIAL_STEPS:
            break
    return patch, seconds, total


def _patch_floor(patch: list[int], divisors: Vec3) -> list[int]:
    """The smallest patch a short budget shrinks ``patch`` to: half of each axis (an eighth of the
    voxels, so a patch keeps most of its context), and four voxels at the deepest level, as nnU-Net
    plans its depth."""
    return [min(p, max(math.ceil(p / 2 / d) * d, 4 * d)) for p, d in zip(patch, divisors, strict=True)]


def unplannable(fingerprint: dict[str, Any]) -> str | None:
    """Why no search can be planned for the fingerprinted dataset, or None: init refuses rather than
    write a file that ``validate`` would refuse, or one that trains a model with nothing to find."""
    cases = int(fingerprint["cases"])
    if cases < MIN_CASES:
        return f"{cases} labelled case(s); a search needs at least {MIN_CASES}, one each to train, validate and test on"
    labels = fingerprint["labels"]
    if not labels:
        return "dataset.json labels: only the background (0); there is no foreground class to segment"
    if not any(int(row["cases_with_label"]) > 0 for row in labels.values()):
        return (
            f"no training case holds any foreground label ({', '.join(sorted(labels))}): every label file is "
            "background only; check labelsTr"
        )
    return None


def plan_search(
    fingerprint: dict[str, Any], *, source: str, name: str, modalities: list[str], options: PlanOptions
) -> str:
    """The search file's text (YAML with a comment for each rule) for the fingerprinted dataset."""
    plan = _decide(fingerprint, options, modalities)
    fp = fingerprint
    lines = [
        HEADER
        + f" from the fingerprint of {dataset_text(fp['dataset'])} ({fp['cases']} cases); each value says which rule "
        "gave it.",
        "# Search it:  distmis tune THIS_FILE        Then:  distmis evaluate runs/<name>/best --split test",
        f"# Recipe: {plan.recipe.name} (distmis init --recipe); its configuration is the search's first point.",
        f"name: {name}",
        *_data_lines(plan, source),
        *_training_lines(plan),
        *_model_lines(plan),
        *_search_lines(plan),
    ]
    return "\n".join(lines) + "\n"


def _spelt_regions(preset: str) -> str:
    """``WT = 1,2,3; TC = 2,3; ET = 3``: a regions preset as its label values."""
    return "; ".join(f"{name} = {','.join(map(str, values))}" for name, values in PRESETS[preset].items())


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
        *([f"  regions: {plan.brats}          # {_spelt_regions(plan.brats)}"] if plan.brats else []),
        "  prepare:",
        f"    shape: {plan.shape}            # the median case shape {plan.median}, rounded up to a multiple of "
        + (
            f"2^(depth-1) = {plan.divisors[0]}"
            if plan.topology.pools is None
            else f"{list(plan.divisors)} along its axes (the model's pools)"
        ),
        f"    resize: {plan.resize}          # "
        + (
            "the cases' spacings differ: each case is interpolated to this shape, which does not make the "
            "spacings equal (resample the scans to one spacing beforehand for that)"
            if plan.resize == "resample"
            else "one spacing for all cases: crop or pad, no interpolation"
        ),
        f"    label_mode: {mode}      # {why}",
        f"    normalization: [{', '.join(schemes)}]   # per modality [{', '.join(map(dataset_text, plan.modalities))}]: CT by the training "
        "foreground's range, others z-scored per case",
        (
            f"    split: [0.8, 0.1, 0.1]     # fewer than {SMALL_DATASET} labelled cases: most of them train; test "
            "cases kept for distmis evaluate; finalize cross-validates every other case"
            if plan.small
            else "    split: [0.7, 0.15, 0.15]     # test cases kept for distmis evaluate; finalize cross-validates the rest"
        ),
    ]


def dataset_text(value: object) -> str:
    """Text from the dataset (its name, a modality's) as it may appear in a comment of the file: a
    JSON string, ASCII only, so that no line break of any kind (``\\n``, ``\\r``, U+0085, U+2028)
    can end the comment and turn the rest of the name into live YAML."""
    import json

    return json.dumps(str(value), ensure_ascii=True)


def _flow(values: dict[str, Any]) -> str:
    """A mapping as one YAML flow line (values from the recipes: numbers, booleans, plain names)."""
    import yaml

    return yaml.safe_dump(values, default_flow_style=True, sort_keys=False, width=10**6).strip()


def _training_lines(plan: _Plan) -> list[str]:
    where = "GPU" if plan.gpus else "CPU"
    rare = min((plan.fp["labels"][v]["voxel_fraction"] for v in plan.foreground), default=0.0)
    sz = plan.sizing
    oversampling = 0.0 if plan.whole else 0.33
    return [
        "train:",
        f"  epochs: {sz.epochs}                     # {sz.why}",
        f"  steps_per_epoch: {sz.steps_per_epoch}           # iterations, each a random batch of patches (nnU-Net: "
        "250), not a pass over the cases",
        f"  batch_size_per_replica: {plan.batch}     # "
        + ("nnU-Net's batch" if plan.batch == BATCH else f"every training case: only {plan.batch} train"),
        f"  patch: {plan.patch}            # "
        + (
            f"the whole volume: it fits the {plan.budget:g} GiB {where} budget (~{plan.estimate_gb:.2f} GiB estimated)"
            if plan.whole
            else f"smaller than the {sz.memory_patch} that fits {plan.budget:g} GiB of {where} memory: a short "
            "budget buys more steps of a smaller patch (never under half of each axis)"
            if sz.memory_patch != plan.patch
            else f"the largest patch whose estimated training memory (~{plan.estimate_gb:.2f} GiB) fits "
            f"{plan.budget:g} GiB of {where} memory"
        ),
        f"  loss: {'dice_bce' if plan.binary else 'dice_ce'}               # "
        + (
            "Dice + binary cross-entropy (nnU-Net's loss): the per-voxel term helps a small structure"
            if plan.binary
            else "Dice + cross-entropy: thin structures need the per-voxel term"
        ),
        f"  foreground_oversampling: {oversampling}   # "
        + (
            "the patch is the whole volume: nothing to centre"
            if plan.whole
            else "a third of the patches centred on a foreground class (nnU-Net)"
            + (f"; the rarest label is {100 * rare:.2f}% of voxels" if plan.foreground else "")
        ),
        f"  validation: {'window' if plan.whole else 'patch'}   # "
        + (
            "each validation case whole, as predict segments it"
            if plan.whole
            else "fixed patches of each validation case every epoch (nnU-Net's pseudo-Dice): a whole volume's "
            "sliding window would cost more than an epoch's training"
        ),
        f"  lr_schedule: {plan.recipe.train['lr_schedule']}   # the {plan.recipe.name} recipe's"
        + (", over every iteration of the trial" if plan.recipe.train["lr_schedule"] == "poly" else ""),
        f"  warmup_epochs: {plan.recipe.train['warmup_epochs']}",
    ]


def _model_lines(plan: _Plan) -> list[str]:
    model = {**plan.recipe.model, "depth": plan.depth, "filters": plan.sizing.filters}
    model = {k: v for k, v in model.items() if v is not None or k == "max_filters"}
    topology = plan.topology
    if topology.pools is not None:
        model |= {"pools": [list(p) for p in topology.pools], "kernels": [list(k) for k in topology.kernels or []]}
    reason = "too slow a step for this budget on a CPU" if plan.sizing.step_seconds else "a CPU plan without --budget"
    width = f"{plan.sizing.filters} base filters" + (
        ""
        if plan.sizing.filters == plan.recipe.model["filters"]
        else f" (not the recipe's {plan.recipe.model['filters']}: {reason})"
    )
    spacing = [round(float(v), 3) for v in plan.fp.get("median_spacing_mm") or []]
    levels = (
        f"depth {plan.depth} for the smallest side {min(plan.median)}"
        if topology.pools is None
        else f"depth, pools and kernels by nnU-Net's planner for the anisotropic spacing {spacing} mm: an axis is "
        "halved, and convolved with 3, only while its spacing is under twice the finest"
    )
    return [
        f"model: {_flow(model)}   # the {plan.recipe.name} recipe; {levels}; {width}",
        f"optimizer: {_flow(plan.recipe.optimizer)}   # the {plan.recipe.name} recipe's",
    ]


def _search_lines(plan: _Plan) -> list[str]:
    sz = plan.sizing
    point = dict(plan.recipe.point)
    space = dict(plan.recipe.space)
    if plan.whole:  # nothing to centre on: do not search it
        point.pop("foreground_oversampling", None)
        space.pop("foreground_oversampling", None)
    lines = [
        "search:",
        "  algorithm: optuna",
        "  metric: val_dice"
        + ("" if plan.binary else f"               # the mean over the {'regions' if plan.brats else 'classes'}"),
        "  mode: max",
        f"  num_samples: {sz.trials}                 # {sz.why.split(': ', 1)[0]}",
        f"  max_concurrent_trials: {sz.concurrency}",
        "  seed: 0",
        f"  points: [{_flow(point)}]   # the {plan.recipe.name} recipe's own configuration, tried first",
        "  scheduler: {type: none}   # no early stopping: every trial runs all its epochs",
    ]
    if plan.options.search_text:
        share = (
            f" ({SEARCH_SHARE:.0%} of {plan.options.budget_text}; finalize has the rest)"
            if plan.options.finalize
            else ""
        )
        lines.append(
            f"  time_budget: {plan.options.search_text}   # no trial starts after it; those running then are stopped{share}"
        )
    lines.append("space:")
    lines += [f"  {key}: {_flow(spec)}" for key, spec in space.items()]
    cpus = max(1, plan.options.cores // sz.concurrency) if not plan.gpus else 1
    lines.append(
        f"parallelism: {{mode: experiment, workers_per_trial: 1, cpus_per_worker: {cpus}, gpus_per_worker: {plan.gpus}}}"
    )
    if plan.options.finalize:
        lines += _finalize_lines(plan)
    return lines


def finalize_folds(concurrency: int, rounds: int, cases: int) -> int:
    """As many rounds of folds at the search's parallelism as the search ran rounds of trials (at
    least 2 folds, at most one a case): every worker busy, and finalize as long as the search.
    ``cases``: those the folds can deal out, or fewer where a class is in fewer (a fold whose
    validation cases lack a class has no cross-validated Dice for it, and finalize refuses it)."""
    return max(2, min(rounds * concurrency, cases))


def _finalize_lines(plan: _Plan) -> list[str]:
    """The rest of the budget: ``distmis finalize`` of the best configuration on the search's rounds
    of folds, each fold as long as a search trial, so that finalize takes about what the search took."""
    sizes = plan.split_sizes
    cv = sizes["train"] + sizes["val"]  # finalize's folds deal out every case outside the test split
    present = [int(row["cases_with_label"]) for row in plan.fp["labels"].values()]
    rarest = min((n for n in present if n > 0), default=cv)
    at_once = plan.sizing.concurrency
    search_rounds = -(-plan.sizing.trials // at_once)
    folds = finalize_folds(at_once, search_rounds, min(cv, rarest))
    rounds = -(-folds // at_once)
    spent = f"the other {1 - SEARCH_SHARE:.0%} of {plan.options.budget_text}"
    if rounds > search_rounds:  # one trial at a time for one round: two folds take twice the search
        spent = f"{rounds} times the search's time: the budget buys one trial, finalize needs 2 folds"
    return [
        f"finalize: {{top: 1, folds: {folds}, pairs: false}}   # distmis finalize RUN: the best configuration "
        f"on {folds} folds, {rounds} round(s) of {at_once} at once as the search's trials ({spent})",
    ]


def relative_source(dataset: Path, file: Path) -> str:
    """``data.source`` as the written file will read it (paths in a search file are relative to it)."""
    import os

    try:
        return os.path.relpath(dataset.resolve(), file.resolve().parent)
    except ValueError:  # another drive (Windows): an absolute path
        return str(dataset.resolve())


__all__ = [
    "HEADER",
    "dataset_text",
    "MIN_CASES",
    "plan_topology",
    "MIN_TRIAL_STEPS",
    "PlanOptions",
    "Sizing",
    "conv_work",
    "plan_search",
    "relative_source",
    "unplannable",
]
