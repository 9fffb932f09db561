"""synth -> prepare: layout, determinism, round trip, and every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from distmis.cli import main
from distmis.config import PrepareConfig
from distmis.data import (
    crop_or_pad,
    load_manifest,
    prepare_dataset,
    preprocess_image,
    preprocess_label,
    read_case,
    split_cases,
    write_synthetic_msd,
    zscore_nonzero,
)
from distmis.exceptions import DataError, OutputError


def test_synth_layout_and_determinism(tmp_path: Path) -> None:
    a = write_synthetic_msd(tmp_path / "a", cases=3, shape=(16, 16, 16), test_cases=1, seed=5)
    b = write_synthetic_msd(tmp_path / "b", cases=3, shape=(16, 16, 16), test_cases=1, seed=5)
    meta = json.loads((a / "dataset.json").read_text())
    assert meta["modality"] == {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"}
    assert set(meta["labels"]) == {"0", "1", "2", "3"} and len(meta["training"]) == 3 and len(meta["test"]) == 1
    img = nib.load(a / meta["training"][0]["image"]).get_fdata()
    lab = nib.load(a / meta["training"][0]["label"]).get_fdata()
    assert img.shape == (16, 16, 16, 4) and lab.shape == (16, 16, 16)
    assert set(np.unique(lab)) <= {0, 1, 2, 3} and (lab > 0).any()
    np.testing.assert_array_equal(img, nib.load(b / meta["training"][0]["image"]).get_fdata())
    c = write_synthetic_msd(tmp_path / "c", cases=3, shape=(16, 16, 16), test_cases=1, seed=6)
    assert not np.array_equal(img, nib.load(c / meta["training"][0]["image"]).get_fdata())


def test_split_is_deterministic_and_complete() -> None:
    ids = [f"c{i:02d}" for i in range(20)]
    s1 = split_cases(ids, (0.7, 0.15, 0.15), seed=1)
    assert s1 == split_cases(list(reversed(ids)), (0.7, 0.15, 0.15), seed=1)
    assert s1 != split_cases(ids, (0.7, 0.15, 0.15), seed=2)
    assert sorted(s1["train"] + s1["val"] + s1["test"]) == ids
    assert (len(s1["train"]), len(s1["val"]), len(s1["test"])) == (14, 3, 3)


def test_prepare_roundtrip_reproduces_preprocessed_voxels(msd16: Path, prepared16: Path) -> None:
    manifest = load_manifest(prepared16)
    info = manifest.info
    assert info.shape == (16, 16, 16) and info.channels == 4 and info.num_classes == 1
    assert sum(info.splits[s].num_cases for s in ("train", "val", "test")) == 12
    for record in info.cases.values():
        for entry in (record.files.image, record.files.label, record.files.foreground):
            assert len(entry.sha256) == 64 and (prepared16 / entry.file).is_file()
    case_id, image, label, _ = read_case(prepared16, "val", 0)
    raw = nib.load(msd16 / "imagesTr" / f"{case_id}.nii.gz").get_fdata().astype(np.float32)
    raw_label = nib.load(msd16 / "labelsTr" / f"{case_id}.nii.gz").get_fdata()
    np.testing.assert_allclose(image, preprocess_image(raw, (16, 16, 16), "crop_pad"), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(label, (raw_label > 0).astype(np.uint8))


def test_zscore_over_nonzero_voxels() -> None:
    rng = np.random.default_rng(0)
    img = np.zeros((8, 8, 8, 2), np.float32)
    img[2:6, 2:6, 2:6] = rng.uniform(100, 200, (4, 4, 4, 2))
    out = zscore_nonzero(img)
    inside = out[2:6, 2:6, 2:6]
    np.testing.assert_allclose(inside.mean(axis=(0, 1, 2)), 0, atol=1e-5)
    np.testing.assert_allclose(inside.std(axis=(0, 1, 2)), 1, atol=1e-4)
    assert np.all(out[0] == 0)


def test_crop_pad_and_resample_shapes() -> None:
    vol = np.arange(10 * 6 * 4, dtype=np.float32).reshape(10, 6, 4, 1)
    assert crop_or_pad(vol, (8, 8, 8)).shape == (8, 8, 8, 1)
    assert preprocess_image(vol + 1, (8, 8, 8), "resample").shape == (8, 8, 8, 1)
    lab = (vol[..., 0] > 100).astype(np.uint8) * 3
    out = preprocess_label(lab, (8, 8, 8), "resample", "multiclass")
    assert out.shape == (8, 8, 8) and set(np.unique(out)) <= {0, 3}


def test_3d_single_modality_and_multiclass(tmp_path: Path) -> None:
    src = write_synthetic_msd(tmp_path / "mono", cases=4, shape=(16, 16, 16), modalities=1, test_cases=0, seed=1)
    meta = json.loads((src / "dataset.json").read_text())
    # rewrite the images as plain 3D volumes, like single-modality MSD tasks
    for entry in meta["training"]:
        p = src / entry["image"]
        img = nib.load(p)
        nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[..., 0], img.affine), p)
    info = prepare_dataset(
        src, tmp_path / "out", PrepareConfig(shape=(16, 16, 16), label_mode="multiclass", split=(0.5, 0.25, 0.25))
    )
    assert info.channels == 1 and info.num_classes == 4
    _, image, label, _ = read_case(tmp_path / "out", "train", 0)
    assert image.shape == (16, 16, 16, 1) and label.max() <= 3


def test_appledouble_files_are_ignored(msd16: Path, tmp_path: Path) -> None:
    src = tmp_path / "msd"
    shutil.copytree(msd16, src)
    for sub in ("imagesTr", "labelsTr"):
        (src / sub / "._SYNTH_000.nii.gz").write_bytes(b"\x00\x05\x16\x07 AppleDouble junk")
    info = prepare_dataset(src, tmp_path / "out", PrepareConfig(shape=(16, 16, 16)))
    total = sum(s.num_cases for s in info.splits.values())
    assert total == 12


# ----------------------------------------------------------------------------- bad input
def _corrupt(kind: str, src: Path) -> str:
    """Break a copy of the dataset in one way; return the expected error pattern."""
    meta_path = src / "dataset.json"
    meta = json.loads(meta_path.read_text())
    first = meta["training"][0]
    image, label = src / first["image"], src / first["label"]
    if kind == "no_dataset_json":
        meta_path.unlink()
        return r"dataset\.json: missing"
    if kind == "invalid_json":
        meta_path.write_text("{not json")
        return r"dataset\.json: not valid JSON"
    if kind == "missing_field":
        del meta["modality"]
        meta_path.write_text(json.dumps(meta))
        return r"modality: required, but missing"
    if kind == "listed_file_missing":
        label.unlink()
        return rf"{label.name}: listed in .*dataset\.json but missing"
    if kind == "truncated":
        data = image.read_bytes()
        image.write_bytes(data[: len(data) // 2])
        return rf"{image.name}: cannot read NIfTI"
    if kind == "shape_mismatch":
        lab = nib.load(label)
        nib.save(nib.Nifti1Image(np.zeros((16, 16, 12), np.uint8), lab.affine), label)
        return r"label shape \(16, 16, 12\) does not match image shape \(16, 16, 16\)"
    if kind == "nan_voxels":
        img = nib.load(image)
        arr = np.asarray(img.dataobj, dtype=np.float32).copy()
        arr[3, 3, 3, 1] = np.nan
        nib.save(nib.Nifti1Image(arr, img.affine), image)
        return r"NaN/Inf voxels"
    if kind == "undeclared_label":
        lab = nib.load(label)
        arr = np.asarray(lab.dataobj).copy()
        arr[0, 0, 0] = 7
        nib.save(nib.Nifti1Image(arr, lab.affine), label)
        return r"label values \[7\] are not declared"
    if kind == "modality_count":
        meta["modality"] = {"0": "FLAIR", "1": "T1w"}
        meta_path.write_text(json.dumps(meta))
        return r"expected 2 modalities as declared in dataset\.json, got 4"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "no_dataset_json",
        "invalid_json",
        "missing_field",
        "listed_file_missing",
        "truncated",
        "shape_mismatch",
        "nan_voxels",
        "undeclared_label",
        "modality_count",
    ],
)
def test_bad_input_gives_one_error_and_no_output(
    kind: str, msd16: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    shutil.copytree(msd16, src)
    pattern = _corrupt(kind, src)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=pattern):
        prepare_dataset(src, out, PrepareConfig(shape=(16, 16, 16)), workers=1)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no temp leftovers
    # the CLI turns it into one line and exit code 2
    assert main(["prepare", str(src), str(out), "--shape", "16,16,16", "--processes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distmis: error:")
    assert not out.exists()


def test_out_not_writable(msd16: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(OutputError, match="cannot create output directory|not writable"):
        prepare_dataset(msd16, blocker / "out", PrepareConfig(shape=(16, 16, 16)))


def test_existing_out_is_not_overwritten(msd16: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="already exists"):
        prepare_dataset(msd16, out, PrepareConfig(shape=(16, 16, 16)))
    assert (out / "keep.txt").read_text() == "mine"


def test_cli_synth_prepare_visualize(tmp_path: Path) -> None:
    assert main(["synth", str(tmp_path / "msd"), "--cases", "4", "--shape", "16,16,16", "--test-cases", "0"]) == 0
    assert (
        main(
            [
                "prepare",
                str(tmp_path / "msd"),
                str(tmp_path / "prep"),
                "--shape",
                "16,16,16",
                "--split",
                "0.5,0.25,0.25",
            ]
        )
        == 0
    )
    png, gif = tmp_path / "s.png", tmp_path / "s.gif"
    assert main(["visualize", str(tmp_path / "prep"), "--case", "0", "--out", str(png)]) == 0
    assert main(["visualize", str(tmp_path / "prep"), "--case", "0", "--out", str(gif)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert gif.read_bytes()[:6] in (b"GIF89a", b"GIF87a")
    assert main(["visualize", str(tmp_path / "prep"), "--case", "9", "--out", str(png)]) == 2


def test_the_data_cache_notices_a_source_file_changed_in_place(msd16: Path, tmp_path: Path) -> None:
    """A user who fixes a label in their MSD directory and trains again gets the fixed data: the
    cache key holds each source file's size, modification time and inode."""
    from distmis.config import DataConfig
    from distmis.data import load_manifest, resolve_prepared

    raw = tmp_path / "raw"
    shutil.copytree(msd16, raw)
    data = DataConfig(source=str(raw), cache_dir=str(tmp_path / "cache"), prepare={"shape": [16, 16, 16]})
    first = resolve_prepared(data)
    assert resolve_prepared(data) == first  # unchanged: served from the cache
    label = sorted((raw / "labelsTr").glob("*.nii.gz"))[0]
    fixed = np.asarray(nib.load(label).dataobj).copy()
    fixed[: fixed.shape[0] // 2] = 0  # a mislabelled half cleared
    nib.save(nib.Nifti1Image(fixed, nib.load(label).affine), label)
    second = resolve_prepared(data)
    assert second != first
    case = label.name.removesuffix(".nii.gz")
    files = [load_manifest(p).info.cases[case].files.label.sha256 for p in (first, second)]
    assert files[0] != files[1]
