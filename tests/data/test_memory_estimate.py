"""The planner's memory estimate counts each level at the width the model really builds."""

from __future__ import annotations

import pytest

from distmis.data import activation_bytes
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
