"""Hostile input, second class: not malformed files but shared state, the environment,
the machine's limits, secrets and headers that lie. Each case is one command a user could type,
run as a user runs it (see conftest.py for the checks every case makes: exit 2, one
``distmis: error:`` line naming what is wrong, every input byte-identical, nothing left behind).

The cases that need two processes at once, a real cluster or a full disk are end-to-end tests of
their own: tests/tuning/test_tune_shared_state.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from _support.raycluster import free_port
from conftest import Assets, Workspace, check_case, fake_search, run_distmis

pytestmark = pytest.mark.slow

CASES: list[tuple[str, str, Callable[[Workspace], tuple]]] = []
#: planted in every URI and command line of the secrets cases; no output may contain it
SECRET = "pw-7f3c9e1b"


def case(group: str) -> Callable:
    def register(fn: Callable) -> Callable:
        CASES.append((fn.__name__, group, fn))
        return fn

    return register


def _closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (one no other process is handed out)."""
    return free_port()


# --------------------------------------------------------------------------- shared state
@case("state")
def resume_with_another_space_file(ws: Workspace):
    original = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", name="first.yaml")
    fake_search(ws, "run", original.read_text())
    other = ws.file("second.yaml", original.read_text().replace("epochs: 1", "epochs: 3").replace("1.0e-2", "5.0e-2"))
    return ["tune", str(other), "--out", "run", "--resume"], "train.epochs"


@case("state")
def resume_from_tune_state_cut_short(ws: Workspace):
    # a search killed while Ray Tune wrote its state: Tune alone would start the search over
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    run = fake_search(ws, "run", space.read_text())
    (run / "tune").mkdir()
    (run / "tune" / "experiment_state-2026-11-01_10-00-00.json").write_text('{"trial_data": [["{\\"status')
    return ["tune", str(space), "--out", "run", "--resume"], "experiment_state-2026-11-01_10-00-00.json"


@case("state")
def resume_from_an_empty_searcher_state(ws: Workspace):
    # what a SIGKILL during Tune's copy of its state left in CI: an empty basic-variant-state
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    run = fake_search(ws, "run", space.read_text())
    (run / "tune").mkdir()
    (run / "tune" / "experiment_state-2026-11-01_10-00-00.json").write_text('{"trial_data": []}')
    (run / "tune" / "basic-variant-state-2026-11-01_10-00-00.json").write_bytes(b"")
    return ["tune", str(space), "--out", "run", "--resume"], "basic-variant-state-2026-11-01_10-00-00.json: "


@case("state")
def resume_with_another_metric(ws: Workspace):
    original = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", name="first.yaml")
    fake_search(ws, "run", original.read_text())
    other = ws.file("second.yaml", original.read_text() + "search: {metric: val_iou}\n")
    return ["tune", str(other), "--out", "run", "--resume"], "search.metric"


@case("state")
def resume_a_comparison_with_tune(ws: Workspace):
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    out = ws.dir / "cmp"
    out.mkdir()
    (out / ".distmis-output").write_text(json.dumps({"written_by": "distmis compare"}) + "\n")
    (out / "compare.json").write_text("{}")
    return ["tune", str(space), "--out", "cmp", "--resume"], "distmis compare"


@case("state")
def resume_a_comparison_mode_with_tune(ws: Workspace):
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    cmp = ws.dir / "cmp"
    cmp.mkdir()
    (cmp / "compare.json").write_text("{}")
    fake_search(ws, "cmp/experiment", space.read_text())
    return ["tune", str(space), "--out", "cmp/experiment", "--resume"], "distmis compare"


# --------------------------------------------------------------------------- the environment
@case("environment")
def stale_ray_address(ws: Workspace):
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    return ["tune", str(space), "--out", "run"], "RAY_ADDRESS", {"RAY_ADDRESS": f"127.0.0.1:{_closed_port()}"}


