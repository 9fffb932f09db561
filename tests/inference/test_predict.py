"""``distmis predict`` / ``evaluate`` on a real trained model, real NIfTI files and real MLflow."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
from _support.smalldisk import small_disk

from distmis.cli import main
from distmis.config import ExperimentConfig
from distmis.data import synth_case

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model16(prepared16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A U-Net trained for a few epochs on 16^3 patches (no normalisation layer: its output depends on the cube only through the receptive field)."""
    from distmis.training import fit

    config = ExperimentConfig.model_validate(
        {
            "name": "m",
            "data": {"source": str(prepared16)},
            "train": {
                "epochs": 12,
                "batch_size_per_replica": 2,
                "threads": 2,
                "augment": {"flip": False, "intensity": 0.0},
            },
            "model": {"depth": 3, "filters": 8, "norm": "none"},
            "optimizer": {"lr": 0.01},
        }
    )
    run = tmp_path_factory.mktemp("model") / "run"
    fit(config, prepared16, run)
    return run / "best"


def _write_case(
    path: Path, shape: tuple[int, int, int], *, channels: int = 4, seed: int = 0, affine: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    image, label = synth_case(shape, channels, np.random.default_rng(seed))
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(image, np.eye(4) if affine is None else affine), str(path))
    return image, label


