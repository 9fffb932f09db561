"""Training recipes: the model, optimiser and training values a planned search starts from.

``distmis init`` writes a recipe's values into the search file explicitly and puts the recipe's
configuration first in ``search.points``, so that the search starts where the recipe would end its
planning and then searches the space around it. Two recipes are named:

- ``nnunet``: nnU-Net v2's ``3d_fullres`` recipe in Keras: filters doubled per level from 32 to a cap
  of 320, instance normalisation, leaky ReLU, strided-convolution down-sampling, deep supervision;
  SGD with Nesterov momentum 0.99, weight decay 3e-5, the gradient's norm clipped at 12, learning
  rate 1e-2 with poly decay over every iteration; a third of the patches centred on foreground.
  Its depth follows nnU-Net's planner: one level per halving while the deepest maps keep 4 voxels,
  at most 6 levels. On a CPU the base width may be planned narrower (:attr:`Recipe.cpu_widths`).
- ``distmis``: distmis's own recipe: 8 filters, instance normalisation, ReLU, max pooling, one
  output; Adam at a constant learning rate, searched over 1e-3 .. 2e-2. Of nnU-Net's parts it takes
  the one measured to help on a CPU budget: instance normalisation.

Either recipe's network follows nnU-Net's planner per axis on thick slices (:meth:`Recipe.topology`):
where the coarsest spacing is twice the finest or more, an axis is pooled and convolved with 3 only
while its spacing is under twice the finest, as ``get_pool_and_conv_props`` plans it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: nnU-Net's widths in 3D: the first level's filters and the cap of every level
NNUNET_FILTERS, NNUNET_MAX_FILTERS = 32, 320
#: nnU-Net's planner stops pooling an axis below this many voxels
NNUNET_MIN_FEATURE_MAP = 4
#: nnU-Net's planner pools and convolves an axis only while its spacing is under this many times the finest
ANISOTROPIC_SPACING = 2.0


@dataclass(frozen=True)
class Recipe:
    """One named recipe: the sections' values, and the space a search varies around them."""

    name: str
    model: dict[str, Any]
    optimizer: dict[str, Any]
    train: dict[str, Any]
    #: ``{param: spec}`` of the search around the recipe's own point (which is its first trial)
    space: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the recipe's own values of the searched parameters: ``search.points[0]``
    point: dict[str, Any] = field(default_factory=dict)
    #: the depth rule: one level per halving while the deepest maps keep this many voxels ...
    deepest_map: int = 16
    #: ... within these levels
    depth_range: tuple[int, int] = (3, 5)
    #: the base widths a CPU plan may take, widest first; none: only ``model["filters"]``, as on a GPU.
    #: A wider step costs more on a CPU, so a short budget buys more steps of a narrow network
    cpu_widths: tuple[int, ...] = ()

    def depth(self, smallest_side: int) -> int:
        """The U-Net's levels for a patch whose smallest side is ``smallest_side``."""
        low, high = self.depth_range
        halvings = int(math.log2(max(smallest_side, self.deepest_map) / self.deepest_map))
        return max(low, min(high, halvings + 1))

    def topology(self, shape: list[int], spacing: list[float] | None) -> Topology:
        """The U-Net's levels for volumes of ``shape`` at ``spacing`` (mm), and, where the spacing is
        anisotropic, nnU-Net's pooling and kernels for it (:func:`anisotropic_topology`)."""
        if spacing is None or max(spacing) < ANISOTROPIC_SPACING * min(spacing):
            return Topology(depth=self.depth(min(shape)))
        return anisotropic_topology(shape, spacing, deepest_map=self.deepest_map, depth_range=self.depth_range)


def level_widths(depth: int, filters: int, max_filters: int | None) -> list[int]:
    """The filters of each of ``depth`` levels, top to bottom: ``filters`` doubled per level, capped
    at ``max_filters`` (nnU-Net's 320 on a GPU plan). The one rule the model, its parameter count and
    the planner's step-cost estimate all read."""
    widths = [filters * 2**level for level in range(depth)]
    return widths if max_filters is None else [min(width, max_filters) for width in widths]


