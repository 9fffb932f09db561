"""``distmis init``: a search file planned from the data, each rule visible, and never over a user's file."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from conftest import Assets, Workspace, check_case, run_distmis, write_msd

pytestmark = pytest.mark.slow


def _plan(tmp_path: Path, raw: Path, *extra: str) -> dict:
    result = run_distmis(["init", str(raw), "--out", "plan.yaml", *extra], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "plan.yaml").read_text()
    assert text.startswith("# written by distmis init")
    valid = run_distmis(["validate", "plan.yaml"], cwd=tmp_path)
    assert valid.returncode == 0, valid.stdout[-2000:] + valid.stderr[-2000:]
    return yaml.safe_load(text)


def test_the_plan_follows_the_data(tmp_path: Path) -> None:
    """Two foreground labels -> multi-class with Dice + CE; a volume that fits -> the whole volume as
    the patch; a small GPU -> a smaller patch with foreground oversampling; the source is the data."""
    raw = write_msd(tmp_path / "raw", cases=6, shape=(48, 40, 36))
    plan = _plan(tmp_path, raw)
    assert plan["data"]["source"] == "raw"
    assert plan["data"]["prepare"]["label_mode"] == "multiclass" and plan["train"]["loss"] == "dice_ce"
    assert plan["data"]["prepare"]["shape"] == [48, 40, 36]
    assert plan["train"]["patch"] == [48, 40, 36] and plan["train"]["foreground_oversampling"] == 0.0
    assert plan["model"]["norm"] == "group"
    assert plan["parallelism"]["gpus_per_worker"] == 0
    small = _plan(tmp_path, raw, "--gpu-memory", "0.02", "--overwrite")
    patch = small["train"]["patch"]
    assert all(p <= s for p, s in zip(patch, [48, 40, 36], strict=True)) and patch != [48, 40, 36]
    assert small["train"]["foreground_oversampling"] > 0 and small["parallelism"]["gpus_per_worker"] == 1


def test_one_label_plans_a_binary_dice_search(tmp_path: Path) -> None:
    raw = write_msd(tmp_path / "raw", cases=4, shape=(16, 16, 16))
    meta = json.loads((raw / "dataset.json").read_text())
    meta["labels"] = {"0": "background", "1": "lesion"}
    (raw / "dataset.json").write_text(json.dumps(meta))
    for entry in meta["training"]:
        path = raw / entry["label"]
        label = np.asarray(nib.load(path).dataobj)
        nib.save(nib.Nifti1Image((label > 0).astype(np.uint8), np.eye(4)), path)
    plan = _plan(tmp_path, raw)
    assert plan["data"]["prepare"]["label_mode"] == "binary" and plan["train"]["loss"] == "dice"


def test_brats_labels_plan_the_tumour_regions(tmp_path: Path) -> None:
    result = run_distmis(["synth", "brats", "--cases", "4", "--shape", "16,16,16"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = _plan(tmp_path, tmp_path / "brats")
    assert plan["data"]["regions"] == "msd_task01" and plan["data"]["prepare"]["label_mode"] == "regions"


def test_init_never_replaces_a_file_it_did_not_write(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    ws.raw("data")
    ws.file("mine.yaml", "name: my own search\n")
    check_case("init-over-own", "init", ws, ["init", "data", "--out", "mine.yaml", "--overwrite"], "mine.yaml")
    check_case("init-exists", "init", ws, ["init", "data", "--out", "mine.yaml"], "--overwrite")
    check_case("init-into-data", "init", ws, ["init", "data", "--out", "data/plan.yaml"], "inside the dataset")
    check_case("init-no-dataset", "init", ws, ["init", "nothere", "--out", "x.yaml"], "nothere")
    (ws.dir / "link.yaml").symlink_to(ws.dir / "mine.yaml")
    check_case("init-through-link", "init", ws, ["init", "data", "--out", "link.yaml"], "link.yaml")
