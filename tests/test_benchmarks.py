"""The benchmark scripts start, and the options the README and the docs give them are theirs.

The benchmarks are scripts, not a package: nothing imports them, so a name one of them imports from
another can go missing without any other test noticing. A figure in the docs is only reproducible
while the command written beside it still runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (REPO / "benchmarks").glob("*.py") if p.name != "benchlib.py")
COMMAND = re.compile(r"python benchmarks/(?P<script>[a-z_]+\.py)(?P<args>[^\n`|]*)")


@cache
def _help(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


@pytest.mark.parametrize("script", [p.name for p in SCRIPTS])
def test_every_benchmark_script_starts(script: str) -> None:
    done = _help(script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def _documented() -> list[tuple[str, str, str]]:
    """(page, script, arguments) of each ``python benchmarks/...`` command in the README and the docs,
    with a backslash-continued command joined onto one line."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = re.sub(r"\\\n\s*", " ", page.read_text(encoding="utf-8"))
        for match in COMMAND.finditer(text):
            found.append((page.relative_to(REPO).as_posix(), match["script"], match["args"]))
    return found


def test_every_documented_benchmark_option_is_one_the_script_takes() -> None:
    documented = _documented()
    assert len(documented) > 20  # the docs' commands were found
    bad = []
    for page, script, args in documented:
        if not (REPO / "benchmarks" / script).is_file():
            bad.append(f"{page}: benchmarks/{script}: no such script")
            continue
        known = set(re.findall(r"--[a-z][a-z0-9-]*", _help(script).stdout))
        bad += [
            f"{page}: benchmarks/{script} {option}"
            for option in re.findall(r"(?<!\S)--[a-z][a-z0-9-]*", args)
            if option not in known
        ]
    assert bad == []


@pytest.mark.parametrize("script", [p.name for p in SCRIPTS])
def test_every_benchmark_writes_through_one_output_convention(script: str) -> None:
    """``--out DIR`` for each, and its figures written by ``benchlib.write_report`` (NAME.json, .md, .png)."""
    assert "--out" in _help(script).stdout
    assert "write_report(" in (REPO / "benchmarks" / script).read_text(encoding="utf-8")


def test_a_benchmark_writes_its_json_markdown_and_png(tmp_path: Path) -> None:
    """The model of both parallel modes measures nothing, so it runs here in a second: its three files."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "scaling_model.py"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["scaling_model.json", "scaling_model.md", "scaling_model.png"]
    document = json.loads((tmp_path / "out" / "scaling_model.json").read_text())
    assert [row["n"] for row in document["rows"]] == [1, 2, 4, 8, 16, 32]
    assert "| n |" in (tmp_path / "out" / "scaling_model.md").read_text()
    assert (tmp_path / "out" / "scaling_model.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_peer_benchmark_reports_runs_kept_by_separate_calls(tmp_path: Path) -> None:
    """``peer_nnunet.py --kept`` draws runs made on different calls together and runs nothing: the
    runs it reads stay as they were, a seed with no run is left out, and a missing one is not made."""
    runs = {
        ("5m", 0, "distmis"): {"system": "distmis", "dice": {"grey_matter": 0.95, "white_matter": 0.96}},
        ("5m", 1, "distmis"): {"system": "distmis", "dice": {"grey_matter": 0.93, "white_matter": 0.94}},
        ("5m", 0, "nnunet"): {"system": "nnU-Net v2", "dice": {"grey_matter": 0.81, "white_matter": 0.85}},
    }
    for (budget, seed, folder), run in runs.items():
        where = tmp_path / "mni152" / budget / f"seed{seed}" / folder
        where.mkdir(parents=True)
        run |= {"budget": budget, "seed": seed, "total_seconds": 290.0, "peak_gb": 2.5}
        (where / "result.json").write_text(json.dumps(run))
    before = {p: p.read_bytes() for p in tmp_path.rglob("result.json")}
    command = [sys.executable, str(REPO / "benchmarks" / "peer_nnunet.py"), "--kept", "--budgets", "5m,20m"]
    done = subprocess.run(
        [*command, "--seeds", "0,1,2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "mni152" / "peer_nnunet.json").read_text())
    kept = sorted((r["system"], r["seed"]) for r in report["data"]["runs"])
    assert kept == [("distmis", 0), ("distmis", 1), ("nnU-Net v2", 0)]
    table = {r["system"]: r for r in report["rows"]}
    assert table["distmis"]["seeds"] == 2
    assert table["distmis"]["grey_matter"] == "0.940 [0.930-0.950]"
    assert table["nnU-Net v2"]["seeds"] == 1
    assert {p: p.read_bytes() for p in tmp_path.rglob("result.json")} == before
    assert not (tmp_path / "mni152" / "20m").exists() and not (tmp_path / "data").exists()


def test_the_peer_benchmark_refuses_nnunet_alone_without_a_distmis_run_to_score_against(tmp_path: Path) -> None:
    """nnU-Net is scored on the test cases of a distmis run of the same budget and seed: asked for
    alone where no such run is kept, the benchmark names what is missing before it builds, installs or
    trains anything; where one is kept, that seed is not named."""
    kept = tmp_path / "mni152" / "5m" / "seed0" / "distmis" / "run"
    kept.mkdir(parents=True)
    (kept / "splits.json").write_text(json.dumps({"train": [], "val": [], "test": []}))
    command = [sys.executable, str(REPO / "benchmarks" / "peer_nnunet.py"), "--systems", "nnunet"]
    done = subprocess.run(
        [*command, "--budgets", "5m,20m", "--seeds", "0,1", "--out", str(tmp_path), "--nnunet-python", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("peer_nnunet: error: --systems: nnU-Net is scored on")
    assert "5m/seed1, 20m/seed0, 20m/seed1: add distmis or finalize" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mni152"]


def test_the_peer_benchmark_takes_a_dataset_folder_as_its_task(tmp_path: Path) -> None:
    """``--task`` names a user's MSD-layout folder: its runs are kept under the folder's own name, the
    folder is only read, and a folder without dataset.json is refused with the option named."""
    task = tmp_path / "Task99_Mine"
    task.mkdir()
    (task / "dataset.json").write_text('{"name": "mine"}')
    where = tmp_path / "out" / "Task99_Mine" / "5m" / "seed0" / "distmis"
    where.mkdir(parents=True)
    run = {"system": "distmis", "budget": "5m", "seed": 0, "total_seconds": 290.0, "peak_gb": 2.5}
    (where / "result.json").write_text(json.dumps(run | {"dice": {"tumour": 0.8}}))
    command = [sys.executable, str(REPO / "benchmarks" / "peer_nnunet.py"), "--kept", "--out", str(tmp_path / "out")]
    done = subprocess.run([*command, "--task", str(task)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "Task99_Mine" / "peer_nnunet.json").read_text())
    assert [r["system"] for r in report["data"]["runs"]] == ["distmis"]
    assert sorted(p.name for p in task.iterdir()) == ["dataset.json"]
    refused = subprocess.run(
        [*command, "--task", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert refused.returncode != 0
    assert f"--task {tmp_path / 'out'}: expected mni152 or brats, or an MSD-layout" in refused.stderr


def test_the_peer_benchmark_names_a_binary_tasks_dice_by_its_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """A binary model's metrics carry one plain ``dice`` (no class in the name): the peer table names it
    by the task's one foreground label; a multi-class model's ``dice_<class>`` keep their names, and
    their mean under ``dice`` is not a class."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    peer = importlib.import_module("peer_nnunet")
    assert peer.class_dice({"dice": 0.9, "iou": 0.8}, {0: "background", 1: "white matter"}) == {"white matter": 0.9}
    labels = {0: "background", 1: "edema", 2: "core"}
    assert peer.class_dice({"dice": 0.9}, labels) == {"foreground": 0.9}
    assert peer.class_dice({"dice": 0.85, "dice_edema": 0.9, "dice_core": 0.8}, labels) == {"edema": 0.9, "core": 0.8}