@case("environment")
def unreachable_address_option(ws: Workspace):
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    return ["tune", str(space), "--out", "run", "--address", f"127.0.0.1:{_closed_port()}"], "--address"


@case("environment")
def predict_into_dev_null(ws: Workspace):
    ws.model()
    ws.raw("data")
    return ["predict", "model", "data/imagesTs", "--out", "/dev/null"], "--out"


@case("environment")
def yaml_merge_key_of_an_undefined_anchor(ws: Workspace):
    ws.file("space.yaml", "train:\n  <<: *defaults\n")
    return ["validate", "space.yaml", "--no-data"], "space.yaml"


# --------------------------------------------------------------------------- secrets
@case("secrets")
def tracking_uri_with_password_unreachable(ws: Workspace):
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    uri = f"http://user:{SECRET}@127.0.0.1:{_closed_port()}"
    return ["tune", str(space), "--out", "run", "--tracking-uri", uri], "127.0.0.1"


@case("secrets")
def job_script_with_a_password(ws: Workspace):
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    cmd = ["distmis", "tune", str(space), "--tracking-uri", f"postgresql://user:{SECRET}@db.example.org/mlflow"]
    return ["cluster", "sbatch", "--no-venv", "--", *cmd], "command argument"


# --------------------------------------------------------------------------- geometry and headers
@case("geometry")
def evaluate_label_flipped_against_its_scan(ws: Workspace):
    ws.model()
    prepared = ws.prepared()
    raw = ws.raw("raw")
    info = json.loads((prepared / "info.json").read_text())
    info["source"]["path"] = str(raw)
    (prepared / "info.json").write_text(json.dumps(info))
    case_id = info["splits"]["test"]["cases"][0]
    label = raw / "labelsTr" / f"{case_id}.nii.gz"
    img = nib.load(label)
    flipped = img.affine.copy()
    flipped[0, 0] = -flipped[0, 0]
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), flipped), label)
    return ["evaluate", "model", "prepared", "--split", "test", "--no-track", "--out", "ev"], label.name


@case("geometry")
def header_claims_a_huge_volume(ws: Workspace):
    raw = ws.raw("data")
    path = raw / "imagesTr" / "CASE_001.nii.gz"
    header = nib.Nifti1Header()
    header.set_data_shape((10000, 10000, 10000, 2))
    header.set_data_dtype(np.float32)
    with open(path.with_suffix(""), "wb") as fh:  # a header and almost no data, compressed below
        fh.write(header.binaryblock + b"\0" * 4 + b"\0" * 64)
    import gzip

    path.write_bytes(gzip.compress(path.with_suffix("").read_bytes()))
    path.with_suffix("").unlink()
    return ["prepare", "data", "out"], "CASE_001"


@case("geometry")
def header_claims_more_than_the_file_holds(ws: Workspace):
    """A claim under the memory bound (400^3 x 4 int16, 512 MB) in a 1.4 kB uncompressed file: refused
    from the file's size, before nibabel allocates the array the header declares."""
    raw = ws.raw("data")
    path = raw / "imagesTr" / "CASE_001.nii.gz"
    path.unlink()
    header = nib.Nifti1Header()
    header.set_data_shape((400, 400, 400, 4))
    header.set_data_dtype(np.int16)
    header["vox_offset"] = 352
    (raw / "imagesTr" / "CASE_001.nii").write_bytes(header.binaryblock + b"\0" * 4 + b"\0" * 1024)
    meta = json.loads((raw / "dataset.json").read_text())
    for entry in meta["training"]:
        if entry["image"].endswith("CASE_001.nii.gz"):
            entry["image"] = entry["image"][: -len(".gz")]
    (raw / "dataset.json").write_text(json.dumps(meta))
    return ["prepare", "data", "out"], "512000000 bytes of voxels, but the 1376-byte file holds 1024 bytes"


