"""The smaller cases of trust: each one a command a user could type, with one clear error and nothing
changed (conftest.check_case)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from conftest import Assets, Workspace, check_case

pytestmark = pytest.mark.slow


def test_compare_on_a_store_whose_driver_is_missing_leaves_nothing(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    argv = ["compare", str(space), "--out", "cmp", "--modes", "experiment", "--slots", "2"]
    argv += ["--tracking-uri", "mysql://user@127.0.0.1:9/mlflow"]  # no MySQL driver is installed
    check_case("compare_store_driver_missing", "smaller", ws, argv, "unreachable or unusable")


def test_a_scan_with_too_few_channels_names_the_model_that_expects_more(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    ws.model()
    data = np.random.default_rng(0).random((16, 16, 16, 3), dtype=np.float32)
    path = ws.dir / "scans" / "three.nii.gz"
    path.parent.mkdir()
    nib.save(nib.Nifti1Image(data, np.eye(4)), path)
    raw = ws.raw()
    for image in (raw / "imagesTr").glob("*.nii.gz"):
        nib.save(nib.Nifti1Image(data, np.eye(4)), image)
    (raw / "dataset.json").write_text(
        (raw / "dataset.json").read_text().replace('"1": "mod1"', '"1": "mod1", "2": "x"')
    )
    argv = ["evaluate", "model", str(raw), "--split", "all", "--no-track", "--out", "scores"]
    check_case("evaluate_channels_of_the_model", "smaller", ws, argv, "as declared in the model")


def test_a_warmup_as_long_as_the_run_is_refused(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", train="epochs: 2, warmup_epochs: 2")
    check_case("warmup_epochs", "smaller", ws, ["tune", str(space), "--out", "run"], "warmup_epochs (2)")
