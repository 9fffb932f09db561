"""A real tiny ``distmis compare`` (local Ray per mode, real MLflow on SQLite) and the notebook
that reads it back from MLflow alone."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from distmis.cli import main
from distmis.compare import config_key

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
MODES = ("baseline", "experiment", "data", "hybrid")


@pytest.fixture(scope="module")
def comparison(prepared16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 configurations x {experiment 4x1, data 1x4, hybrid 2x2} on 4 slots of 0.5 CPU, baseline of 1.

    Two configurations are the fewest that show each mode's overlap (both trials at once in the
    experiment and hybrid modes, one after the other in the data mode); the data mode's 4-worker
    trials are most of the fixture's time."""
    root = tmp_path_factory.mktemp("compare")
    space = root / "space.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "data": {"source": str(prepared16)},
                "train": {"epochs": 2, "batch_size_per_replica": 2, "augment": {"flip": False, "intensity": 0.0}},
                "model": {"depth": 3, "filters": 4},
                "search": {
                    "num_samples": 4,
                    "seed": 1,
                    "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2},
                },
                "space": {"lr": {"loguniform": [3e-3, 3e-2]}, "norm": {"choice": ["group", "none"]}},
            }
        )
    )
    out = root / "runs" / "compare-tiny"
    rc = main(
        [
            "compare",
            str(space),
            "--modes",
            "experiment,data,hybrid",
            "--budget",
            "2",
            "--slots",
            "4",
            "--cpus-per-worker",
            "0.5",
            "--baseline-trials",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    return out


def _png_ok(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = matplotlib.image.imread(str(path))
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100 and float(np.std(pixels)) > 0.01, path  # not blank


def test_report_has_every_mode_with_speed_next_to_accuracy(comparison: Path) -> None:
    result = json.loads((comparison / "comparison.json").read_text())
    stats = {m["mode"]: m for m in result["modes"]}
    assert sorted(stats) == sorted(MODES)
    assert result["same_configurations"] is True and not result["failed_modes"]
    assert result["target"] == pytest.approx(stats["baseline"]["best_value"])  # default target: the baseline's best
    for mode, s in stats.items():
        assert s["wall_seconds"] > 0 and s["speedup"] > 0 and s["efficiency"] > 0, mode
        assert s["best_value"] is not None and 0 <= s["best_value"] <= 1, mode
        assert "time_to_target_seconds" in s and s["trials"] == (1 if mode == "baseline" else 2)
        assert s["finished"] + s["stopped_early"] + s["failed"] == s["trials"]
    assert stats["baseline"]["speedup"] == pytest.approx(1.0)
    assert stats["baseline"]["time_to_target_seconds"] is not None  # the baseline reaches its own best
    assert (
        stats["experiment"]["workers_per_trial"],
        stats["data"]["workers_per_trial"],
        stats["hybrid"]["workers_per_trial"],
    ) == (1, 4, 2)
    assert (stats["data"]["global_batch"], stats["hybrid"]["global_batch"]) == (8, 4)
    # the overlap the report states is the one the trials' own start and end times show, and never
    # more than the mode allows; whether two trials overlap here depends on how fast the second one
    # starts, so that they can is shown by construction in tests/tuning (a paused trial)
    assert [stats[m]["concurrent_trials"] for m in ("experiment", "data", "hybrid")] == [4, 1, 2]
    for mode, s in stats.items():
        with open(comparison / mode / "results.csv") as fh:
            intervals = [(float(r["started_at"]), float(r["finished_at"])) for r in csv.DictReader(fh)]
        # the most trials running at once is reached at some trial's start
        at_a_start = max(sum(b <= a < e for b, e in intervals) for a, _ in intervals)
        assert s["max_concurrent_observed"] == at_a_start, mode
        assert 1 <= s["max_concurrent_observed"] <= s["concurrent_trials"], mode

    report = (comparison / "report.md").read_text()
    for mode in MODES:
        s = stats[mode]
        row = next(line for line in report.splitlines() if line.startswith(f"| {mode} |"))
        assert f"{s['wall_seconds']:.1f}" in row and f"{s['speedup']:.2f}x" in row and f"{s['best_value']:.4f}" in row
        headline = next(line for line in report.splitlines() if line.startswith(f"- **{mode}**"))
        assert "x the sequential baseline" in headline and "best val_dice" in headline  # speed next to accuracy
    assert "scaling" in report and "global batch 8" in report
    html = (comparison / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3


def test_every_mode_ran_the_same_configurations(comparison: Path) -> None:
    points = json.loads((comparison / "compare.json").read_text())["points"]
    assert len(points) == 2
    expected = sorted(config_key(p) for p in points)
    for mode in ("experiment", "data", "hybrid"):
        with open(comparison / mode / "results.csv") as fh:
            ran = sorted(config_key({k: r[k] for k in ("lr", "norm")}) for r in csv.DictReader(fh))
        assert ran == expected, mode
    with open(comparison / "baseline" / "results.csv") as fh:
        assert [config_key({k: r[k] for k in ("lr", "norm")}) for r in csv.DictReader(fh)] == [config_key(points[0])]


def test_plots_are_real_images(comparison: Path) -> None:
    for name in ("best_so_far", "speedup", "timeline"):
        _png_ok(comparison / "plots" / f"{name}.png")


def test_everything_is_under_one_mlflow_run(comparison: Path) -> None:
    from mlflow.tracking import MlflowClient

    info = json.loads((comparison / "compare.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=info["tracking_uri"])
    run = client.get_run(info["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["distmis.kind"] == "compare"
    assert run.data.metrics["experiment.speedup"] > 0 and "hybrid.best_value" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.md", "report.html", "comparison.json", "plots"} <= artifacts
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        "plots/best_so_far.png",
        "plots/speedup.png",
        "plots/timeline.png",
    }
    children = client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    assert sorted(c.data.tags.get("distmis.compare_mode") for c in children) == sorted(MODES)
    trials = client.search_runs(
        [run.info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{next(c for c in children if c.data.tags['distmis.compare_mode'] == 'data').info.run_id}'",
    )
    assert len(trials) == 2


def test_notebook_draws_the_figures_from_mlflow(
    comparison: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient

    info = json.loads((comparison / "compare.json").read_text())["mlflow"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", info["tracking_uri"])
    monkeypatch.setenv("DISTMIS_COMPARE_RUN", info["run_id"])
    monkeypatch.setenv("DISTMIS_NOTEBOOK_OUT", str(tmp_path / "figures"))
    path = REPO / "notebooks" / "compare_parallelism.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()  # raises on any cell error
    images = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert len(images) == 3
    for name in ("best_so_far", "speedup", "timeline"):
        _png_ok(tmp_path / "figures" / f"{name}.png")
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    logged = {m["mode"]: m for m in json.loads((comparison / "comparison.json").read_text())["modes"]}
    for mode, s in logged.items():
        # the notebook's figures come from MLflow; they must agree with the files
        assert f"{mode:<10} best {s['best_value']:.4f} (files: {s['best_value']:.4f})" in text, text
    assert os.environ["DISTMIS_COMPARE_RUN"] == info["run_id"]


def test_existing_comparison_is_refused_and_resume_reuses_finished_modes(
    comparison: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = json.loads((comparison / "compare.json").read_text())
    space = Path(plan["space_file"])
    assert main(["compare", str(space), "--slots", "4", "--cpus-per-worker", "0.5", "--out", str(comparison)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    # options other than the recorded ones are refused, each named, and nothing changes
    files = {p: p.read_bytes() for p in comparison.rglob("*") if p.is_file()}
    other = ["--modes", "data", "--slots", "2", "--budget", "2", "--target", "0.5"]
    assert main(["compare", str(space), "--resume", "--out", str(comparison), *other]) == 2
    error = capsys.readouterr().err
    assert error.startswith("distmis: error:") and len(error.strip().splitlines()) == 1, error
    assert "--modes data" in error and "--modes experiment,data,hybrid" in error and "--slots 2" in error, error
    assert "--budget" not in error and "--target" not in error  # the same budget; a target may change
    assert {p: p.read_bytes() for p in comparison.rglob("*") if p.is_file()} == files
    # a finished mode's summary damaged by hand: one error naming it, no traceback
    damaged = comparison / MODES[0] / "summary.json"
    kept = damaged.read_bytes()
    for text in ('{"metric": "val_dice"}', "[1,", '{"metric": "val_dice", "wall_seconds": "soon"}'):
        damaged.write_text(text)
        assert main(["compare", str(space), "--resume", "--out", str(comparison)]) == 2
        error = capsys.readouterr().err
        assert error.startswith("distmis: error:") and str(damaged) in error and "Traceback" not in error, error
        assert damaged.read_text() == text
    damaged.write_bytes(kept)
    # its plan edited by hand: one error naming the file and the field, before anything runs
    plan_file = comparison / "compare.json"
    whole = plan_file.read_bytes()
    for edit, field in ((lambda d: {**d, "slots": "four"}, "slots"), (lambda d: {**d, "mlflow": {}}, "mlflow.")):
        plan_file.write_text(json.dumps(edit(json.loads(whole))))
        edited = plan_file.read_bytes()
        assert main(["compare", str(space), "--resume", "--out", str(comparison)]) == 2
        error = capsys.readouterr().err
        assert error.startswith("distmis: error:") and f"compare.json: {field}" in error, error
        assert "Traceback" not in error and plan_file.read_bytes() == edited
    plan_file.write_bytes(whole)
    before = {m: (comparison / m / "summary.json").stat().st_mtime for m in MODES}
    assert main(["compare", str(space), "--resume", "--out", str(comparison)]) == 0
    out = capsys.readouterr().out
    assert "== experiment" not in out  # finished modes are not run again
    assert {m: (comparison / m / "summary.json").stat().st_mtime for m in MODES} == before
    assert json.loads((comparison / "compare.json").read_text())["mlflow"]["run_id"] == plan["mlflow"]["run_id"]
    assert sorted(m["mode"] for m in json.loads((comparison / "comparison.json").read_text())["modes"]) == sorted(MODES)