@case("geometry")
def finite_values_beyond_float32(ws: Workspace):
    raw = ws.raw("data")
    path = raw / "imagesTr" / "CASE_002.nii.gz"
    img = nib.load(path)
    data = np.asarray(img.dataobj).astype(np.float64)
    data[0, 0, 0, 0] = 1e300
    nib.save(nib.Nifti1Image(data, img.affine), path)
    return ["prepare", "data", "out"], "float32"


@case("geometry")
def symlink_loop_in_the_dataset(ws: Workspace):
    raw = ws.raw("data")
    target = raw / "labelsTr" / "CASE_003.nii.gz"
    target.unlink()
    target.symlink_to(target.name)  # points at itself
    return ["prepare", "data", "out"], "link loop"


@case("labels")
def label_names_that_name_one_metric(ws: Workspace):
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["labels"] = {"0": "background", "1": "tumour", "2": "tumour!"}
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out", "--label-mode", "multiclass"], "val_dice_tumour"


@case("labels")
def label_names_that_differ_only_in_case(ws: Workspace):
    """val_dice_Tumour and val_dice_tumour: one column to a MySQL-backed MLflow, one file on macOS."""
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["labels"] = {"0": "background", "1": "Tumour", "2": "tumour"}
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out", "--label-mode", "multiclass"], "val_dice_Tumour / val_dice_tumour"


@case("labels")
def region_named_as_a_label(ws: Workspace):
    """A multi-class model reports labels and regions side by side: a region called like a label
    would have been dropped from the metrics in silence."""
    raw = ws.raw("data")
    meta = ws.dataset_json(raw)
    meta["labels"] = {"0": "background", "1": "edema", "2": "WT", "3": "enhancing"}
    ws.write_dataset_json(raw, meta)
    return ["prepare", "data", "out", "--label-mode", "multiclass", "--regions", "msd_task01"], "region 'WT'"


# --------------------------------------------------------------------------- the tests
@pytest.mark.parametrize(("case_id", "group", "build"), CASES, ids=[c[0] for c in CASES])
def test_second_class_hostile_input(case_id: str, group: str, build: Callable, assets: Assets, tmp_path: Path) -> None:
    ws_dir = tmp_path / "case"
    ws_dir.mkdir()
    ws = Workspace(ws_dir, assets)
    built = build(ws)
    argv, token = built[0], built[1]
    env = built[2] if len(built) > 2 else None
    check_case(case_id, group, ws, argv, token, env=env)


