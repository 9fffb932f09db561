"""Learning-rate schedules: warm-up, constant / poly / cosine against their formulas, and in training."""

from __future__ import annotations

from pathlib import Path

import pytest

from distmis.config import ExperimentConfig
from distmis.data import load_manifest
from distmis.model import learning_rate_schedule
from distmis.training import Trainer

KW = {"peak": 1e-2, "start": 0.0, "warmup_steps": 10, "total_steps": 110}


def learning_rate_at(step: int, **kw: object) -> float:
    """The Keras schedule's learning rate at update ``step`` (float32 in the graph)."""
    schedule = learning_rate_schedule(**kw)  # type: ignore[arg-type]
    return float(schedule(step)) if callable(schedule) else float(schedule)


def test_warmup_then_decay_shapes() -> None:
    approx = lambda v: pytest.approx(v, rel=1e-5, abs=1e-7)  # float32: near the end, relative to the peak
    for kind in ("constant", "poly", "cosine"):
        assert learning_rate_at(0, kind=kind, **KW) == approx(1e-3)  # (0 + 1) / 10 of the peak
        assert learning_rate_at(9, kind=kind, **KW) == approx(1e-2)
        assert learning_rate_at(10, kind=kind, **KW) == approx(1e-2)  # decay starts at the peak
        assert learning_rate_at(150, kind=kind, **KW) == approx(learning_rate_at(110, kind=kind, **KW))  # held
    assert learning_rate_at(60, kind="constant", **KW) == approx(1e-2)
    assert learning_rate_at(60, kind="poly", **KW) == approx(1e-2 * 0.5**0.9)  # nnU-Net's (1 - t)^0.9
    assert learning_rate_at(35, kind="poly", **KW) == approx(1e-2 * 0.75**0.9)
    assert learning_rate_at(60, kind="cosine", **KW) == approx(0.5e-2)
    assert learning_rate_at(35, kind="cosine", **KW) == approx(0.5e-2 * (1 + 0.5**0.5))  # cos(pi/4)
    assert learning_rate_at(110, kind="poly", **KW) == approx(0.0)
    # a scaled rate warms up from the single-worker one (Goyal et al.)
    assert learning_rate_at(0, kind="constant", peak=4e-3, start=1e-3, warmup_steps=3, total_steps=9) == approx(2e-3)
    assert learning_rate_schedule(kind="constant", peak=1e-3, start=0.0, warmup_steps=0, total_steps=5) == 1e-3


def test_training_follows_the_schedule_and_a_restore_keeps_its_place(prepared16: Path, tmp_path: Path) -> None:
    config = ExperimentConfig.model_validate(
        {
            "data": {"source": str(prepared16)},
            "train": {"epochs": 4, "lr_schedule": "poly", "warmup_epochs": 1, "threads": 1},
            "optimizer": {"lr": 1e-2},
        }
    )
    manifest = load_manifest(prepared16)
    trainer = Trainer(config, manifest)
    steps = trainer.steps_per_epoch
    expected = {"kind": "poly", "peak": 1e-2, "start": 0.0, "warmup_steps": steps, "total_steps": 4 * steps}
    first = trainer.run_epoch()
    assert first.lr == pytest.approx(learning_rate_at(steps, **expected), rel=1e-5)
    second = trainer.run_epoch()
    assert second.lr == pytest.approx(learning_rate_at(2 * steps, **expected), rel=1e-5) and second.lr < first.lr
    # the schedule's place is the optimiser's update count, which a checkpoint keeps
    restored = Trainer(config, manifest)
    restored.load_state_arrays(trainer.state_arrays())
    assert restored.current_lr() == pytest.approx(second.lr, rel=1e-6)


@pytest.mark.parametrize("schedule", ["poly", "cosine", "constant"])
def test_a_warmup_longer_than_the_run_is_refused(schedule: str) -> None:
    with pytest.raises(ValueError, match="warmup_epochs"):
        ExperimentConfig.model_validate({"train": {"epochs": 3, "warmup_epochs": 3, "lr_schedule": schedule}})
