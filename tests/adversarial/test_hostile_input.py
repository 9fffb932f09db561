"""Hostile input in five groups: each case is one command a user could type.

Groups: ``data-loss`` (an output pointed at an input or a user's own files), ``labels``
(a dataset that would train on wrong labels), ``late-failure`` (what would fail hours into a
search), ``traceback`` (malformed files and options), ``own-files`` (distmis' own outputs
damaged or mismatched). See conftest.py for the four checks every case makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from conftest import Assets, Workspace, check_case, run_distmis

pytestmark = pytest.mark.slow

CASES: list[tuple[str, str, Callable[[Workspace], tuple[list[str], str] | tuple[list[str], str, dict]]]] = []


def case(group: str) -> Callable:
    def register(fn: Callable) -> Callable:
        CASES.append((fn.__name__, group, fn))
        return fn

    return register


def _relabel(path: Path, affine: np.ndarray | None = None, data: np.ndarray | None = None) -> None:
    img = nib.load(path)
    arr = np.asarray(img.dataobj).copy() if data is None else data
    nib.save(nib.Nifti1Image(arr, img.affine if affine is None else affine), path)


def _user_dir(ws: Workspace, name: str = "mine") -> Path:
    d = ws.dir / name
    d.mkdir()
    (d / "notes.txt").write_text("my own notes\n")
    (d / "scan.nii.gz").write_bytes((ws.assets.raw / "imagesTr" / "CASE_000.nii.gz").read_bytes())
    return d


def _train_config(ws: Workspace, source: Path | str, extra: str = "", name: str = "train.yaml") -> Path:
    return ws.file(
        name,
        f"name: t\ndata: {{source: {source}}}\ntrain: {{epochs: 1, batch_size_per_replica: 1}}\n"
        f"model: {{depth: 2, filters: 4, norm: none}}\n{extra}",
    )


# --------------------------------------------------------------------------- 1. losing a user's data
@case("data-loss")
def prepare_source_onto_itself(ws: Workspace):
    ws.raw("data")
    return ["prepare", "data", "data", "--overwrite"], "OUT"


@case("data-loss")
def prepare_onto_parent_of_source(ws: Workspace):
    (ws.dir / "data").mkdir()
    ws.raw("data/mine")
    (ws.dir / "data" / "README.txt").write_text("sibling file of the raw dataset\n")
    return ["prepare", "data/mine", "data", "--overwrite"], "OUT"


@case("data-loss")
def prepare_into_the_source(ws: Workspace):
    ws.raw("data")
    return ["prepare", "data", "data/prepared"], "OUT"


@case("data-loss")
def prepare_overwrite_users_directory(ws: Workspace):
    ws.raw("data")
    _user_dir(ws)
    return ["prepare", "data", "mine", "--overwrite"], "mine"


@case("data-loss")
def synth_overwrite_users_directory(ws: Workspace):
    _user_dir(ws)
    return ["synth", "mine", "--overwrite", "--cases", "2", "--shape", "8"], "mine"


@case("data-loss")
def evaluate_out_is_the_model(ws: Workspace):
    ws.model()
    ws.prepared()
    return ["evaluate", "model", "prepared", "--split", "test", "--out", "model", "--overwrite", "--no-track"], "--out"


@case("data-loss")
def evaluate_out_is_the_data(ws: Workspace):
    ws.model()
    ws.prepared()
    return [
        "evaluate",
        "model",
        "prepared",
        "--split",
        "test",
        "--out",
        "prepared",
        "--overwrite",
        "--no-track",
    ], "--out"


@case("data-loss")
def evaluate_overwrite_users_directory(ws: Workspace):
    ws.model()
    ws.prepared()
    _user_dir(ws)
    return ["evaluate", "model", "prepared", "--split", "test", "--out", "mine", "--overwrite", "--no-track"], "mine"


@case("data-loss")
def predict_into_the_scan_directory(ws: Workspace):
    ws.model()
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "data/imagesTs"], "--out"


@case("data-loss")
def predict_onto_the_scan_file(ws: Workspace):
    ws.model()
    ws.raw("data")
    scan = "data/imagesTs/CASE_006.nii.gz"
    return ["predict", "model", scan, "--out", scan], "--out"


@case("data-loss")
def predict_directory_holding_the_scan(ws: Workspace):
    ws.model()
    ws.raw("data")
    return ["predict", "model", "data/imagesTs/CASE_006.nii.gz", "--out", "data/imagesTs"], "--out"


@case("data-loss")
def predict_over_a_users_file(ws: Workspace):
    ws.model()
    ws.raw("data")
    (ws.dir / "preds").mkdir()
    (ws.dir / "preds" / "CASE_006.nii.gz").write_bytes((ws.dir / "data/imagesTs/CASE_006.nii.gz").read_bytes())
    return ["predict", "model", "data/imagesTs", "--out", "preds", "--overwrite"], "preds/CASE_006.nii.gz"


@case("data-loss")
def predict_into_the_model(ws: Workspace):
    ws.model()
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "model/preds"], "--out"


@case("data-loss")
def train_out_is_the_data(ws: Workspace):
    prepared = ws.prepared()
    cfg = _train_config(ws, prepared)
    return ["train", str(cfg), "--out", "prepared"], "--out"


@case("data-loss")
def train_into_users_directory(ws: Workspace):
    prepared = ws.prepared()
    cfg = _train_config(ws, prepared)
    _user_dir(ws)
    return ["train", str(cfg), "--out", "mine"], "--out"


@case("data-loss")
def tune_out_is_the_data(ws: Workspace):
    path = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    return ["tune", str(path), "--out", "prepared"], "--out"


@case("data-loss")
def tune_into_users_directory(ws: Workspace):
    path = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    _user_dir(ws)
    return ["tune", str(path), "--out", "mine"], "--out"


@case("data-loss")
def compare_out_is_the_data(ws: Workspace):
    path = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    return ["compare", str(path), "--out", "prepared", "--slots", "2", "--modes", "experiment"], "--out"


@case("data-loss")
def visualize_over_users_picture(ws: Workspace):
    ws.prepared()
    ws.file("picture.png", b"\x89PNG\r\n\x1a\nnot really, but mine")
    return ["visualize", "prepared", "--out", "picture.png", "--overwrite"], "--out"


@case("data-loss")
def visualize_into_the_data(ws: Workspace):
    ws.prepared()
    return ["visualize", "prepared", "--out", "prepared/case.png"], "--out"


# --------------------------------------------------------------------------- 2. training on wrong labels
@case("labels")
def label_flipped_left_right(ws: Workspace):
    raw = ws.raw("data")
    flip = np.diag([-1.0, 1.0, 1.0, 1.0])
    flip[0, 3] = 15.0  # same physical extent, x axis reversed
    _relabel(raw / "labelsTr" / "CASE_002.nii.gz", affine=flip)
    return ["prepare", "data", "out"], "labelsTr/CASE_002.nii.gz"


@case("labels")
def label_other_spacing(ws: Workspace):
    raw = ws.raw("data")
    _relabel(raw / "labelsTr" / "CASE_001.nii.gz", affine=np.diag([1.0, 1.0, 2.0, 1.0]))
    return ["prepare", "data", "out"], "labelsTr/CASE_001.nii.gz"


@case("labels")
def label_other_origin(ws: Workspace):
    raw = ws.raw("data")
    shifted = np.eye(4)
    shifted[:3, 3] = [5.0, 0.0, 0.0]
    _relabel(raw / "labelsTr" / "CASE_004.nii.gz", affine=shifted)
    return ["prepare", "data", "out"], "labelsTr/CASE_004.nii.gz"


@case("labels")
def label_value_beyond_uint8(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["labels"]["300"] = "vessel"
    ws.write_dataset_json(raw, meta)
    label = raw / "labelsTr" / "CASE_000.nii.gz"
    arr = np.asarray(nib.load(label).dataobj).astype(np.int16)
    arr[arr == 2] = 300
    _relabel(label, data=arr)
    return ["prepare", "data", "out", "--label-mode", "multiclass"], "dataset.json"


@case("labels")
def absolute_path_in_dataset_json(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["training"][0]["image"] = str(raw / "imagesTr" / "CASE_000.nii.gz")
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("labels")
def path_escaping_the_dataset(ws: Workspace):
    raw = ws.raw("data")
    (ws.dir / "elsewhere").mkdir()
    (ws.dir / "elsewhere" / "x.nii.gz").write_bytes((raw / "labelsTr" / "CASE_000.nii.gz").read_bytes())
    meta = ws.dataset_json(raw)
    meta["training"][1]["label"] = "../elsewhere/x.nii.gz"
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("labels")
def duplicate_key_in_dataset_json(ws: Workspace):
    raw = ws.raw("data")
    text = (raw / "dataset.json").read_text()
    text = text.replace('"labels": {', '"labels": {"0": "background", "1": "tumour"},\n  "labels": {', 1)
    ws.write_dataset_json(raw, text)
    return ["prepare", "data", "out"], "dataset.json"


@case("labels")
def duplicate_key_in_info_json(ws: Workspace):
    prepared = ws.prepared()
    text = (prepared / "info.json").read_text()
    (prepared / "info.json").write_text(
        text.replace('"label_mode":', '"label_mode": "multiclass",\n  "label_mode":', 1)
    )
    path = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", source=str(prepared))
    return ["validate", str(path)], "info.json"


@case("labels")
def duplicate_section_in_yaml(ws: Workspace):
    ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", extra="train: {epochs: 50}\n")
    return ["validate", "space.yaml"], "space.yaml"


@case("labels")
def two_cases_share_a_label(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["training"][3]["label"] = meta["training"][2]["label"]
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("labels")
def a_test_case_is_a_training_case(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["test"].append(meta["training"][0]["image"])
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("labels")
def label_of_another_shape(ws: Workspace):
    raw = ws.raw("data")
    _relabel(raw / "labelsTr" / "CASE_003.nii.gz", data=np.zeros((16, 16, 12), np.uint8))
    return ["prepare", "data", "out"], "labelsTr/CASE_003.nii.gz"


@case("labels")
def undeclared_label_value(ws: Workspace):
    raw = ws.raw("data")
    label = raw / "labelsTr" / "CASE_005.nii.gz"
    arr = np.asarray(nib.load(label).dataobj).copy()
    arr[0, 0, 0] = 7
    _relabel(label, data=arr)
    return ["prepare", "data", "out"], "labelsTr/CASE_005.nii.gz"


@case("labels")
def nan_in_an_image(ws: Workspace):
    raw = ws.raw("data")
    image = raw / "imagesTr" / "CASE_001.nii.gz"
    arr = np.asarray(nib.load(image).dataobj, dtype=np.float32).copy()
    arr[4, 4, 4, 0] = np.nan
    nib.save(nib.Nifti1Image(arr, np.eye(4)), image)
    return ["prepare", "data", "out"], "imagesTr/CASE_001.nii.gz"


@case("labels")
def image_with_wrong_modality_count(ws: Workspace):
    raw = ws.raw("data")
    image = raw / "imagesTr" / "CASE_002.nii.gz"
    arr = np.asarray(nib.load(image).dataobj, dtype=np.float32)[..., :1].copy()
    nib.save(nib.Nifti1Image(arr, np.eye(4)), image)
    return ["prepare", "data", "out"], "imagesTr/CASE_002.nii.gz"


@case("labels")
def damaged_shard_is_named(ws: Workspace):
    prepared = ws.prepared()
    shard = next((prepared / "cases").glob("*.image.b2nd"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return ["visualize", "prepared", "--out", "case.png"], shard.name


@case("labels")
def damaged_shard_before_training(ws: Workspace):
    prepared = ws.prepared()
    train = json.loads((prepared / "info.json").read_text())["splits"]["train"]["cases"][0]
    shard = prepared / "cases" / f"{train}.label.b2nd"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x55
    shard.write_bytes(bytes(data))
    cfg = _train_config(ws, prepared)
    return ["train", str(cfg), "--out", "run"], shard.name


# --------------------------------------------------------------------------- 3. what would fail hours later
@case("late-failure")
def sampled_norm_is_unknown(ws: Workspace):
    return ["validate", str(ws.search("  norm: {choice: [batch, banana]}\n"))], "space.yaml"


@case("late-failure")
def sampled_depth_too_deep(ws: Workspace):
    return ["validate", str(ws.search("  depth: {choice: [2, 11]}\n"))], "space.yaml"


@case("late-failure")
def sampled_dropout_above_one(ws: Workspace):
    return ["validate", str(ws.search("  dropout: {uniform: [0.0, 1.5]}\n"))], "space.yaml"


@case("late-failure")
def sampled_negative_learning_rate(ws: Workspace):
    return ["validate", str(ws.search("  lr: {uniform: [-0.01, 0.01]}\n"))], "space.yaml"


@case("late-failure")
def sampled_groups_do_not_divide_filters(ws: Workspace):
    return ["validate", str(ws.search("  norm: {choice: [group]}\n  groups: {choice: [2, 3]}\n"))], "space.yaml"


@case("late-failure")
def prepared_shape_depth_cannot_halve(ws: Workspace):
    result = run_distmis(["prepare", str(ws.assets.raw), str(ws.dir / "odd"), "--shape", "7,7,7"], cwd=ws.dir)
    assert result.returncode == 0, result.stderr
    path = ws.file(
        "space.yaml",
        f"name: s\ndata: {{source: {ws.dir / 'odd'}}}\ntrain: {{epochs: 1, "
        "batch_size_per_replica: 1}\nmodel: {depth: 3, filters: 4}\n"
        "space:\n  lr: {loguniform: [1.0e-3, 1.0e-2]}\n",
    )
    return ["validate", str(path)], "space.yaml"


@case("late-failure")
def patch_larger_than_prepared(ws: Workspace):
    path = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", train="epochs: 1, patch: [32, 32, 32]")
    return ["validate", str(path)], "space.yaml"


@case("late-failure")
def patch_choice_larger_than_prepared(ws: Workspace):
    return ["validate", str(ws.search("  patch: {choice: [[16, 16, 16], [32, 32, 32]]}\n"))], "space.yaml"


@case("late-failure")
def validation_metric_without_validation_cases(ws: Workspace):
    result = run_distmis(
        ["prepare", str(ws.assets.raw), str(ws.dir / "noval"), "--shape", "16", "--split", "1,0,0"],
        cwd=ws.dir,
    )
    assert result.returncode == 0, result.stderr
    path = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", source=str(ws.dir / "noval"))
    return ["tune", str(path), "--out", "runs/x"], "space.yaml"


@case("late-failure")
def dice_minimised(ws: Workspace):
    return [
        "validate",
        str(ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", extra="search: {metric: val_dice, mode: min}\n")),
    ], "space.yaml"


@case("late-failure")
def grid_beyond_reason(ws: Workspace):
    params = ["lr", "beta_1", "beta_2", "weight_decay", "momentum", "dropout"]
    values = {
        "lr": [1e-4 * (i + 1) for i in range(150)],
        "beta_1": [0.5 + i / 400 for i in range(150)],
        "beta_2": [0.9 + i / 2000 for i in range(150)],
        "weight_decay": [i / 1000 for i in range(150)],
        "momentum": [i / 200 for i in range(150)],
        "dropout": [i / 200 for i in range(150)],
    }
    space = "".join(f"  {p}: {{choice: {values[p]}}}\n" for p in params)
    return ["validate", str(ws.search(space, extra="search: {algorithm: grid}\n"))], "space.yaml"


@case("late-failure")
def grid_beyond_reason_in_tune(ws: Workspace):
    space = "  filters: {randint: [1, 200000]}\n  groups: {randint: [1, 200000]}\n"
    return ["tune", str(ws.search(space, extra="search: {algorithm: grid}\n")), "--out", "runs/g"], "space.yaml"


@case("late-failure")
def list_choices_for_a_scalar_in_grid(ws: Workspace):
    return [
        "validate",
        str(ws.search("  lr: {choice: [[0.1, 0.2], [0.3]]}\n", extra="search: {algorithm: grid}\n")),
    ], "space.yaml"


@case("late-failure")
def condition_that_never_holds(ws: Workspace):
    space = "  norm: {choice: [batch, group]}\n  groups: {choice: [2, 4], when: {norm: grop}}\n"
    return ["validate", str(ws.search(space))], "space.yaml"


@case("late-failure")
def tune_refuses_bad_space_before_ray(ws: Workspace):
    return ["tune", str(ws.search("  depth: {choice: [2, 11]}\n")), "--out", "runs/x"], "space.yaml"


@case("late-failure")
def train_patch_larger_than_data(ws: Workspace):
    cfg = _train_config(ws, ws.prepared(), extra="")
    cfg.write_text(
        cfg.read_text().replace("batch_size_per_replica: 1}", "batch_size_per_replica: 1, patch: [32, 32, 32]}")
    )
    return ["train", str(cfg), "--out", "run"], "train.yaml"


@case("late-failure")
def global_batch_larger_than_training_split(ws: Workspace):
    path = ws.search("  batch_size_per_replica: {choice: [1, 64]}\n")
    return ["validate", str(path)], "space.yaml"


# --------------------------------------------------------------------------- 4. malformed files and options
def _sform_only(path: Path, sform: np.ndarray) -> None:
    """Rewrite ``path`` with ``sform`` as its only affine (nibabel writes no singular qform)."""
    img = nib.load(path)
    header = img.header.copy()
    header.set_qform(None, code=0)
    header.set_sform(sform, code=1)
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), None, header), path)


@case("traceback")
def image_with_a_voxel_axis_of_no_length(ws: Workspace):
    # image and label agree, so no alignment check stands in for the affine's own
    raw = ws.raw("data")
    for part in ("imagesTr", "labelsTr"):
        _sform_only(raw / part / "CASE_001.nii.gz", np.diag([1.0, 1.0, 0.0, 1.0]))
    return ["inspect", "data", "--out", "fingerprint"], "imagesTr/CASE_001.nii.gz"


@case("traceback")
def case_with_voxel_axes_in_one_plane(ws: Workspace):
    raw = ws.raw("data")
    flat = np.eye(4)
    flat[:3, 2] = [1.0, 1.0, 0.0]  # the third voxel axis lies in the plane of the first two
    for part in ("imagesTr", "labelsTr"):
        _sform_only(raw / part / "CASE_002.nii.gz", flat)
    return ["prepare", "data", "out"], "imagesTr/CASE_002.nii.gz"


@case("traceback")
def dataset_json_training_is_a_number(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["training"] = 5
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("traceback")
def dataset_json_image_is_null(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["training"][2]["image"] = None
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("traceback")
def dataset_json_test_entries_are_objects(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["test"] = [{"image": p} for p in meta["test"]]
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("traceback")
def dataset_json_nested_200k_deep(ws: Workspace):
    raw = ws.raw("data")
    ws.write_dataset_json(raw, "[" * 200_000 + "]" * 200_000)
    return ["prepare", "data", "out"], "dataset.json"


@case("traceback")
def dataset_json_is_a_list(ws: Workspace):
    raw = ws.raw("data")
    ws.write_dataset_json(raw, "[]")
    return ["prepare", "data", "out"], "dataset.json"


@case("traceback")
def dataset_json_modality_keys_not_numbers(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["modality"] = {"a": "FLAIR", "b": "T1"}
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out"], "dataset.json"


@case("traceback")
def info_json_shape_is_a_word(ws: Workspace):
    prepared = ws.prepared()
    info = json.loads((prepared / "info.json").read_text())
    info["shape"] = "big"
    (prepared / "info.json").write_text(json.dumps(info))
    return ["validate", str(ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", source=str(prepared)))], "info.json"


@case("traceback")
def info_json_splits_is_a_list(ws: Workspace):
    prepared = ws.prepared()
    info = json.loads((prepared / "info.json").read_text())
    info["splits"] = [info["splits"]["train"]]
    (prepared / "info.json").write_text(json.dumps(info))
    return ["visualize", "prepared", "--out", "case.png"], "info.json"


@case("traceback")
def info_json_shard_outside_directory(ws: Workspace):
    prepared = ws.prepared()
    info = json.loads((prepared / "info.json").read_text())
    first = info["splits"]["train"]["cases"][0]
    info["cases"][first]["files"]["image"]["file"] = "../../etc/passwd"
    (prepared / "info.json").write_text(json.dumps(info))
    return ["visualize", "prepared", "--out", "case.png"], "info.json"


@case("traceback")
def preprocessing_json_of_wrong_types(ws: Workspace):
    model = ws.model()
    record = json.loads((model / "preprocessing.json").read_text())
    record["num_classes"] = "two"
    record["shape"] = None
    (model / "preprocessing.json").write_text(json.dumps(record))
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds"], "preprocessing.json"


@case("traceback")
def preprocessing_json_is_a_string(ws: Workspace):
    model = ws.model()
    (model / "preprocessing.json").write_text('"crop_pad"')
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds"], "preprocessing.json"


@case("traceback")
def yaml_not_utf8(ws: Workspace):
    ws.file("space.yaml", "name: caf\xe9\nspace:\n  lr: {loguniform: [0.001, 0.01]}\n".encode("latin-1"))
    return ["validate", "space.yaml"], "space.yaml"


@case("traceback")
def yaml_alias_bomb(ws: Workspace):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    ws.file("space.yaml", "\n".join(lines) + "\n")
    return ["validate", "space.yaml"], "space.yaml"


@case("traceback")
def yaml_not_a_mapping(ws: Workspace):
    ws.file("space.yaml", "- just\n- a list\n")
    return ["tune", "space.yaml"], "space.yaml"


@case("traceback")
def negative_workers(ws: Workspace):
    ws.raw("data")
    return ["prepare", "data", "out", "--processes", "-2"], "--processes"


@case("traceback")
def negative_seed(ws: Workspace):
    ws.raw("data")
    return ["prepare", "data", "out", "--seed", "-1"], "--seed"


@case("traceback")
def split_that_does_not_sum_to_one(ws: Workspace):
    ws.raw("data")
    return ["prepare", "data", "out", "--split", "0.7,0.7,0.1"], "--split"


@case("traceback")
def out_name_too_long(ws: Workspace):
    ws.raw("data")
    return ["prepare", "data", "x" * 300], "OUT"


@case("traceback")
def tensorflow_missing(ws: Workspace):
    prepared = ws.prepared()  # prepare itself needs no TensorFlow; training does
    blocker = ws.dir.parent / f"{ws.dir.name}-notf"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoTF:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'keras'):\n"
        "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
        "sys.meta_path.insert(0, _NoTF())\n"
    )
    return (
        ["train", str(_train_config(ws, prepared)), "--out", "run"],
        "pip install 'distmis[cpu]'",
        {"PYTHONPATH": str(blocker)},
    )


@case("traceback")
def visualize_out_exists(ws: Workspace):
    ws.prepared()
    ws.file("case.png", b"earlier picture")
    return ["visualize", "prepared", "--out", "case.png"], "--out"


@case("traceback")
def visualize_out_is_a_directory(ws: Workspace):
    ws.prepared()
    (ws.dir / "adir").mkdir()
    return ["visualize", "prepared", "--out", "adir"], "--out"


@case("traceback")
def visualize_case_out_of_range(ws: Workspace):
    ws.prepared()
    return ["visualize", "prepared", "--case", "99", "--out", "case.png"], "--case"


@case("traceback")
def predict_overlap_out_of_range(ws: Workspace):
    ws.model()
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds", "--overlap", "1.5"], "--overlap"


@case("traceback")
def predict_batch_zero(ws: Workspace):
    ws.model()
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds", "--batch", "0"], "--batch"


@case("traceback")
def predict_patch_not_a_multiple(ws: Workspace):
    ws.model()
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds", "--patch", "7"], "--patch"


@case("traceback")
def predict_text_file(ws: Workspace):
    ws.model()
    ws.file("notes.txt", "not a scan\n")
    return ["predict", "model", "notes.txt", "--out", "pred.nii.gz"], "notes.txt"


@case("traceback")
def evaluate_unknown_split(ws: Workspace):
    ws.model()
    ws.prepared()
    return ["evaluate", "model", "prepared", "--split", "holdout", "--out", "ev", "--no-track"], "--split"


@case("traceback")
def tune_negative_sample_count(ws: Workspace):
    return ["tune", str(ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")), "--num-samples", "-3"], "--num-samples"


@case("traceback")
def train_zero_epochs(ws: Workspace):
    cfg = _train_config(ws, ws.prepared())
    return ["train", str(cfg), "--epochs", "0"], "--epochs"


@case("traceback")
def config_file_missing(ws: Workspace):
    return ["validate", "nowhere.yaml"], "nowhere.yaml"


@case("traceback")
def ui_port_out_of_range(ws: Workspace):
    return ["ui", "--port", "70000"], "--port"


@case("traceback")
def compare_zero_workers(ws: Workspace):
    return ["compare", str(ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")), "--slots", "0"], "--slots"


@case("traceback")
def synth_absurd_shape(ws: Workspace):
    return ["synth", "big", "--shape", "100000"], "--shape"


# --------------------------------------------------------------------------- 5. distmis' own files gone bad
@case("own-files")
def weights_of_another_model(ws: Workspace):
    model = ws.model()
    with np.load(model / "weights.npz") as data:
        arrays = {k: data[k] for k in data.files}
    first = sorted(arrays)[0]
    arrays[first.replace("model/", "model/renamed_")] = arrays.pop(first)  # a variable the model does not have
    with open(model / "weights.npz", "wb") as fh:
        np.savez(fh, **arrays)
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds"], "weights.npz"


@case("own-files")
def weights_truncated(ws: Workspace):
    model = ws.model()
    data = (model / "weights.npz").read_bytes()
    (model / "weights.npz").write_bytes(data[: len(data) // 3])
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds"], "weights.npz"


@case("own-files")
def weights_of_another_shape(ws: Workspace):
    model = ws.model()
    with np.load(model / "weights.npz") as data:
        arrays = {k: data[k] for k in data.files}
    key = next(k for k in sorted(arrays) if arrays[k].ndim == 5)
    arrays[key] = np.zeros(arrays[key].shape[:-1] + (arrays[key].shape[-1] + 1,), arrays[key].dtype)
    with open(model / "weights.npz", "wb") as fh:
        np.savez(fh, **arrays)
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds"], "weights.npz"


@case("own-files")
def model_config_damaged(ws: Workspace):
    model = ws.model()
    (model / "config.yaml").write_text("model: {depth: lots}\n")
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "preds"], "config.yaml"


@case("own-files")
def checkpoint_state_damaged(ws: Workspace):
    import shutil

    run = Path(shutil.copytree(ws.assets.root / "run", ws.dir / "run"))
    (run / "checkpoint" / "state.json").write_text('{"epoch": "one"')
    cfg = _train_config(ws, ws.prepared(), extra="")
    cfg.write_text(cfg.read_text().replace("epochs: 1", "epochs: 2"))
    return ["train", str(cfg), "--out", "run", "--resume"], "state.json"


@case("own-files")
def checkpoint_of_another_model(ws: Workspace):
    import shutil

    run = Path(shutil.copytree(ws.assets.root / "run", ws.dir / "run"))
    cfg = _train_config(ws, ws.prepared())
    cfg.write_text(cfg.read_text().replace("filters: 4", "filters: 8").replace("epochs: 1", "epochs: 2"))
    assert (run / "checkpoint" / "state.npz").is_file()
    return ["train", str(cfg), "--out", "run", "--resume"], "checkpoint"


# --------------------------------------------------------------------------- the test
@pytest.mark.parametrize(("case_id", "group", "build"), CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case_id: str, group: str, build: Callable, assets: Assets, tmp_path: Path) -> None:
    ws_dir = tmp_path / "case"
    ws_dir.mkdir()
    ws = Workspace(ws_dir, assets)
    built = build(ws)
    argv, token = built[0], built[1]
    env = built[2] if len(built) > 2 else None
    check_case(case_id, group, ws, argv, token, env=env)


def test_there_are_enough_cases() -> None:
    groups = {g for _, g, _ in CASES}
    assert len(CASES) >= 60 and groups == {"data-loss", "labels", "late-failure", "traceback", "own-files"}