def level_pools(depth: int, pools: Sequence[Sequence[int]] | None) -> list[tuple[int, int, int]]:
    """Each axis's down-sampling into each of ``depth`` levels below the first: ``pools``, or 2 along
    every axis when None."""
    if pools is None:
        return [(2, 2, 2)] * (depth - 1)
    return [(int(p[0]), int(p[1]), int(p[2])) for p in pools]


def level_scales(depth: int, pools: Sequence[Sequence[int]] | None) -> list[tuple[int, int, int]]:
    """How much smaller each of ``depth`` levels' maps are than the input along each axis, top to
    bottom, given each level's pooling (None: 2 along every axis). The last is what every side of a
    volume or patch must be a multiple of; deep supervision takes a level's labels at its step.

    The one owner of this arithmetic: the written ``model`` section and init's plan both ask it."""
    scales = [(1, 1, 1)]
    for pool in level_pools(depth, pools):
        scales.append((scales[-1][0] * pool[0], scales[-1][1] * pool[1], scales[-1][2] * pool[2]))
    return scales


@dataclass(frozen=True)
class Topology:
    """A U-Net's levels, and per level its pooling and kernels along each axis (None: alike on every axis)."""

    depth: int
    pools: list[tuple[int, int, int]] | None = None
    kernels: list[tuple[int, int, int]] | None = None

    def level_scales(self) -> list[tuple[int, int, int]]:
        """Each level's maps' step along each axis (:func:`level_scales`)."""
        return level_scales(self.depth, self.pools)

    def level_kernels(self) -> list[tuple[int, int, int]]:
        """Each level's convolution size along each axis (3 along every axis without ``kernels``, the
        recipes' kernel size)."""
        return list(self.kernels) if self.kernels is not None else [(3, 3, 3)] * self.depth

    def divisors(self) -> tuple[int, int, int]:
        """What each side of the prepared shape and the patch must be a multiple of along its axis."""
        return self.level_scales()[-1]


def anisotropic_topology(
    shape: list[int], spacing: list[float], *, deepest_map: int, depth_range: tuple[int, int]
) -> Topology:
    """nnU-Net's planner (``get_pool_and_conv_props``) for volumes of ``shape`` at ``spacing``: each
    level halves the axes whose spacing is under twice the finest of those still at least twice
    ``deepest_map`` long (one such axis alone only while it is three times as long); an axis is convolved
    with 3 from the first level at which its spacing is under twice the finest, with 1 before; the
    bottom level with 3 along every axis. Levels are kept within ``depth_range``: below its lower end
    the halving goes on by spacing alone (the prepared shape is a multiple of 2^(depth-1) anyway)."""
    low, high = depth_range
    current, size = [float(s) for s in spacing], [float(n) for n in shape]
    kernel = [1, 1, 1]
    pools: list[tuple[int, int, int]] = []
    kernels: list[tuple[int, int, int]] = []
    while len(pools) < high - 1:
        long_enough = [d for d in range(3) if size[d] >= 2 * deepest_map] if len(pools) >= low - 1 else [0, 1, 2]
        if not long_enough:
            break
        finest = min(current[d] for d in long_enough)
        axes = [d for d in long_enough if current[d] < ANISOTROPIC_SPACING * finest]
        if len(pools) >= low - 1 and len(axes) == 1 and size[axes[0]] < 3 * deepest_map:
            break
        kernel = [3 if kernel[d] == 3 or current[d] < ANISOTROPIC_SPACING * min(current) else 1 for d in range(3)]
        kernels.append((kernel[0], kernel[1], kernel[2]))
        pools.append(tuple(2 if d in axes else 1 for d in range(3)))  # type: ignore[arg-type]
        for d in axes:
            current[d] *= 2
            size[d] = math.ceil(size[d] / 2)
    kernels.append((3, 3, 3))
    return Topology(depth=len(pools) + 1, pools=pools, kernels=kernels)


