"""The patch rules `inspect` suggests and `init` plans with: the memory estimate counts each level at
the width the model builds, and thick slices keep their few slices whole."""

from __future__ import annotations

import pytest

from distmis.data import activation_bytes
from distmis.data import suggest_patch as suggest
from distmis.recipes import level_widths


def _by_hand(patch: tuple[int, int, int], widths: list[int], batch: int, channels: int) -> float:
    voxels = patch[0] * patch[1] * patch[2]
    maps = sum(12 * width * voxels / 8**level for level, width in enumerate(widths))
    return 1.5 * batch * (maps + channels * voxels) * 4


def test_a_capped_deep_plan_is_charged_for_the_capped_widths() -> None:
    patch, batch, channels = (128, 128, 128), 2, 4
    # nnU-Net's GPU plan: 32 filters doubling to a cap of 320; at depth 6 the deepest level is 320 wide, not 1,024
    assert level_widths(6, 32, 320) == [32, 64, 128, 256, 320, 320]
    capped = activation_bytes(patch, depth=6, filters=32, batch=batch, channels=channels, max_filters=320)
    uncapped = activation_bytes(patch, depth=6, filters=32, batch=batch, channels=channels)
    assert capped == pytest.approx(_by_hand(patch, [32, 64, 128, 256, 320, 320], batch, channels))
    assert uncapped == pytest.approx(_by_hand(patch, [32, 64, 128, 256, 512, 1024], batch, channels))
    assert capped < uncapped


def test_a_cap_the_plan_never_reaches_changes_nothing() -> None:
    patch = (64, 64, 32)
    kwargs = {"depth": 4, "filters": 8, "batch": 2, "channels": 2, "pools": [(2, 2, 2), (2, 2, 1), (2, 2, 1)]}
    assert activation_bytes(patch, max_filters=320, **kwargs) == activation_bytes(patch, **kwargs)


def test_a_thick_slice_volume_gets_per_axis_pools_and_keeps_its_slices() -> None:
    # 0.6 x 0.6 x 4 mm, 20 slices: a cube patch could be no more than 20 voxels a side
    s = suggest([160, 160, 20], 1, spacing=[0.6, 0.6, 4.0], gpu_memory_gb=2, depth=3, filters=8, batch=2)
    assert s["pools"] == [[2, 2, 1], [2, 2, 1]]  # the slice axis is never halved at 6.7 times the in-plane spacing
    assert s["kernels"] == [[3, 3, 1], [3, 3, 1], [3, 3, 3]]
    assert s["prepare_shape"] == [160, 160, 20]  # multiples of 4, 4 and 1
    assert s["train_patch"] == [160, 160, 20]
    assert s["estimated_gb"] <= 2


def test_an_isotropic_volume_shrinks_its_longest_axes_first() -> None:
    budget = activation_bytes((96, 96, 64), depth=3, filters=8, batch=2, channels=1) / 2**30
    net = {"depth": 3, "filters": 8, "batch": 2}
    s = suggest([128, 128, 64], 1, spacing=[1.0, 1.0, 1.0], gpu_memory_gb=budget, **net)
    assert "pools" not in s
    assert s["train_patch"] == [96, 96, 64]  # not the 64-voxel cube the shortest side would allow
    tight = suggest([128, 128, 64], 1, spacing=[1.0, 1.0, 1.0], gpu_memory_gb=budget * 0.999, **net)
    assert tight["train_patch"] != [96, 96, 64] and all(side % 4 == 0 for side in tight["train_patch"])
    assert "train_patch" not in suggest([128, 128, 64], 1, spacing=None, gpu_memory_gb=None, **net)


def test_without_a_depth_the_suggestion_takes_the_recipes_levels_and_widths() -> None:
    # init's depth rule: a level per halving while the deepest maps keep the recipe's smallest side
    # (16 voxels for distmis's recipe, nnU-Net's 4), within the recipe's levels
    ours = suggest([64, 64, 64], 2, spacing=[1.0, 1.0, 1.0], gpu_memory_gb=8, depth=None, filters=None, batch=2)
    theirs = suggest(
        [64, 64, 64], 2, spacing=[1.0, 1.0, 1.0], gpu_memory_gb=8, depth=None, filters=None, batch=2, recipe="nnunet"
    )
    assert (ours["recipe"], ours["depth"], ours["filters"]) == ("distmis", 3, 8)
    assert (theirs["recipe"], theirs["depth"], theirs["filters"]) == ("nnunet", 5, 32)
    # the estimate counts nnU-Net's widths 32..320 at 5 levels, where distmis's 8..32 at 3
    assert theirs["estimated_gb"] == pytest.approx(
        _by_hand(tuple(theirs["train_patch"]), [32, 64, 128, 256, 320], 2, 2) / 2**30, abs=1e-3
    )
    assert ours["estimated_gb"] == pytest.approx(
        _by_hand(tuple(ours["train_patch"]), [8, 16, 32], 2, 2) / 2**30, abs=1e-3
    )
    # a depth given is kept whatever the recipe
    assert suggest([64, 64, 64], 2, spacing=None, gpu_memory_gb=None, depth=4, filters=None, batch=2)["depth"] == 4
