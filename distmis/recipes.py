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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: nnU-Net's widths in 3D: the first level's filters and the cap of every level
NNUNET_FILTERS, NNUNET_MAX_FILTERS = 32, 320
#: nnU-Net's planner stops pooling an axis below this many voxels
NNUNET_MIN_FEATURE_MAP = 4


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
    # norm they were level (one seed: docs/benchmarks.md, "The width of distmis's recipe")
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
