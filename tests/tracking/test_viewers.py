"""What a person opens after a search: optuna-dashboard on ``optuna.journal`` and the MLflow UI
that ``distmis ui`` starts, both real servers on 127.0.0.1, the UI looked at by a real browser.

One finished 3-trial search (optuna sampler, 2 epochs) serves every test of this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from _support.browser import Browser, find_chromium
from _support.raycluster import free_port, stop_group

from distmis.config import load_config
from distmis.tuning import run_search

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuning"))
from test_search import read_results, space_file

pytestmark = pytest.mark.slow

EPOCHS = 2
ARTIFACTS = Path(os.environ.get("DISTMIS_TEST_ARTIFACTS", "test-artifacts"))


#: the first two trials: one that learns, then one that cannot (its learning rate is ~0); ASHA,
#: seeing them one after the other, stops the second after its first epoch: a pruned trial
POINTS = [{"lr": 1.0e-2, "norm": "group"}, {"lr": 1.0e-9, "norm": "group"}]


@pytest.fixture(scope="module")
def finished_search(prepared16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("viewers")
    path = space_file(
        tmp,
        prepared16,
        name="viewed",
        algorithm="optuna",
        samples=3,
        epochs=EPOCHS,
        concurrency=1,
        steps_per_epoch=12,
        scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
        space={"lr": {"loguniform": [1.0e-9, 2.0e-2]}, "norm": {"choice": ["batch", "group"]}},
        points=POINTS,
    )
    out = tmp / "runs" / "viewed"
    try:
        run_search(load_config(path, require_space=True), space_file=path, out=out, verbose=0)
    finally:
        import ray

        ray.shutdown()
    return out


def serve(
    argv: list[str], url_of: Callable[[int], str], log: Path, timeout: float = 90
) -> tuple[subprocess.Popen, str]:
    """Start a server on a free port and wait until ``url_of(port)`` answers 200.

    The port is chosen free but could be taken before the server binds it: a server that
    exits before it answers is started again on another port (3 tries), never waited on blindly.
    """
    for _attempt in range(3):
        port = free_port()
        proc = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in argv],
            stdout=open(log, "a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = url_of(port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=3) as response:
                    if response.status == 200:
                        return proc, url
            except (OSError, urllib.error.URLError):
                time.sleep(0.3)
        if proc.poll() is None:
            stop_group(proc, timeout=10)
            raise TimeoutError(f"{argv[0]} did not answer {url} within {timeout:.0f} s; see {log}")
    raise RuntimeError(f"{argv[0]} exited three times before answering; see {log}")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_optuna_dashboard_shows_the_study(finished_search: Path, tmp_path: Path) -> None:
    """`optuna-dashboard runs/x/optuna.journal`: the study, its 3 trials with params and one
    intermediate value per epoch; a trial the scheduler stopped early is shown as pruned (its last
    value), one that trained every epoch as complete with its best value."""
    pytest.importorskip("optuna_dashboard")
    journal = finished_search / "optuna.journal"
    before = journal.read_bytes()
    exe = Path(sys.executable).parent / "optuna-dashboard"
    proc, url = serve(
        [str(exe), str(journal), "--host", "127.0.0.1", "--port", "{port}"],
        lambda port: f"http://127.0.0.1:{port}/api/studies",
        tmp_path / "dashboard.log",
    )
    try:
        base = url.rsplit("/api/", 1)[0]
        studies = get_json(f"{base}/api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["viewed"]
        study = get_json(f"{base}/api/studies/{studies[0]['study_id']}")
    finally:
        stop_group(proc, timeout=10)
    rows = {round(float(r["lr"]), 12): r for r in read_results(finished_search)}
    trials = sorted(study["trials"], key=lambda t: t["number"])
    assert len(trials) == 3
    states = []
    for trial in trials:
        params = {p["name"]: p["param_external_value"] for p in trial["params"]}
        assert set(params) == {"lr", "norm"}
        row = rows[round(float(params["lr"]), 12)]
        assert row["norm"] == params["norm"]
        values = {int(v["step"]): float(v["value"]) for v in trial["intermediate_values"]}
        assert sorted(values) == list(range(1, int(row["epochs"]) + 1)), values
        if row["stopped_early"] == "True":
            assert trial["state"] == "Pruned", (trial["state"], row)
            assert float(trial["values"][0]) == pytest.approx(values[max(values)], rel=1e-6)  # its last epoch
        else:
            assert trial["state"] == "Complete", (trial["state"], row)
            assert float(trial["values"][0]) == pytest.approx(float(row["best_val_dice"]), rel=1e-6)
        states.append(trial["state"])
    # the starting points ran first, in order; the one that cannot learn was pruned after epoch 1
    first = [{p["name"]: p["param_external_value"] for p in t["params"]} for t in trials[:2]]
    assert [float(p["lr"]) for p in first] == [p["lr"] for p in POINTS]
    assert states[:2] == ["Complete", "Pruned"], states
    assert journal.read_bytes() == before  # looking did not change the study


def test_mlflow_ui_opens_on_the_training_runs(finished_search: Path, tmp_path: Path) -> None:
    """`distmis ui` in a real headless browser: the experiment's page lists the parent run and,
    once its row is expanded as a user would, its 3 child runs; the screenshot is kept as a
    test artifact."""
    exe = find_chromium()
    if exe is None:
        pytest.skip("no chromium here (.ci/run installs Debian's chromium)")
    pytest.importorskip("websocket")
    from mlflow.tracking import MlflowClient

    runs_dir = finished_search.parent
    client = MlflowClient(tracking_uri=f"sqlite:///{runs_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("viewed")
    assert experiment is not None
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("distmis.role") == "search")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 3
    assert "Best trial" in parent.data.tags.get("mlflow.note.content", "")
    names = [parent.info.run_name, *(c.info.run_name for c in children)]

    distmis = Path(sys.executable).parent / "distmis"
    proc, health = serve(
        [str(distmis), "ui", "--runs", str(runs_dir), "--port", "{port}"],
        lambda port: f"http://127.0.0.1:{port}/health",
        tmp_path / "ui.log",
        timeout=120,
    )
    page = health.rsplit("/", 1)[0] + f"/#/experiments/{experiment.experiment_id}/runs"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "mlflow-ui-runs.png"
    text = ""
    try:
        # distmis ui names the runs page of the newest experiment (MLflow 3's home page is a GenAI welcome),
        # once the UI answers: wait for the line itself, not for a guess at how long that takes
        deadline = time.monotonic() + 60
        while f"MLflow UI on {page}" not in (tmp_path / "ui.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert f"MLflow UI on {page}" in (tmp_path / "ui.log").read_text(), (tmp_path / "ui.log").read_text()[-2000:]
        with Browser(exe, tmp_path / "profile") as browser:
            browser.navigate(page)
            deadline = time.monotonic() + 120
            clicked = 0.0
            while time.monotonic() < deadline:  # the single-page app fills the table after its API calls
                text = browser.evaluate("document.body.innerText") or ""
                # the table can fill before the page's heading renders: wait for both
                if all(name in text for name in names) and "Training runs" in text:
                    break
                # the parent row is there, collapsed: expand it (again only if nothing came of it in 10 s)
                if parent.info.run_name in text and time.monotonic() - clicked > 10:
                    browser.evaluate(EXPAND_PARENT_ROWS)
                    clicked = time.monotonic()
                time.sleep(0.5)
            browser.screenshot(shot)
    finally:
        stop_group(proc, timeout=15)
    (ARTIFACTS / "mlflow-ui-runs.txt").write_text(text)
    assert "Training runs" in text  # the model-training view, not the GenAI overview
    missing = [n for n in names if n not in text]
    assert not missing, f"not in the runs page: {missing}; its text is in {ARTIFACTS / 'mlflow-ui-runs.txt'}"
    assert shot.stat().st_size > 10_000


# the expander before a parent run's name (MLflow 3.17's run-name cell renderer)
EXPAND_PARENT_ROWS = """
[...document.querySelectorAll('button[data-component-id*="runnamecellrenderer"]')].forEach(b => b.click());
"""
