"""Normalisation by modality: CT clipped to the training foreground's range and z-scored with the
dataset's statistics, MRI z-scored per case, recorded in info.json and preprocessing.json."""

from __future__ import annotations

import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from distmis.config import PrepareConfig
from distmis.data import channel_schemes, load_manifest, normalize, prepare_dataset
from distmis.exceptions import DataError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _support.ctdata import write_ct


def test_schemes_by_modality_and_by_choice() -> None:
    assert channel_schemes(["CT", "T1w"]) == ["ct", "zscore"]
    assert channel_schemes(["ct"], "auto") == ["ct"]
    assert channel_schemes(["CT", "T1w"], "zscore") == ["zscore", "zscore"]
    assert channel_schemes(["CT", "T1w"], ["none", "auto"]) == ["none", "zscore"]
    with pytest.raises(DataError, match="2 channel"):
        channel_schemes(["CT", "T1w"], ["ct"])
    with pytest.raises(DataError, match="unknown scheme"):
        channel_schemes(["CT"], "minmax")


def test_ct_is_normalised_by_the_training_foreground_not_per_case(tmp_path: Path) -> None:
    raw = write_ct(tmp_path / "ct")
    manifest = prepare_dataset(raw, tmp_path / "prep", PrepareConfig(shape=(16, 16, 16), split=(0.75, 0.25, 0.0)))
    spec = manifest.preprocessing.normalisation_spec
    assert spec is not None
    assert [c["scheme"] for c in spec] == ["ct"]
    low, high = spec[0]["clip"]
    assert 60 < low < 120 < high < 200  # the lesion's range: air (-1000) and soft tissue are outside it
    # the same record travels with every model trained on it
    info = load_manifest(tmp_path / "prep").info
    assert info.preprocessing.normalisation_spec == spec
    image = np.asarray(nib.load(raw / "imagesTr" / "CT_0.nii.gz").dataobj, np.float32)[..., None]
    out = normalize(image, spec)[..., 0]
    air, water = image[..., 0] == -1000, image[..., 0] == 0
    # air is one value (clipped low), not "background 0"; water at 0 HU is not background either
    assert np.allclose(out[air], (low - spec[0]["mean"]) / spec[0]["std"])
    assert np.all(out[water] == out[air][0])  # below the foreground range: clipped like air
    # the per-case z-score over non-zero voxels (what every channel got before) treated air as
    # foreground and water as background
    old = normalize(image, None)[..., 0]
    assert np.all(old[water] == 0.0) and np.all(old[air] != 0.0)


def test_ct_override_and_recorded_choice(tmp_path: Path) -> None:
    raw = write_ct(tmp_path / "ct", cases=4)
    manifest = prepare_dataset(
        raw, tmp_path / "prep", PrepareConfig(shape=(16, 16, 16), split=(0.75, 0.25, 0.0), normalization="zscore")
    )
    assert manifest.preprocessing.normalisation_spec == [{"scheme": "zscore"}]
    assert manifest.preprocessing.normalisation == "zscore_nonzero_per_channel"