def test_the_peer_benchmarks_nnunet_trainer_is_valid_python_with_its_budget_hooks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trainer variant is a string written into nnU-Net's environment, so only a run with nnU-Net
    installed would import it: its syntax, and the hooks that size it to the budget, are checked here."""
    import ast
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    peer = importlib.import_module("peer_nnunet")
    tree = ast.parse(peer.TRAINER_SOURCE)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert set(classes) == {peer.TRAINER, peer.TRAINER_NODA}
    methods = {f.name for f in classes[peer.TRAINER].body if isinstance(f, ast.FunctionDef)}
    assert {"on_train_start", "run_training", "perform_actual_validation"} <= methods
    assert "DISTMIS_PEER_STARTED" in peer.TRAINER_SOURCE and "DISTMIS_PEER_BUDGET_S" in peer.TRAINER_SOURCE


def test_the_peer_benchmarks_nnunet_folder_name_is_written_and_read_back_by_one_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nnU-Net finds a dataset by its folder's name (DatasetXXX_NAME): the benchmark writes it when it
    converts a task and the re-score reads its number back from a kept run, so both go through one rule,
    and a half-written ``.part`` folder or any other folder is never taken for a dataset."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    peer = importlib.import_module("peer_nnunet")
    for dataset_id, task in [(500, "mni152"), (502, "my task-1.v2"), (7, "Task99_Mine"), (1234, "ünï")]:
        folder = peer.nnunet_folder(dataset_id, task)
        assert folder.startswith(f"Dataset{dataset_id:03d}_")
        assert re.fullmatch(r"Dataset\d{3,}_[A-Za-z0-9_]+", folder), folder
        assert peer.nnunet_dataset_id(folder) == dataset_id
    for other in ["Dataset500_mni152.part", "Dataset5_x", "Dataset500", "nnUNetTrainer_DistmisBudget", ".cache"]:
        assert peer.nnunet_dataset_id(other) is None, other


def test_the_peer_benchmark_runs_nnunet_on_the_device_asked_for_and_refuses_one_its_torch_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nnU-Net trains and predicts on the device given (a GPU where the user has one, not a CPU
    written into the benchmark); a device the peer's torch cannot use, or a peer Python that cannot
    run, is one error line before anything is built or trained, not a failure after the distmis runs."""
    import importlib

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    peer = importlib.import_module("peer_nnunet")
    for device in ["cpu", "cuda", "mps"]:
        train = peer.nnunet_train_cmd("python", 500, peer.TRAINER, device)
        predict = peer.nnunet_predict_cmd("python", Path("in"), Path("out"), 500, peer.TRAINER, device)
        for cmd in (train, predict):
            assert cmd[cmd.index("-device") + 1] == device and cmd.count("-device") == 1
    assert peer.nnunet_device("/nonexistent", "cpu", "peer_nnunet") == "cpu"

    command = [sys.executable, str(REPO / "benchmarks" / "peer_nnunet.py"), "--systems", "distmis,nnunet"]
    for python, device, expected in [
        ("/nonexistent", "auto", "--nnunet-python /nonexistent: cannot run it"),
        (sys.executable, "mps", "--nnunet-"),
    ]:
        done = subprocess.run(
            [*command, "--out", str(tmp_path), "--nnunet-python", python, "--nnunet-device", device],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert done.returncode != 0
        assert done.stderr.strip().splitlines()[-1].startswith(f"peer_nnunet: error: {expected}"), done.stderr
        assert not any(tmp_path.iterdir())