NNUNET = Recipe(
    name="nnunet",
    model={
        "filters": NNUNET_FILTERS,
        "max_filters": NNUNET_MAX_FILTERS,
        "norm": "instance",
        "activation": "leaky_relu",
        "downsample": "strided",
        "deep_supervision": True,
    },
    optimizer={
        "name": "sgd",
        "lr": 1.0e-2,
        "momentum": 0.99,
        "nesterov": True,
        "weight_decay": 3.0e-5,
        "global_clipnorm": 12.0,
    },
    train={"lr_schedule": "poly", "warmup_epochs": 0},
    space={
        "lr": {"loguniform": [3.0e-3, 3.0e-2]},
        "momentum": {"choice": [0.9, 0.95, 0.99]},
        "deep_supervision": {"choice": [True, False]},
        "foreground_oversampling": {"choice": [0.33, 0.5]},
    },
    point={"lr": 1.0e-2, "momentum": 0.99, "deep_supervision": True, "foreground_oversampling": 0.33},
    # nnU-Net's planner: halve while the deepest maps keep NNUNET_MIN_FEATURE_MAP voxels, at most 6 stages
    deepest_map=NNUNET_MIN_FEATURE_MAP,
    depth_range=(2, 6),
    cpu_widths=(NNUNET_FILTERS, 16, 8),
)

DISTMIS = Recipe(
    name="distmis",
    model={
        "filters": 8,
        "max_filters": None,
        # instance, not group: on the anatomy task at 5 and 20 minutes it scored higher in most seeds and
        # level in the rest, for a cheaper step (docs/benchmarks.md, "One part at a time")
        "norm": "instance",
        # nnU-Net's leaky ReLU, strided down-sampling, deep supervision, poly decay and its SGD with poly,
        # each switched on alone at 5 and at 20 minutes, gained nothing beyond the seeds' spread or lost
        # (docs/benchmarks.md, "One part at a time")
        "activation": "relu",
        "downsample": "maxpool",
        "deep_supervision": False,
    },
    optimizer={"name": "adam", "lr": 3.0e-3},
    train={"lr_schedule": "constant", "warmup_epochs": 0},
    space={"lr": {"loguniform": [1.0e-3, 2.0e-2]}, "beta_2": {"choice": [0.99, 0.999]}},
    point={"lr": 3.0e-3, "beta_2": 0.999},
    # no CPU widths but its own: 16 filters were ahead of 8 with group norm at 20 minutes, but with instance
    # norm they were level, and planned by init at 40 minutes on a binary task too (one seed each:
    # docs/benchmarks.md, "The width of distmis's recipe")
)

RECIPES: dict[str, Recipe] = {r.name: r for r in (NNUNET, DISTMIS)}

#: what tells two recipes' networks apart whatever a plan or a search chose for their widths and depth
_NETWORK_KEYS = ("activation", "downsample")


def recipe_of(model: Any) -> str | None:
    """The recipe whose network ``model`` (a :class:`~distmis.config.ModelConfig`) is built like, by its
    activation and down-sampling; ``None`` for a network of neither."""
    for recipe in RECIPES.values():
        if all(getattr(model, key, None) == recipe.model[key] for key in _NETWORK_KEYS):
            return recipe.name
    return None


#: what ``distmis init`` plans without ``--recipe``. Measured on the MNI152 anatomy task on 2 CPU cores
#: (docs/benchmarks.md) against distmis's recipe as it was, with group norm: nnU-Net's recipe was behind
#: it at 150 steps and at 5 minutes, and level at 20 minutes (ahead or behind by seed). Instance norm
#: then put distmis's recipe ahead of its group-norm self; nnU-Net's was not rerun against it. A default
#: moves only on a measured gain
DEFAULT_RECIPE = "distmis"


__all__ = ["DEFAULT_RECIPE", "DISTMIS", "NNUNET", "RECIPES", "Recipe", "recipe_of"]