def test_evaluating_a_split_needs_only_its_own_files(assets: Assets, tmp_path: Path) -> None:
    """A training case's label missing does not stop the evaluation of the test split."""
    ws = Workspace(tmp_path, assets)
    ws.model()
    prepared = ws.prepared()
    raw = ws.raw("raw")
    info = json.loads((prepared / "info.json").read_text())
    info["source"]["path"] = str(raw)
    (prepared / "info.json").write_text(json.dumps(info))
    train_case = info["splits"]["train"]["cases"][0]
    (raw / "labelsTr" / f"{train_case}.nii.gz").unlink()
    result = run_distmis(
        ["evaluate", "model", "prepared", "--split", "test", "--no-track", "--out", "ev"],
        cwd=tmp_path,
        env={"DISTMIS_DATA_HOME": str(tmp_path / "cache")},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["scored"] == len(info["splits"]["test"]["cases"])


def test_a_predict_into_an_output_another_predict_holds_is_refused(assets: Assets, tmp_path: Path) -> None:
    """Two predicts into one directory would leave it holding the cases of two models: while one
    holds ``--out`` (its lock, held here by this test process), the other is refused, writing nothing;
    once it is released, the same command runs and leaves no lock file behind."""
    from distmis.locks import sibling_lock

    ws = Workspace(tmp_path / "case", assets)
    ws.dir.mkdir()
    ws.model()
    ws.raw("data")
    argv = ["predict", "model", "data/imagesTs", "--out", "segs"]
    with sibling_lock(ws.dir / "segs", command="predict", option="--out"):
        check_case(
            "predict_into_a_held_output", "shared state", ws, argv, f"in use by distmis predict (PID {os.getpid()}"
        )
    done = run_distmis(argv, cwd=ws.dir, env={"DISTMIS_DATA_HOME": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in ws.dir.iterdir()) == ["data", "model", "segs"]
    assert len(list((ws.dir / "segs").glob("*.nii.gz"))) == len(list((ws.dir / "data" / "imagesTs").glob("*.nii.gz")))


def test_every_command_keeps_a_planted_password_out_of_its_output(assets: Assets, tmp_path: Path) -> None:
    """The same password in a tracking URI given every way a user gives one; no command prints it."""
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    ws.model()
    closed = _closed_port()
    uri = f"http://user:{SECRET}@127.0.0.1:{closed}"
    pg = f"postgresql://user:{SECRET}@127.0.0.1:{closed}/mlflow"
    env = {"DISTMIS_DATA_HOME": str(tmp_path / "cache")}
    runs = [
        (["tune", str(space), "--out", "a", "--tracking-uri", uri], {}),
        (["tune", str(space), "--out", "b"], {"MLFLOW_TRACKING_URI": uri}),
        (["tune", str(space), "--out", "c", "--tracking-uri", pg], {}),
        (["compare", str(space), "--out", "d", "--slots", "2", "--modes", "experiment", "--tracking-uri", uri], {}),
        (["ui", "--tracking-uri", pg, "--port", str(_closed_port()), "--no-browser"], {}),
        (["doctor"], {"MLFLOW_TRACKING_URI": pg}),
        (["doctor"], {"MLFLOW_TRACKING_URI": uri}),  # probed: its error must not print the password
        (["doctor"], {"RAY_ADDRESS": f"ray://user:{SECRET}@127.0.0.1:{closed}"}),  # a Ray client address
        (["tune", str(space), "--out", "e", "--address", uri], {}),  # a dashboard address given to tune
        (["cluster", "sbatch", "--no-venv", "--", "distmis", "tune", str(space), "--tracking-uri", pg], {}),
        (["validate", str(space), "--no-data"], {"MLFLOW_TRACKING_URI": uri}),
    ]
    query = f"postgresql://127.0.0.1:{closed}/mlflow?sslmode=disable&password={SECRET}"
    runs += [  # a secret in a URI's query string, and in the variables MLflow and databases read
        (["tune", str(space), "--out", "f", "--tracking-uri", query], {}),
        (["tune", str(space), "--out", "g", "--tracking-uri", f"http://127.0.0.1:{closed}/?token={SECRET}"], {}),
        (["cluster", "sbatch", "--no-venv", "--", "distmis", "tune", str(space), "--tracking-uri", query], {}),
        (["doctor"], {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{closed}/?access_token={SECRET}"}),
        (
            ["tune", str(space), "--out", "h", "--tracking-uri", f"http://127.0.0.1:{closed}"],
            {"MLFLOW_TRACKING_PASSWORD": SECRET, "MLFLOW_TRACKING_USERNAME": "user", "MLFLOW_TRACKING_TOKEN": SECRET},
        ),
        (["doctor"], {"MLFLOW_TRACKING_URI": f"postgresql://user@127.0.0.1:{closed}/m", "PGPASSWORD": SECRET}),
    ]
    for argv, extra in runs:
        result = run_distmis(argv, cwd=tmp_path, env={**env, **extra}, timeout=180)
        text = result.stdout + result.stderr
        assert SECRET not in text, f"distmis {' '.join(argv[:2])} printed the password:\n{text[-2000:]}"
        assert "Traceback" not in result.stderr, f"distmis {' '.join(argv[:2])}:\n{result.stderr[-2000:]}"
    for path in tmp_path.rglob("*"):  # nor wrote it: logs, records, job files
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), f"{path} holds the password"
