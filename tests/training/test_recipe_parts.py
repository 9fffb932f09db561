"""nnU-Net's recipe parts in the one training loop: deep supervision with mixed precision, remat and
anisotropic pooling, and validation on fixed patches."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from distmis.config import ExperimentConfig
from distmis.data import load_manifest, make_dataset

NNUNET_MODEL = {
    "depth": 3,
    "filters": 4,
    "max_filters": 8,
    "norm": "instance",
    "activation": "leaky_relu",
    "downsample": "strided",
    "deep_supervision": True,
}
NNUNET_SGD = {
    "name": "sgd",
    "lr": 0.01,
    "momentum": 0.99,
    "nesterov": True,
    "weight_decay": 3e-5,
    "global_clipnorm": 12,
}


def test_deep_supervision_trains_with_mixed_precision_and_remat(prepared16: Path) -> None:
    from distmis.training import Trainer

    # the third: nnU-Net's pooling for thick slices, so each head's labels are taken at its own step per axis
    anisotropic = {"pools": [[2, 2, 1], [2, 2, 2]], "kernels": [[3, 3, 1], [3, 3, 3], [3, 3, 3]]}
    for extra in ({}, {"remat": True}, anisotropic):
        config = ExperimentConfig.model_validate(
            {
                "train": {"batch_size_per_replica": 2, "steps_per_epoch": 2, "precision": "mixed_float16"},
                "model": {**NNUNET_MODEL, **extra},
                "optimizer": NNUNET_SGD,
            }
        )
        trainer = Trainer(config, load_manifest(prepared16))
        assert len(trainer.model.outputs) == 2 and len(trainer.eval_model.outputs) == 1
        metrics = trainer.run_epoch()
        assert np.isfinite([metrics.loss, metrics.val_loss, metrics.val_dice]).all()
        assert all(np.isfinite(w).all() for w in trainer.model_weights())


def test_patch_validation_scores_the_same_fixed_patches_every_epoch(prepared16: Path) -> None:
    from distmis.training import Trainer

    manifest = load_manifest(prepared16)
    n_val = manifest.num_cases("val")

    def patches() -> list[np.ndarray]:
        ds = make_dataset(manifest, "val", batch_size=2, training=False, patch=(8, 8, 8), validation_patches=3)
        return [x.numpy() for x, _, _ in ds]

    first, again = patches(), patches()
    assert sum(len(b) for b in first) == 3 * n_val and first[0].shape[1:4] == (8, 8, 8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))

    config = ExperimentConfig.model_validate(
        {
            "train": {"batch_size_per_replica": 2, "steps_per_epoch": 1, "patch": [8, 8, 8], "validation": "patch"},
            "model": {"depth": 2, "filters": 4},
        }
    )
    trainer = Trainer(config, manifest)
    assert trainer.val_patches == config.train.validation_patches
    scores = [trainer.evaluate()[0] for _ in range(2)]  # the same weights, the same patches: the same score
    assert scores[0] == scores[1] and 0 <= scores[0]["val_dice"] <= 1
    whole = Trainer(
        config.model_copy(update={"train": config.train.model_copy(update={"validation": "window"})}), manifest
    )
    assert whole.val_patches == 0 and whole.eval_model is whole.model
