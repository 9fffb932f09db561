"""distmis finalize: folds, fold trainings as trials, the ensemble in final/, resume, bad input."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from _support.processes import descendants, stop_tree
from _support.raycluster import clean_env, stop_group
from _support.searchfiles import finished_trial, write_summary

from distmis.data import Manifest, cv_cases, fold_groups, fold_view, load_manifest, make_dataset, read_case

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))
from test_search import space_file

#: a finalize killed mid-fold needs a fold still queued behind the two that train at once
FOLDS = 3
#: the ensemble the other tests read: 2 folds train 2 configurations in 4 fold trainings, not 6
ENSEMBLE_FOLDS = 2


def _distmis(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distmis", *args], env=clean_env(), capture_output=True, text=True, timeout=timeout
    )


def test_folds_are_disjoint_cover_train_and_validation_and_never_the_test_split(prepared16: Path) -> None:
    manifest = load_manifest(prepared16)
    usable = sorted(manifest.cases("train") + manifest.cases("val"))
    groups = fold_groups(cv_cases(manifest), FOLDS, seed=0)
    assert sorted(c for g in groups for c in g) == usable  # every train + validation case, once
    assert all(not set(a) & set(b) for i, a in enumerate(groups) for b in groups[i + 1 :])
    assert not set(manifest.cases("test")) & set(usable)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert fold_groups(cv_cases(manifest), FOLDS, seed=0) == groups  # deterministic
    for index, group in enumerate(groups):
        view = fold_view(manifest, index, FOLDS, 0)
        assert view.cases("val") == group
        assert sorted(view.cases("train")) == sorted(set(usable) - set(group))
        # the loader reads exactly the fold's cases: compare the volumes with each case's own
        wanted = {read_case(prepared16, *_where(manifest, c))[1].tobytes() for c in group}
        batches = make_dataset(view, "val", batch_size=1, training=False)
        assert {x.numpy()[0].tobytes() for x, _, _ in batches} == wanted


def _where(manifest: Manifest, case: str) -> tuple[str, int]:
    split = next(s for s in ("train", "val") if case in manifest.cases(s))
    return split, manifest.cases(split).index(case)


@pytest.fixture(scope="module")
def search(prepared16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("finalize")
    path = space_file(
        tmp,
        prepared16,
        name="fin",
        algorithm="random",
        samples=3,
        epochs=2,
        concurrency=2,
        space={"lr": {"loguniform": [5.0e-3, 2.0e-2]}, "norm": {"choice": ["group", "none"]}},
    )
    out = tmp / "runs" / "fin"
    result = _distmis("tune", str(path), "--out", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out


@pytest.mark.slow
def test_finalize_chooses_by_cross_validation_and_writes_an_ensemble(search: Path, tmp_path: Path) -> None:
    result = _distmis("finalize", str(search), "--top", "2", "--folds", str(ENSEMBLE_FOLDS))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out, final = search / "finalize", search / "final"
    assert not (out / "results.csv").exists()  # a finalize writes cv.csv, not a search's results
    cv = list(csv.DictReader(open(out / "cv.csv")))
    assert {r["configuration"] for r in cv} == {"c0", "c1"}
    assert len(cv) == 2 * sum(
        1 for _ in cv_cases(load_manifest(json.loads((search / "summary.json").read_text())["prepared"]))
    )
    for name in ("report.md", "report.html", "plots/cv_boxplot.png", "plots/selection_bias.png"):
        assert (out / name).is_file(), name
    report = (out / "report.md").read_text()
    assert "selection bias" in report.lower() and "Chosen:" in report
    ensemble = json.loads((final / "ensemble.json").read_text())
    selection = json.loads((final / "selection.json").read_text())
    assert len(ensemble["members"]) == ENSEMBLE_FOLDS * len(selection["members"])
    assert ensemble["tta"] is True
    for member in ensemble["members"]:
        assert (final / member / "weights.npz").is_file() and (final / member / "config.yaml").is_file()
    assert (final / "preprocessing.json").is_file() and (final / "config.yaml").is_file()
    # MLflow: a finalize run nested under the search's parent, one child per fold training
    from mlflow.tracking import MlflowClient

    state = json.loads((search / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{search.parent / 'mlflow.db'}")
    runs = client.search_runs([state["experiment_id"]])
    finalize = [r for r in runs if r.data.tags.get("distmis.role") == "finalize"]
    assert len(finalize) == 1 and finalize[0].data.tags["mlflow.parentRunId"] == state["parent_run_id"]
    folds = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == finalize[0].info.run_id]
    assert len(folds) == 2 * ENSEMBLE_FOLDS and all(r.info.status == "FINISHED" for r in folds)
    assert finalize[0].info.status == "FINISHED"
    # the one honest test score, and predict keeping the source geometry
    evaluated = _distmis("evaluate", str(final), "--split", "test")
    assert evaluated.returncode == 0, evaluated.stdout[-2000:] + evaluated.stderr[-2000:]
    summary = json.loads((search / "evaluate-final-test" / "summary.json").read_text())
    assert summary["scored"] == 2 and summary["options"]["tta"] is True
    # the search's best model is evaluated beside it, into its own folder, not refused as taken
    best = _distmis("evaluate", str(search / "best"), "--split", "test")
    assert best.returncode == 0, best.stdout[-2000:] + best.stderr[-2000:]
    assert json.loads((search / "evaluate-test" / "summary.json").read_text())["model"] != summary["model"]
    raw = Path(load_manifest(json.loads((search / "summary.json").read_text())["prepared"]).info.source.path)
    scan = next((raw / "imagesTs").glob("*.nii.gz"))
    predicted = _distmis("predict", str(final), str(scan), "--out", str(tmp_path / "pred.nii.gz"))
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    assert "network passes per cube" in predicted.stdout
    pred, image = nib.load(tmp_path / "pred.nii.gz"), nib.load(scan)
    assert pred.shape == image.shape[:3]
    np.testing.assert_allclose(pred.affine, image.affine, atol=1e-6)


@pytest.mark.slow
def test_a_final_with_a_member_missing_its_weights_is_refused_by_name(search: Path, tmp_path: Path) -> None:
    final = _final_of(search)
    broken = tmp_path / "final"
    shutil.copytree(final, broken)
    member = json.loads((broken / "ensemble.json").read_text())["members"][1]
    (broken / member / "weights.npz").unlink()
    raw = Path(load_manifest(json.loads((search / "summary.json").read_text())["prepared"]).info.source.path)
    result = _distmis("predict", str(broken), str(raw / "imagesTs"), "--out", str(tmp_path / "preds"))
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert len(errors) == 1 and member in errors[0] and "weights.npz" in errors[0], errors
    assert not (tmp_path / "preds").exists()
    (broken / member / "weights.npz").write_bytes(b"not an archive")  # present but damaged
    result = _distmis("evaluate", str(broken), "--split", "test", "--out", str(tmp_path / "ev"), "--no-track")
    assert result.returncode == 2 and member in result.stderr and "weights" in result.stderr, result.stderr[-1500:]


@pytest.mark.slow
def test_a_finalize_killed_mid_fold_resumes_without_training_a_fold_twice(search: Path, tmp_path: Path) -> None:
    out = tmp_path / "finalize"
    log = tmp_path / "finalize.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distmis", "finalize", str(search), "--top", "1", "--folds", str(FOLDS), "--out",
         str(out), "--no-tta", "--overwrite"],
        env=clean_env(PYTHONUNBUFFERED="1"),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip

    def rows(path: Path) -> int:
        return len(list(csv.DictReader(open(path))))

    finished: dict[Path, str] = {}
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            done = [m for m in out.glob("trials/*/metrics.csv") if rows(m) >= 2]
            started = list(out.glob("trials/*/metrics.csv"))
            if done and len(started) > len(done):  # one fold finished, another one training
                finished = {m: m.read_text() for m in done}
                break
            time.sleep(0.2)
        assert finished, f"no fold finished while another trained; see {log}"
        tree = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        stop_group(proc, timeout=5)
        stop_tree(tree)  # its Ray workers too (each in a process group of its own): nothing writes any more
    # a choice other than the recorded one is refused, naming it, and the finalize is left as it was
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = _distmis("finalize", str(search), "--resume", "--out", str(out), "--folds", str(FOLDS + 1), "--no-tta")
    errors = [line for line in other.stderr.splitlines() if line.startswith("distmis: error:")]
    assert other.returncode == 2 and len(errors) == 1, other.stdout[-1500:] + other.stderr[-1500:]
    assert f"--folds {FOLDS + 1}" in errors[0] and f"--folds {FOLDS}" in errors[0], errors[0]
    assert "--no-tta" not in errors[0]  # the recorded finalize had --no-tta too: not a difference
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert sorted(str(p) for p in after.keys() ^ before.keys() | {p for p in before if after.get(p) != before[p]}) == []
    resumed = _distmis("finalize", str(search), "--resume", "--out", str(out), "--overwrite")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for path, text in finished.items():  # a finished fold was not trained again
        assert path.read_text() == text
    folds = [m for m in out.glob("trials/*/metrics.csv") if rows(m) == 2]
    assert len(folds) >= FOLDS
    from mlflow.tracking import MlflowClient

    state = json.loads((out / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{search.parent / 'mlflow.db'}")
    for trial in state["trials"].values():
        if trial.get("run_id") and trial.get("finished"):
            steps = [m.step for m in client.get_metric_history(trial["run_id"], "val_dice")]
            assert len(steps) == len(set(steps)), steps  # no epoch logged twice


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["--top", "9", "--folds", "3"], "--top 9"),
        (["--top", "1", "--folds", "99"], "--folds 99"),
        (["--top", "1", "--folds", "1"], "--folds 1"),
    ],
)
def test_finalize_refuses_what_the_search_cannot_give(search: Path, args: list[str], token: str) -> None:
    result = _distmis("finalize", str(search), *args, "--out", str(search.parent / "never"))
    assert result.returncode == 2, result.stderr[-1500:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert len(errors) == 1 and token in errors[0], errors
    assert not (search.parent / "never").exists()


@pytest.mark.slow
def test_the_search_files_finalize_section_fills_in_what_the_command_line_leaves(search: Path, tmp_path: Path) -> None:
    """``distmis init --finalize`` plans finalize in the search file: finalize takes those choices
    where its options are silent, and an option given wins over the file."""
    import yaml

    from distmis.finalize import FinalizeOptions, plan_finalize
    from distmis.schema import RunFile

    planned = tmp_path / "planned"
    shutil.copytree(search, planned, ignore=shutil.ignore_patterns("finalize", "final", "trials", "plots"))
    doc = yaml.safe_load((planned / RunFile.SEARCH_FILE).read_text())
    doc["finalize"] = {"top": 1, "folds": 3, "pairs": False}
    (planned / RunFile.SEARCH_FILE).write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = plan_finalize(FinalizeOptions(run=planned, out=tmp_path / "fin"))
    assert (len(plan.candidates), plan.folds, plan.pairs, plan.tta) == (1, 3, False, True)
    given = plan_finalize(FinalizeOptions(run=planned, out=tmp_path / "fin", folds=2, top=2))
    assert (len(given.candidates), given.folds, given.pairs) == (2, 2, False)
    # the module's search may hold another test's final/ by now: this plan's model goes elsewhere
    plain = plan_finalize(FinalizeOptions(run=search, out=tmp_path / "plain", final=tmp_path / "plain-final"))
    assert (len(plain.candidates), plain.folds, plain.pairs) == (2, 5, True)
    assert not any((tmp_path / name).exists() for name in ("fin", "plain", "plain-final"))  # planning writes nothing
    # a planned choice the data cannot give is refused naming the file's key, not an option never typed
    doc["finalize"] = {"folds": 99}
    (planned / RunFile.SEARCH_FILE).write_text(yaml.safe_dump(doc, sort_keys=False))
    result = _distmis("finalize", str(planned), "--out", str(tmp_path / "never"))
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-1500:]
    assert f"{planned / RunFile.SEARCH_FILE}: finalize.folds 99 (or give --folds):" in errors[0], errors
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
def test_finalize_of_a_run_without_results_is_refused(search: Path, tmp_path: Path) -> None:
    unfinished = tmp_path / "unfinished"
    shutil.copytree(search, unfinished, ignore=shutil.ignore_patterns("results.csv", "finalize", "final"))
    result = _distmis("finalize", str(unfinished), "--top", "1", "--folds", "2")
    assert result.returncode == 2 and "without results" in result.stderr, result.stderr[-1500:]


def test_finalize_refuses_a_fold_whose_validation_cases_lack_a_class(tmp_path: Path) -> None:
    """Class 2 is in one case only: with 3 folds, two folds would validate without it."""
    raw = tmp_path / "raw"
    for sub in ("imagesTr", "labelsTr"):
        (raw / sub).mkdir(parents=True)
    training = []
    for i in range(6):
        label = np.zeros((8, 8, 8), np.uint8)
        label[2:6, 2:6, 2:6] = 1
        if i == 0:
            label[3:5, 3:5, 3:5] = 2
        image = (label * 50.0 + 100.0).astype(np.float32)
        nib.save(nib.Nifti1Image(image, np.eye(4)), raw / "imagesTr" / f"C{i}.nii.gz")
        nib.save(nib.Nifti1Image(label, np.eye(4)), raw / "labelsTr" / f"C{i}.nii.gz")
        training.append({"image": f"./imagesTr/C{i}.nii.gz", "label": f"./labelsTr/C{i}.nii.gz"})
    (raw / "dataset.json").write_text(json.dumps({
        "modality": {"0": "T1"}, "labels": {"0": "background", "1": "big", "2": "rare"}, "training": training,
    }))  # fmt: skip
    prepared = tmp_path / "prepared"
    made = _distmis("prepare", str(raw), str(prepared), "--shape", "8", "--label-mode", "multiclass",
                    "--split", "0.8,0.2,0.0")  # fmt: skip
    assert made.returncode == 0, made.stderr[-1500:]
    run = tmp_path / "run"  # what a finished search leaves, without its trials
    run.mkdir()
    (run / ".distmis-output").write_text(json.dumps({"written_by": "distmis tune"}))
    (run / "search.yaml").write_text(
        f"name: rare\ndata: {{source: {prepared}}}\ntrain: {{epochs: 1, batch_size_per_replica: 1}}\n"
        "model: {depth: 2, filters: 4}\nspace:\n  lr: {loguniform: [1.0e-3, 1.0e-2]}\n"
    )
    (run / "results.csv").write_text("trial_id\n")
    write_summary(run, prepared, [finished_trial("t0", {"lr": 0.005}, {"val_dice": 0.5})])
    result = _distmis("finalize", str(run), "--top", "1", "--folds", "3")
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert len(errors) == 1 and "rare" in errors[0] and "--folds 3" in errors[0], errors
    assert not (run / "finalize").exists()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_finalize_of_a_search_still_being_written_is_refused_naming_the_writer(search: Path, tmp_path: Path) -> None:
    """A search another process holds (a tune running or resumed on it) is not read half-written:
    finalize exits 2 with one error naming the holder, and nothing in the search changes."""
    run = tmp_path / "run"
    shutil.copytree(search, run, ignore=shutil.ignore_patterns("finalize", "final"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from distmis.locks import directory_lock\n"
            f"with directory_lock({str(run)!r}, command='tune'):\n    sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        env=clean_env(),
    )
    try:
        lock = run / ".distmis-lock"
        deadline = time.monotonic() + 120
        while f'"pid": {holder.pid}' not in lock.read_text():  # the holder's record: the lock is held
            assert holder.poll() is None and time.monotonic() < deadline, "the lock holder did not start"
            time.sleep(0.1)
        before = _tree(run)
        result = _distmis("finalize", str(run), "--top", "1", "--folds", "2")
        assert result.returncode == 2, result.stderr[-1500:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1 and f"PID {holder.pid}" in errors[0] and "distmis tune" in errors[0], errors
        assert "Traceback" not in result.stderr
        assert _tree(run) == before and not (run / "final").exists()
    finally:
        holder.stdin.close()  # type: ignore[union-attr]
        holder.wait(timeout=60)


def _final_of(search: Path) -> Path:
    final = search / "final"
    if not (final / "ensemble.json").is_file():
        assert (
            _distmis("finalize", str(search), "--top", "2", "--folds", str(ENSEMBLE_FOLDS), "--overwrite").returncode
            == 0
        )
    return final


def _one_error(result: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stdout[-1500:] + result.stderr[-1500:]
    assert "Traceback" not in result.stderr
    return errors[0]


@pytest.mark.slow
def test_finalize_checks_where_its_model_goes_before_any_fold_trains(search: Path, tmp_path: Path) -> None:
    """Its own --out as the model, an earlier model without --overwrite, another store, a store that is
    gone: each refused at once (no fold trained, nothing written), not after every fold has trained."""
    final = _final_of(search)
    before = _tree(final)
    error = _one_error(_distmis("finalize", str(search), "--top", "1", "--folds", "2", "--out", str(final)))
    assert "cannot hold or be its model" in error, error
    error = _one_error(_distmis("finalize", str(search), "--top", "1", "--folds", "2", "--out", str(tmp_path / "b")))
    assert "already holds the model of an earlier finalize" in error and "--overwrite" in error, error
    assert not (tmp_path / "b").exists() and _tree(final) == before
    other = f"sqlite:///{tmp_path / 'other.db'}"
    args = ["--top", "1", "--folds", "2", "--out", str(tmp_path / "c"), "--overwrite", "--tracking-uri", other]
    error = _one_error(_distmis("finalize", str(search), *args))
    assert "the search's runs are in" in error, error
    assert not (tmp_path / "c").exists() and not (tmp_path / "other.db").exists()
    copy = tmp_path / "copy"
    shutil.copytree(search, copy, ignore=shutil.ignore_patterns("finalize", "final"))
    state = json.loads((copy / "mlflow.json").read_text())
    state["tracking_uri"] = f"sqlite:///{tmp_path / 'gone' / 'mlflow.db'}"
    (copy / "mlflow.json").write_text(json.dumps(state))
    error = _one_error(_distmis("finalize", str(copy), "--top", "1", "--folds", "2"))
    assert "the search's MLflow store is gone" in error, error
    assert not (copy / "finalize").exists() and not (tmp_path / "gone").exists()


@pytest.mark.slow
def test_a_wall_time_warning_during_the_out_of_fold_predictions_stops_finalize_resumably(
    search: Path, tmp_path: Path
) -> None:
    """SIGUSR1 (or Ctrl-C) after the folds trained: exit 75 between two cases, and --resume finishes.

    The first out-of-fold prediction is observed in ``finalize.log`` (one line per case), where
    finalize writes it; the console shows a progress bar instead."""
    out = tmp_path / "finalize"
    console = tmp_path / "console.txt"
    with open(console, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "distmis", "finalize", str(search), "--top", "1", "--folds", "2", "--out",
             str(out), "--no-tta", "--overwrite"],
            env=clean_env(PYTHONUNBUFFERED="1"),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    log = out / "finalize.log"
    try:
        deadline = time.monotonic() + 600
        while not (log.is_file() and "out of fold:" in log.read_text()):
            assert proc.poll() is None, "finalize ended before its first out-of-fold prediction: " + console.read_text()
            assert time.monotonic() < deadline, "no out-of-fold prediction in 600 s: " + console.read_text()[-3000:]
            time.sleep(0.05)  # a bounded poll of the log, not a guess at how long anything takes
        # frozen while the signal is queued: it is handled before the next step's check
        os.kill(proc.pid, signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGUSR1)
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=300) == 75, console.read_text()[-3000:]
    finally:
        stop_group(proc, timeout=5)
    seen = [console.read_text()]
    assert "finalize interrupted; continue it with" in "".join(seen), "".join(seen[-20:])
    assert not (out / "cv.csv").exists()
    resumed = _distmis("finalize", str(search), "--resume", "--out", str(out), "--overwrite")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert (out / "cv.csv").is_file() and (search / "final" / "ensemble.json").is_file()


@pytest.mark.slow
def test_a_deep_supervised_nnunet_search_runs_through_finalize_and_evaluate(prepared16: Path, tmp_path: Path) -> None:
    """nnU-Net's network (strided, leaky ReLU, instance norm, deep supervision) and optimiser, one trial:
    trained, cross-validated into final/, and evaluated on the test split from the full-resolution head."""
    import yaml

    path = space_file(
        tmp_path, prepared16, name="ds", algorithm="random", samples=1, epochs=2, concurrency=1,
        space={"lr": {"loguniform": [5.0e-3, 2.0e-2]}},
    )  # fmt: skip
    doc = yaml.safe_load(path.read_text())
    doc["model"] = {
        "depth": 3, "filters": 4, "max_filters": 8, "norm": "instance", "activation": "leaky_relu",
        "downsample": "strided", "deep_supervision": True,
    }  # fmt: skip
    doc["optimizer"] = {"name": "sgd", "momentum": 0.99, "nesterov": True, "weight_decay": 3e-5, "global_clipnorm": 12}
    doc["train"].update(lr_schedule="poly", steps_per_epoch=3)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "runs" / "ds"
    tuned = _distmis("tune", str(path), "--out", str(out))
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    finalized = _distmis("finalize", str(out), "--top", "1", "--folds", "2", "--no-tta")
    assert finalized.returncode == 0, finalized.stdout[-2000:] + finalized.stderr[-2000:]
    scored = _distmis("evaluate", str(out / "final"), "--split", "test", "--no-track")
    assert scored.returncode == 0, scored.stdout[-2000:] + scored.stderr[-2000:]
    summary = json.loads((out / "evaluate-final-test" / "summary.json").read_text())
    assert summary["scored"] == summary["cases"] > 0 and 0 <= summary["metrics"]["dice"]["mean"] <= 1
