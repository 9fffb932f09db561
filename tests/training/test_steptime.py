"""How ``distmis init --budget`` times a training step: a window of steps, and a figure that a slow
spell of the machine inside that window does not move."""

from __future__ import annotations

import pytest

from distmis.config import ModelConfig, OptimizerConfig
from distmis.training import MIN_TIMED_STEPS, measure_step_samples, steady_step_seconds


def test_a_slow_spell_over_most_of_the_window_does_not_move_the_figure() -> None:
    """Two thirds of the steps slowed by 60 % (another tenant, the kernel's own work) leave the figure
    at the machine's own 0.40 s, where the median the figure once was would read 0.65."""
    spell = [0.40] * 4 + [0.65] * 8
    assert steady_step_seconds(spell) == pytest.approx(0.40)
    assert steady_step_seconds(list(reversed(spell))) == pytest.approx(0.40)


def test_one_lucky_step_does_not_set_the_figure() -> None:
    assert steady_step_seconds([0.10] + [0.40] * 11) == pytest.approx(0.40)
    assert steady_step_seconds([0.40, 0.42, 0.44]) == pytest.approx(0.41)


def test_no_step_timed_is_an_error_not_a_figure() -> None:
    with pytest.raises(ValueError, match="no step"):
        steady_step_seconds([])


def test_steps_are_timed_for_the_window_and_at_least_the_fewest() -> None:
    """A window of no seconds still times the fewest steps; a longer one times steps until it has
    passed (each sample a real step of the network, so their sum covers the window)."""
    model, optimizer = ModelConfig(depth=2, filters=4, norm="none"), OptimizerConfig()
    shape = {"patch": (8, 8, 8), "channels": 1, "classes": 2, "batch": 1}
    fewest = measure_step_samples(model, optimizer, **shape, seconds=0.0)
    assert len(fewest) == MIN_TIMED_STEPS and all(s > 0 for s in fewest)
    window = measure_step_samples(model, optimizer, **shape, seconds=1.0)
    assert len(window) >= MIN_TIMED_STEPS and sum(window) >= 0.9
