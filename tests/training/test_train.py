"""One training run: overfit a small subset (CSCS practice), checkpoints, resume, CLI."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from distmis.cli import main
from distmis.config import ExperimentConfig, load_config
from distmis.training import fit


def _config(prepared: Path, **train: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "name": "t",
            "data": {"source": str(prepared)},
            "train": {"epochs": 3, "batch_size_per_replica": 2, "augment": {"flip": False, "intensity": 0.0}, **train},
            "model": {"depth": 3, "filters": 8},
            "optimizer": {"lr": 0.01},
        }
    )


def test_overfits_small_subset(prepared16: Path, tmp_path: Path) -> None:
    """Train Dice >= 0.9 within a bounded number of epochs on 8 cases of 16^3."""
    result = fit(
        _config(prepared16, epochs=60, threads=2),
        prepared16,
        tmp_path / "run",
        on_epoch=lambda m, _: m.dice >= 0.9 and m.epoch >= 5,
    )
    assert result.history[-1]["dice"] >= 0.9, result.history[-1]
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert len(rows) == len(result.history) and int(rows[-1]["epoch"]) == len(rows)
    assert (tmp_path / "run" / "best" / "weights.npz").is_file()
    assert (tmp_path / "run" / "best" / "preprocessing.json").is_file()


def test_resume_continues_from_checkpoint(prepared16: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = fit(_config(prepared16, epochs=2), prepared16, run)
    assert [int(r["epoch"]) for r in first.history] == [1, 2]
    second = fit(_config(prepared16, epochs=4), prepared16, run, resume_from=run / "checkpoint")
    assert [int(r["epoch"]) for r in second.history] == [1, 2, 3, 4]
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[0]["loss"]) == pytest.approx(first.history[0]["loss"])  # kept from the first run


def test_a_trial_set_up_on_an_actor_tune_then_abandons_does_not_touch_its_metrics(
    prepared16: Path, tmp_path: Path
) -> None:
    """Tune may set a trial up on a new actor, then train it on an actor of its own that came
    free (actor reuse). The first actor's set-up, still running, must not rewrite the metrics
    the other one appends: only a session that steps writes metrics.csv."""
    from distmis.training import RunSession

    run = tmp_path / "trial"
    trained = RunSession(_config(prepared16, epochs=2), prepared16, run)
    trained.step()
    RunSession(_config(prepared16, epochs=2), prepared16, run)  # the abandoned actor's set-up, late
    trained.step()
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2]


def test_cli_train_refuses_to_overwrite_and_resumes(
    prepared16: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "c",
                "data": {"source": str(prepared16)},
                "train": {"epochs": 1, "batch_size_per_replica": 2},
                "model": {"filters": 4},
            }
        )
    )
    out = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(out)]) == 0
    assert "val_dice" in capsys.readouterr().out
    assert main(["train", str(cfg), "--out", str(out)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["train", str(cfg), "--out", str(out), "--resume", "--epochs", "2"]) == 0
    assert len(list(csv.DictReader(open(out / "metrics.csv")))) == 2
    # the best config written with the run is accepted by `distmis train` again
    load_config(out / "best" / "config.yaml")


def test_patch_larger_than_volume_is_a_clear_error(prepared16: Path, tmp_path: Path) -> None:
    from distmis.exceptions import TrainingError

    with pytest.raises(TrainingError, match="larger than the prepared volumes"):
        fit(_config(prepared16, patch=[32, 32, 32]), prepared16, tmp_path / "run")


@pytest.mark.parametrize(("precision", "norm"), [("mixed_bfloat16", "batch"), ("float32", "sync_batch")])
def test_precision_and_norm_options_train(prepared16: Path, tmp_path: Path, precision: str, norm: str) -> None:
    import math

    cfg = _config(prepared16, epochs=1, precision=precision)
    cfg.model.norm = norm
    result = fit(cfg, prepared16, tmp_path / "run")
    assert math.isfinite(result.history[0]["loss"]) and math.isfinite(result.history[0]["val_dice"])


def test_saved_variables_are_found_by_name_not_position(prepared16: Path) -> None:
    """Two same-shaped variables that change places (a code change reordering layers) must still
    get their own values; a variable the model does not have is an error naming it."""
    import numpy as np

    from distmis.data import load_manifest
    from distmis.exceptions import TrainingError
    from distmis.training import Trainer, assign_by_path

    trainer = Trainer(_config(prepared16), load_manifest(prepared16))
    arrays = trainer.state_arrays()
    assert all(k.startswith(("model/", "optimizer/opt/")) for k in arrays)
    for var in trainer.model.weights:  # perturb, then restore from the saved arrays in reversed order
        var.assign(np.zeros(var.shape, var.dtype.name if hasattr(var.dtype, "name") else "float32"))
    assign_by_path(list(reversed(trainer.model.weights)), arrays, prefix="model/", source="test")
    for var in trainer.model.weights:
        np.testing.assert_array_equal(np.asarray(var.numpy()), arrays[f"model/{var.path}"])
    legacy = {f"model/{i:04d}": np.asarray(v.numpy()) for i, v in enumerate(trainer.model.weights)}
    assign_by_path(trainer.model.weights, legacy, prefix="model/", source="old weights.npz")  # still readable
    renamed = dict(arrays)
    renamed["model/renamed"] = renamed.pop(f"model/{trainer.model.weights[0].path}")
    with pytest.raises(TrainingError, match=r"test: its variables do not match .*missing \['down0_conv1/kernel'\]"):
        assign_by_path(trainer.model.weights, renamed, prefix="model/", source="test")


def test_validation_runs_predicts_sliding_window_with_the_training_patch(prepared16: Path) -> None:
    """Validation covers each whole volume with the training patch, cube by cube, exactly as
    ``predict`` does (same cubes, same Gaussian blend): its Dice is the Dice predict will give."""
    import numpy as np
    import tensorflow as tf

    from distmis.data import load_manifest, read_case
    from distmis.inference import sliding_window_predict
    from distmis.training import Trainer

    trainer = Trainer(_config(prepared16, patch=[8, 8, 12]), load_manifest(prepared16))
    _, image, label, _ = read_case(prepared16, "val", 0)
    volume = tf.constant(image[np.newaxis])
    window = tf.function(  # as the evaluation step traces it: batch and channels unknown
        trainer._validation_window(),
        input_signature=[tf.TensorSpec([None, 16, 16, 16, None]), tf.TensorSpec([None, 16, 16, 16, None])],
    )
    validated = window(volume, tf.zeros((1, 16, 16, 16, 1)))
    expected = sliding_window_predict(
        image, lambda cubes: trainer.model(cubes, training=False).numpy(), patch=(8, 8, 12), overlap=0.5
    )
    np.testing.assert_allclose(validated.numpy()[0], expected, atol=1e-5)
    whole = trainer.model(volume, training=False).numpy()[0]
    assert not np.allclose(whole, expected, atol=1e-3)  # not the whole volume through the network at once


def test_weights_that_hold_a_nan_make_the_epoch_diverged_and_never_best(prepared16: Path, tmp_path: Path) -> None:
    """A diverged network can keep a finite loss and Dice (ReLU turns NaN activations into a constant
    prediction), so the epoch's row counts the weight arrays that are not finite, the divergence
    check reads it first, and such weights are never written as best/."""
    import numpy as np

    from distmis.metrics import NONFINITE_WEIGHTS, divergence
    from distmis.training import RunSession

    run = tmp_path / "trial"
    session = RunSession(_config(prepared16, epochs=3), prepared16, run)
    first = session.step().as_dict()
    assert first[NONFINITE_WEIGHTS] == 0 and divergence(first, "val_dice") is None
    best_weights = (run / "best" / "weights.npz").read_bytes()
    kernel = next(v for v in session.trainer.model.weights if "kernel" in v.path)
    kernel.assign(np.full(kernel.shape, np.nan, dtype=np.asarray(kernel.numpy()).dtype))
    second = session.step().as_dict()
    assert second[NONFINITE_WEIGHTS] >= 1
    assert (divergence(second, "val_dice") or "").startswith("diverged: ")
    assert "weight array" in (divergence(second, "val_dice") or "")
    assert session.best is not None and int(session.best["epoch"]) == 1
    assert (run / "best" / "weights.npz").read_bytes() == best_weights
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [float(r[NONFINITE_WEIGHTS]) > 0 for r in rows] == [False, True]