def _oblique_affine() -> np.ndarray:
    theta = np.deg2rad(20)
    rot = np.array([[np.cos(theta), -np.sin(theta), 0], [np.sin(theta), np.cos(theta), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rot @ np.diag([1.5, 1.0, 2.0])
    affine[:3, 3] = [-40.0, 12.5, 7.0]
    return affine


def test_sliding_window_equals_whole_volume_prediction(model16: Path) -> None:
    from distmis.data import zscore_nonzero
    from distmis.inference import PredictOptions, build_model, make_predict_fn, predict_probabilities, read_model_record

    record = read_model_record(model16)
    predict = make_predict_fn(build_model(record))
    image, _ = synth_case((16, 16, 16), 4, np.random.default_rng(5))
    direct = predict(zscore_nonzero(image)[None])[0]
    # the volume fits one cube: exactly the direct prediction
    windowed = predict_probabilities(image, record, predict, PredictOptions(patch=(16, 16, 16)))
    np.testing.assert_allclose(windowed, direct, atol=1e-5)
    # a volume larger than the cube: overlapping cubes blended vs the whole volume in one pass; only the
    # zero padding at cube borders differs, which Gaussian blending down-weights
    big, _ = synth_case((32, 32, 32), 4, np.random.default_rng(6))
    direct = predict(zscore_nonzero(big)[None])[0]
    windowed = predict_probabilities(big, record, predict, PredictOptions(patch=(24, 24, 24), overlap=0.5))
    assert float(np.abs(windowed - direct).mean()) < 0.005  # measured 0.0008
    assert float(np.mean((windowed > 0.5) == (direct > 0.5))) > 0.995  # measured 0.99997


def test_test_time_mirroring_averages_the_eight_mirrorings(model16: Path) -> None:
    """--tta: the mean of the predictions of the 8 mirrored cubes, mirrored back; so mirroring the
    input mirrors the output exactly, which a plain U-Net does not."""
    from distmis.inference import MIRROR_AXES, build_model, make_predict_fn, read_model_record

    model = build_model(read_model_record(model16))
    plain, mirrored = make_predict_fn(model), make_predict_fn(model, tta=True)
    x = np.random.default_rng(1).normal(size=(2, 16, 16, 16, 4)).astype(np.float32)
    expected = np.mean([np.flip(plain(np.flip(x, axes)), axes) for axes in MIRROR_AXES], axis=0)
    np.testing.assert_allclose(mirrored(x), expected, atol=1e-5)
    flipped = x[:, ::-1, :, ::-1]
    np.testing.assert_allclose(mirrored(flipped)[:, ::-1, :, ::-1], mirrored(x), atol=1e-5)
    assert np.abs(plain(flipped)[:, ::-1, :, ::-1] - plain(x)).max() > 1e-3
    assert mirrored.passes == 8 and mirrored.cubes == 2 + 2 + 2 and mirrored.seconds > 0  # three calls of 2 cubes


def test_predict_keeps_source_geometry_for_a_volume_larger_than_the_patch(model16: Path, tmp_path: Path) -> None:
    src = tmp_path / "in" / "case_oblique.nii.gz"
    _write_case(src, (36, 28, 20), affine=_oblique_affine())  # larger than the 16^3 training patch, uneven
    out = tmp_path / "pred.nii.gz"
    assert main(["predict", str(model16), str(src), "--out", str(out), "--overlap", "0.25", "--batch", "3"]) == 0
    pred, source = nib.load(str(out)), nib.load(str(src))
    assert pred.shape == (36, 28, 20)
    np.testing.assert_allclose(pred.affine, source.affine, atol=1e-5)
    assert pred.header.get_zooms()[:3] == pytest.approx(source.header.get_zooms()[:3])
    assert pred.get_data_dtype() == np.uint8
    assert set(np.unique(np.asarray(pred.dataobj))) <= {0, 1}


def test_resampling_model_predicts_back_in_source_geometry(model16: Path, tmp_path: Path) -> None:
    """A model trained on resampled volumes: the scan is resampled to the recorded shape and the
    probabilities back to the scan's grid."""
    model = tmp_path / "resample-model"
    shutil.copytree(model16, model)
    record = json.loads((model / "preprocessing.json").read_text())
    record.update(resize="resample", shape=[16, 16, 16])
    (model / "preprocessing.json").write_text(json.dumps(record))
    src = tmp_path / "big.nii.gz"
    _, label = _write_case(src, (40, 40, 24), seed=2)
    out = tmp_path / "pred.nii.gz"
    assert main(["predict", str(model), str(src), "--out", str(out)]) == 0
    pred = np.asarray(nib.load(str(out)).dataobj)
    assert pred.shape == (40, 40, 24)
    assert pred.any() and not pred.all()


def test_bad_inputs_fail_per_case_and_exit_nonzero(
    model16: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "imagesTs"
    _write_case(inputs / "good.nii.gz", (16, 16, 16))
    _write_case(inputs / "two_modalities.nii.gz", (16, 16, 16), channels=2)
    _write_case(inputs / "corrupt.nii.gz", (16, 16, 16), seed=1)
    data = (inputs / "corrupt.nii.gz").read_bytes()
    (inputs / "corrupt.nii.gz").write_bytes(data[: len(data) // 2])  # truncated gzip stream
    (inputs / "._good.nii.gz").write_bytes(b"\x00\x05\x16\x07")  # macOS AppleDouble file: skipped
    out = tmp_path / "preds"
    assert main(["predict", str(model16), str(inputs), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "2 case(s) failed" in err
    assert "two_modalities" in err and "expected 4 modalities" in err
    assert "corrupt" in err and "cannot read NIfTI" in err
    # nothing (not even partial files) for the rest; the directory is marked as distmis' output
    assert sorted(p.name for p in out.iterdir()) == [".distmis-output", "good.nii.gz"]

    no_record = tmp_path / "no-record"
    shutil.copytree(model16, no_record)
    (no_record / "preprocessing.json").unlink()
    assert main(["predict", str(no_record), str(inputs / "good.nii.gz"), "--out", str(tmp_path / "x.nii.gz")]) == 2
    assert "missing preprocessing.json" in capsys.readouterr().err
    assert not (tmp_path / "x.nii.gz").exists()
    assert gzip  # (imported for readers: the corruption above is a truncated gzip member)


def _tracked_search(model: Path, tmp_path: Path, experiment: str) -> tuple[Path, Any, str, str]:
    """A tracked search directory as ``distmis tune`` leaves it (``<search>/best`` and
    ``<search>/mlflow.json`` naming a parent run in a SQLite store): (search, client, experiment id, run id)."""
    from mlflow.tracking import MlflowClient

    search = tmp_path / "search"
    shutil.copytree(model, search / "best")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(experiment, artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(experiment_id, run_name="search").info.run_id
    state = {"tracking_uri": uri, "experiment": experiment, "experiment_id": experiment_id, "parent_run_id": parent}
    (search / "mlflow.json").write_text(json.dumps({**state, "trials": {}}))
    return search, client, experiment_id, parent


def test_evaluate_scores_the_test_split_and_logs_to_the_search_run(
    model16: Path, prepared16: Path, tmp_path: Path
) -> None:
    search, client, experiment_id, parent = _tracked_search(model16, tmp_path, "evaltest")
    assert main(["evaluate", str(search / "best"), str(prepared16), "--split", "test"]) == 0
    out = search / "evaluate-test"
    rows = (out / "metrics.csv").read_text().splitlines()
    test_ids = json.loads((prepared16 / "info.json").read_text())["splits"]["test"]["cases"]
    assert [r.split(",")[0] for r in rows[1:]] == test_ids
    assert rows[0].startswith("case_id,dice,iou,hd95_mm,sensitivity,specificity")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scored"] == len(test_ids) and not summary["failed"]
    assert summary["metrics"]["dice"]["mean"] > 0.5, summary["metrics"]  # a trained model, not noise
    assert (out / "cases.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (out / "predictions").iterdir()) == [f"{i}.nii.gz" for i in test_ids]

    runs = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(runs) == 1 and runs[0].info.run_name == "evaluate-test"
    assert runs[0].data.metrics["dice_mean"] == pytest.approx(summary["metrics"]["dice"]["mean"])
    assert {a.path for a in client.list_artifacts(runs[0].info.run_id)} >= {"metrics.csv", "summary.json", "cases.png"}
    # a second evaluation into the same directory is refused, nothing changed
    assert main(["evaluate", str(search / "best"), str(prepared16), "--split", "test"]) == 2


@pytest.mark.parametrize(
    "record",
    [
        {"experiment": "evaltest", "parent_run_id": "0123", "trials": {}},  # no store, no experiment id
        {"tracking_uri": "sqlite:///x.db", "parent_run_id": "0123", "trials": []},  # trials of the wrong type
        "not json {",
    ],
    ids=["fields-missing", "wrong-type", "not-json"],
)
def test_evaluate_of_a_search_with_a_damaged_tracking_record_still_scores(
    record: object,
    model16: Path,
    prepared16: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A hand-edited ``mlflow.json`` costs the evaluation its MLflow run (one warning naming the file), never
    its scores, and the record is left as it was."""
    search = tmp_path / "search"
    shutil.copytree(model16, search / "best")
    state = search / "mlflow.json"
    state.write_text(record if isinstance(record, str) else json.dumps(record))
    before = state.read_bytes()
    assert main(["evaluate", str(search / "best"), str(prepared16), "--split", "test"]) == 0
    said = capfd.readouterr().err + caplog.text
    assert "Traceback" not in said
    assert "evaluation not logged to MLflow" in said and str(state) in said, said
    assert json.loads((search / "evaluate-test" / "summary.json").read_text())["scored"] > 0
    assert state.read_bytes() == before


def test_what_an_evaluation_left_queued_for_mlflow_is_sent_by_the_next_evaluate_there(
    model16: Path, prepared16: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """An evaluation whose store went away keeps its run's operations in ``mlflow_pending.json``; the
    next ``evaluate`` into the same folder (refused, or with --overwrite) delivers them to that run."""
    import time

    search, client, _, _ = _tracked_search(model16, tmp_path, "late")
    command = [sys.executable, "-m", "distmis", "evaluate", str(search / "best"), str(prepared16), "--split", "test"]
    assert subprocess.run(command, capture_output=True, timeout=600).returncode == 0  # an earlier command
    out = search / "evaluate-test"
    first = json.loads((out / "mlflow.json").read_text())["parent_run_id"]
    # what a store that went away before the end leaves behind: the run's last operation, queued
    late = {"op": "metrics", "run": "parent", "step": 0, "metrics": {"late_metric": 1.5}, "timestamp": time.time()}
    (out / "mlflow_pending.json").write_text(json.dumps([late]))

    assert main(["evaluate", str(search / "best"), str(prepared16), "--split", "test"]) == 2  # refused: it exists
    assert client.get_run(first).data.metrics["late_metric"] == 1.5
    assert not (out / "mlflow_pending.json").exists()

    (out / "mlflow_pending.json").write_text(json.dumps([{**late, "metrics": {"later_metric": 2.5}}]))
    assert main(["evaluate", str(search / "best"), str(prepared16), "--split", "test", "--overwrite"]) == 0
    assert client.get_run(first).data.metrics["later_metric"] == 2.5
    second = json.loads((out / "mlflow.json").read_text())["parent_run_id"]
    assert second != first and "later_metric" not in client.get_run(second).data.metrics
    assert not (out / "mlflow_pending.json").exists()

    # a queue that is not one distmis wrote is left as it is, said in one warning naming it
    for damaged in ('[{"op": "metrics", "run": "parent"}]', '[{"op": "drop_table"}]', '{"op": "tags"}', "[1, 2"):
        (out / "mlflow_pending.json").write_text(damaged)
        capfd.readouterr()
        assert main(["evaluate", str(search / "best"), str(prepared16), "--split", "test"]) == 2
        said = capfd.readouterr().err
        assert "Traceback" not in said and "queued MLflow operations are not sent" in said, said
        assert str(out / "mlflow_pending.json") in said, said
        assert (out / "mlflow_pending.json").read_text() == damaged


def test_many_cases_run_as_ray_actors(model16: Path, msd16: Path, tmp_path: Path) -> None:
    from distmis.inference import PredictOptions, plan_jobs, predict_cases

    jobs = plan_jobs(msd16 / "imagesTr", tmp_path / "preds")
    outcomes = predict_cases(model16, jobs, PredictOptions(), workers=2)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    assert [o.case_id for o in outcomes] == [j.case_id for j in jobs]
    assert len({o.worker for o in outcomes}) == 2  # two actors shared the cases
    assert len(list((tmp_path / "preds").glob("*.nii.gz"))) == len(jobs) == 12


def test_multiclass_model_is_scored_per_label(msd16: Path, tmp_path: Path) -> None:
    """A 4-class model (MSD labels 0..3): per-label columns named after dataset.json, label values out."""
    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset
    from distmis.training import fit

    prepared = tmp_path / "prep-multi"
    prepare_dataset(
        msd16,
        prepared,
        PrepareConfig(shape=(16, 16, 16), label_mode="multiclass", split=(0.7, 0.15, 0.15), seed=0),
        workers=1,
    )
    config = ExperimentConfig.model_validate(
        {
            "name": "mc",
            "data": {"source": str(prepared)},
            "train": {"epochs": 2, "batch_size_per_replica": 2, "threads": 2, "loss": "dice_ce"},
            "model": {"depth": 3, "filters": 4, "norm": "none"},
        }
    )
    fit(config, prepared, tmp_path / "run")
    out = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                str(tmp_path / "run" / "best"),
                str(prepared),
                "--split",
                "test",
                "--out",
                str(out),
                "--no-track",
            ]
        )
        == 0
    )
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    for label in ("edema", "non_enhancing_tumor", "enhancing_tumour"):  # metric_suffix of the names
        assert f"dice_{label}" in header and f"hd95_mm_{label}" in header
    pred = np.asarray(nib.load(str(next((out / "predictions").iterdir()))).dataobj)
    assert set(np.unique(pred)) <= {0, 1, 2, 3}


def test_predict_on_an_existing_ray_cluster(model16: Path, msd16: Path, tmp_path: Path) -> None:
    """`--address` of a real `ray start --head` (2 CPUs): one actor per CPU by default, cases shared."""
    import re
    import subprocess
    import sys

    from _support.raycluster import RayHead

    head = RayHead(tmp_path / "ray", host="127.0.0.11", num_cpus=2)
    try:
        out = tmp_path / "preds"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "distmis",
                "predict",
                str(model16),
                str(msd16 / "imagesTr"),
                "--out",
                str(out),
                "--address",
                head.address,
            ],
            env=head.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        head.stop()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(list(out.glob("*.nii.gz"))) == 12
    workers = set(re.findall(r"\[([^\]]+:\d+)\]$", result.stdout, flags=re.M))
    assert len(workers) == 2, result.stdout  # both of the cluster's CPUs predicted cases


def test_a_disk_that_fills_mid_prediction_ends_with_one_error_and_no_partial_file(
    model16: Path, tmp_path: Path
) -> None:
    """A tmpfs of two pages: the directory's marker and one segmentation fit, the next does not.
    One error line naming the path and ENOSPC (not one failure per remaining case), exit 2, and
    every file left is whole."""
    import subprocess
    import sys

    inputs = tmp_path / "scans"
    for i in range(4):
        _write_case(inputs / f"case{i}.nii.gz", (16, 16, 16), seed=10 + i)
    with small_disk(tmp_path / "disk", "8k") as disk:
        result = subprocess.run(
            [sys.executable, "-m", "distmis", "predict", str(model16), str(inputs), "--out", str(disk / "preds")],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1 and "ENOSPC" in errors[0] and str(disk / "preds") in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        left = sorted(p.name for p in (disk / "preds").iterdir()) if (disk / "preds").exists() else []
        assert all(name == ".distmis-output" or not name.startswith(".") for name in left), left  # no temporary
        for name in left:
            if name.endswith(".nii.gz"):
                assert nib.load(disk / "preds" / name).get_fdata().shape == (16, 16, 16)  # whole
        written = [n for n in left if n.endswith(".nii.gz")]
        assert len(written) < 4
        assert not written or ".distmis-output" in left  # what was written is marked: --overwrite may replace it
