"""Links planted where distmis writes: no command writes through one, and none changes a link's target.

Two kinds of test:

* each command that takes a lock is run with a symbolic link planted at its lock file, as a user
  sharing a project directory would meet it (exit 2, one error naming the link, every file and the
  link's target byte-identical);
* what a command writes is derived from the code, not listed by hand: the command runs once with
  an audit hook (``tests/writeaudit``) in every one of its Python processes, which records each
  file opened for writing and each rename under the output. Every such open must refuse a link
  itself (``O_NOFOLLOW``, or ``O_CREAT|O_EXCL`` of a new file); then a link is planted at every
  path it wrote, and the command run again must leave every link's target as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import ERROR_PREFIX, Assets, Workspace, check_case, fake_search, run_distmis, snapshot

pytestmark = pytest.mark.slow

AUDIT = Path(__file__).resolve().parents[1] / "writeaudit"
#: opened by Optuna's journal backend, which distmis cannot open for it: a link there is refused
#: before the storage is built (checked by the planting below)
OPENED_BY_LIBRARIES = {"optuna.journal"}


def _victim(ws: Workspace, name: str = "victim.txt") -> Path:
    return ws.file(name, "a file of someone else's, which no distmis run may touch\n")


def _link(at: Path, target: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return at


# --------------------------------------------------------------------------- a link at each lock
def test_a_fresh_search_into_an_empty_directory_with_a_linked_lock(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    _link(ws.dir / "run" / ".distmis-lock", _victim(ws))
    check_case("tune_lock_link", "links", ws, ["tune", str(space), "--out", "run"], "run/.distmis-lock")


def test_a_resumed_search_with_a_linked_lock(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    run = fake_search(ws, "run", space.read_text(), tune=True)
    _link(run / ".distmis-lock", _victim(ws))
    check_case("tune_resume_lock_link", "links", ws, ["tune", str(space), "--out", "run", "--resume"], ".distmis-lock")


def test_prepare_with_a_linked_sibling_lock(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    raw = ws.raw()
    _link(ws.dir / ".prepared.distmis-lock", _victim(ws))
    argv = ["prepare", str(raw), "prepared", "--shape", "16,16,16", "--split", "0.5,0.25,0.25"]
    check_case("prepare_lock_link", "links", ws, argv, ".prepared.distmis-lock")


def test_finalize_of_a_search_whose_lock_is_a_link(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    run = fake_search(ws, "run", space.read_text(), tune=True)
    _link(run / ".distmis-lock", _victim(ws))
    check_case("finalize_lock_link", "links", ws, ["finalize", "run"], ".distmis-lock")


def test_compare_into_a_directory_whose_lock_is_a_link(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    _link(ws.dir / "cmp" / ".distmis-lock", _victim(ws))
    argv = ["compare", str(space), "--out", "cmp", "--modes", "experiment", "--slots", "2"]
    check_case("compare_lock_link", "links", ws, argv, "cmp/.distmis-lock")


def test_evaluate_and_predict_with_a_linked_sibling_lock(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ev", assets)
    ws.dir.mkdir()
    ws.model()
    prepared = ws.prepared()
    _link(ws.dir / ".scores.distmis-lock", _victim(ws))
    argv = ["evaluate", "model", str(prepared), "--split", "test", "--no-track", "--out", "scores"]
    check_case("evaluate_lock_link", "links", ws, argv, ".scores.distmis-lock")

    ws = Workspace(tmp_path / "pr", assets)
    ws.dir.mkdir()
    ws.model()
    ws.raw("data")
    _link(ws.dir / ".segs.distmis-lock", _victim(ws))
    argv = ["predict", "model", "data/imagesTs", "--out", "segs"]
    check_case("predict_lock_link", "links", ws, argv, ".segs.distmis-lock")


@pytest.mark.parametrize("linked", ["plots", "tune", "trials", "finalize"])
def test_a_directory_link_inside_a_search(assets: Assets, tmp_path: Path, linked: str) -> None:
    """A link at a directory inside a search (``RUN/plots`` to a user's folder): resume and finalize
    refuse it before writing, and the folder it points at is untouched."""
    ws = Workspace(tmp_path, assets)
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n")
    run = fake_search(ws, "run", space.read_text(), tune=True)
    folder = ws.dir / "users-folder"
    folder.mkdir()
    (folder / "search_history.png").write_text("the user's own file\n")
    if (run / linked).exists():
        shutil.rmtree(run / linked)
    (run / linked).symlink_to(folder, target_is_directory=True)
    argv = ["finalize", "run"] if linked == "finalize" else ["tune", str(space), "--out", "run", "--resume"]
    check_case(f"{linked}_directory_link", "links", ws, argv, f"run/{linked}")


@pytest.mark.parametrize("linked", ["checkpoint", "best"])
def test_a_directory_link_inside_a_training_run(assets: Assets, tmp_path: Path, linked: str) -> None:
    """``train --resume`` of a run whose ``checkpoint/`` or ``best/`` became a link to a copy
    elsewhere: refused before anything is written, the copy untouched."""
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    config = ws.file(
        "train.yaml",
        f"name: m\ndata: {{source: {prepared}}}\ntrain: {{epochs: 1, batch_size_per_replica: 1, "
        "patch: [16, 16, 16]}\nmodel: {depth: 2, filters: 4, norm: none}\n",
    )
    first = run_distmis(
        ["train", str(config), "--out", "run"], cwd=ws.dir, env={"DISTMIS_DATA_HOME": str(tmp_path / "c")}
    )
    assert first.returncode == 0, first.stderr[-2000:]
    elsewhere = ws.dir / "elsewhere"
    shutil.copytree(ws.dir / "run" / linked, elsewhere)
    shutil.rmtree(ws.dir / "run" / linked)
    (ws.dir / "run" / linked).symlink_to(elsewhere, target_is_directory=True)
    argv = ["train", str(config), "--out", "run", "--resume", "--epochs", "2"]
    check_case(f"train_{linked}_directory_link", "links", ws, argv, f"run/{linked}")


def test_train_into_a_directory_whose_lock_is_a_link(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    config = ws.file(
        "train.yaml",
        f"name: m\ndata: {{source: {prepared}}}\ntrain: {{epochs: 1, batch_size_per_replica: 1, "
        "patch: [16, 16, 16]}\nmodel: {depth: 2, filters: 4, norm: none}\n",
    )
    _link(ws.dir / "run" / ".distmis-lock", _victim(ws))
    check_case("train_lock_link", "links", ws, ["train", str(config), "--out", "run"], "run/.distmis-lock")


# --------------------------------------------------------------------------- every path a command writes
def _audited(argv: list[str], ws: Workspace, root: Path, log: Path) -> tuple[int, str]:
    env = {
        "PYTHONPATH": os.pathsep.join([str(AUDIT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "DISTMIS_WRITE_AUDIT": str(log),
        "DISTMIS_WRITE_AUDIT_ROOT": str(root),
        "DISTMIS_DATA_HOME": str(ws.dir / "cache"),
    }
    result = run_distmis(argv, cwd=ws.dir, env=env)
    return result.returncode, result.stdout[-2000:] + result.stderr[-3000:]


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def _made_by_distmis_exclusively(path: str) -> bool:
    """Inside one of distmis's temporary siblings, created with O_EXCL and renamed into place."""
    return any(part.startswith(".distmis-tmp-") for part in Path(path).parts)


def _unsafe_opens(records: list[dict], root: Path) -> list[str]:
    unsafe = set()
    for r in records:
        if r["event"] != "open":
            continue
        flags = r["flags"]
        exclusive = flags & os.O_CREAT and flags & os.O_EXCL
        rel = os.path.relpath(r["path"], root)
        if flags & os.O_NOFOLLOW or exclusive or _made_by_distmis_exclusively(rel) or rel in OPENED_BY_LIBRARIES:
            continue
        unsafe.add(f"{rel} (flags {oct(flags)}, pid {r['pid']})")
    return sorted(unsafe)


def _written_paths(records: list[dict], root: Path) -> list[str]:
    """The final paths a command wrote: opened or renamed into place, temporaries left out."""
    found = set()
    for r in records:
        rel = os.path.relpath(r["path"], root)
        if _made_by_distmis_exclusively(rel) or ".lock" in Path(rel).name and rel != ".distmis-lock":
            continue
        found.add(rel)
    return sorted(found)


def _plant_links(root: Path, paths: list[str], victims: Path) -> dict[Path, Path]:
    """Replace each existing regular file at ``paths`` by a link to a copy of it in ``victims``."""
    planted = {}
    for i, rel in enumerate(paths):
        at = root / rel
        if at.is_symlink() or not at.is_file():
            continue
        victim = victims / f"{i:03d}-{at.name}"
        shutil.copy2(at, victim)
        at.unlink()
        at.symlink_to(victim)
        planted[at] = victim
    return planted


def test_every_file_a_search_writes_is_opened_without_following_a_link(assets: Assets, tmp_path: Path) -> None:
    """A search, then its resume, audited: no open follows a link, and links planted at every path
    the search wrote leave their targets untouched through resume after resume."""
    ws = Workspace(tmp_path / "ws", assets)
    ws.dir.mkdir()
    space = ws.search("  lr: {loguniform: [1.0e-3, 1.0e-2]}\n", extra="search: {num_samples: 2, seed: 0}\n")
    run = ws.dir / "run"
    log = tmp_path / "audit.jsonl"
    rc, output = _audited(["tune", str(space), "--out", "run"], ws, run, log)
    assert rc == 0, output
    records = _records(log)
    assert any("/trials/" in r["path"] for r in records), "the trials' processes were not audited"
    assert not _unsafe_opens(records, run), f"opened for writing through a possible link: {_unsafe_opens(records, run)}"

    log.unlink()
    rc, output = _audited(["tune", str(space), "--out", "run", "--resume"], ws, run, log)
    assert rc == 0, output
    resumed = _records(log)
    assert not _unsafe_opens(resumed, run), f"opened for writing through a possible link: {_unsafe_opens(resumed, run)}"

    victims = tmp_path / "victims"
    victims.mkdir()
    planted = _plant_links(run, _written_paths(records + resumed, run), victims)
    assert len(planted) >= 10, sorted(str(p) for p in planted)
    before = snapshot(victims)
    refused: list[str] = []
    for _ in range(len(planted) + 1):  # each run refuses one link at most; it is then put back as a file
        result = run_distmis(
            ["tune", str(space), "--out", "run", "--resume"],
            cwd=ws.dir,
            env={"DISTMIS_DATA_HOME": str(ws.dir / "cache")},
        )
        assert snapshot(victims) == before, f"a link's target changed after: {result.stderr[-2000:]}"
        if result.returncode == 0:
            break
        errors = [line for line in result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
        assert result.returncode == 2 and len(errors) == 1, result.stdout[-1500:] + result.stderr[-3000:]
        named = next((at for at in planted if at.is_symlink() and str(at) in errors[0]), None)
        assert named is not None, f"the error names no planted link: {errors[0]}"
        assert "symbolic link" in errors[0], errors[0]
        refused.append(os.path.relpath(named, run))
        named.unlink()
        shutil.copy2(planted[named], named)
    print("refused links:", refused, "planted:", len(planted))
    assert ".distmis-lock" in refused, refused
    assert len(refused) >= 5, refused
    for at in planted:  # a link that was not refused was not written through: it is still the link
        assert at.is_symlink() or os.path.relpath(at, run) in refused, at

    directories = _written_directories(records + resumed, run)
    assert {"plots", "trials", "tune"} <= set(directories), directories
    for depth in (1, 2):  # a link at a directory hides those below it: one depth at a time
        planted = _plant_directory_links(run, [d for d in directories if d.count("/") == depth - 1], victims)
        refused = _resume_until_every_link_is_refused(space, ws, run, planted)
        assert sorted(refused) == sorted(os.path.relpath(at, run) for at in planted), refused


def _written_directories(records: list[dict], root: Path) -> list[str]:
    """Every directory under ``root`` that a command wrote a file into, and those above it."""
    found = set()
    for rel in _written_paths(records, root):
        parts = Path(rel).parts[:-1]
        found.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(found)


def _plant_directory_links(root: Path, paths: list[str], victims: Path) -> dict[Path, Path]:
    """Replace each directory at ``paths`` by a link to a copy of it in ``victims``."""
    planted = {}
    for rel in paths:
        at = root / rel
        if at.is_symlink() or not at.is_dir():
            continue
        victim = victims / f"dir-{rel.replace('/', '--')}"
        shutil.copytree(at, victim, symlinks=True)
        shutil.rmtree(at)
        at.symlink_to(victim, target_is_directory=True)
        planted[at] = victim
    assert planted, paths
    return planted


def _resume_until_every_link_is_refused(space: Path, ws: Workspace, run: Path, planted: dict[Path, Path]) -> list[str]:
    """``tune --resume`` again and again: each run must refuse one planted link (exit 2, one error
    naming it) and leave every target as it was; the refused link is then put back as a directory."""
    victims = next(iter(planted.values())).parent
    before = snapshot(victims)
    refused: list[str] = []
    for _ in range(len(planted) + 1):
        result = run_distmis(
            ["tune", str(space), "--out", "run", "--resume"],
            cwd=ws.dir,
            env={"DISTMIS_DATA_HOME": str(ws.dir / "cache")},
        )
        assert snapshot(victims) == before, f"a linked directory's target changed: {result.stderr[-2000:]}"
        if result.returncode == 0:
            break
        errors = [line for line in result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
        assert result.returncode == 2 and len(errors) == 1, result.stdout[-1500:] + result.stderr[-3000:]
        named = next((at for at in planted if at.is_symlink() and str(at) in errors[0]), None)
        assert named is not None and "symbolic link" in errors[0], errors[0]
        refused.append(os.path.relpath(named, run))
        named.unlink()
        shutil.copytree(planted[named], named, symlinks=True)
    return refused


def test_prepare_train_evaluate_and_predict_open_nothing_through_a_link(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws", assets)
    ws.dir.mkdir()
    raw = ws.raw()
    log = tmp_path / "audit.jsonl"
    config = ws.file(
        "train.yaml",
        "name: m\ndata: {source: prepared}\ntrain: {epochs: 1, batch_size_per_replica: 1, patch: [16, 16, 16]}\n"
        "model: {depth: 2, filters: 4, norm: none}\n",
    )
    for argv in (
        ["prepare", str(raw), "prepared", "--shape", "16,16,16", "--split", "0.5,0.25,0.25"],
        ["train", str(config), "--out", "run"],
        ["evaluate", "run/best", "prepared", "--split", "test", "--no-track", "--out", "scores"],
        ["predict", "run/best", str(raw / "imagesTs"), "--out", "segs"],
    ):
        rc, output = _audited(argv, ws, ws.dir, log)
        assert rc == 0, output
    records = _records(log)
    for written in ("/prepared", "run/metrics.csv", "/scores", "segs/"):
        assert any(written in r["path"] for r in records), f"nothing recorded under {written}"
    assert not _unsafe_opens(records, ws.dir), _unsafe_opens(records, ws.dir)


def test_links_planted_while_a_search_runs_are_never_written_through(assets: Assets, tmp_path: Path) -> None:
    """Links planted at a trial's directories (Ray Tune's and distmis's) and at ``plots/`` while the
    search runs: nothing lands in their targets, the other trials' results still choose ``best/``, and
    the plots' link is refused in one line at the end."""
    import subprocess
    import sys
    import time

    ws = Workspace(tmp_path / "ws", assets)
    ws.dir.mkdir()
    space = ws.search(
        "  lr: {loguniform: [1.0e-3, 1.0e-2]}\n",
        extra="search: {num_samples: 3, max_concurrent_trials: 1, seed: 0, scheduler: {type: none}}\n",
        train="epochs: 12, batch_size_per_replica: 1",
    )
    run = ws.dir / "run"
    victims = tmp_path / "victims"
    for name in ("plots", "tune-trial", "trial"):
        (victims / name).mkdir(parents=True)
        for file in ("learning_curves.png", "result.json", "progress.csv", "metrics.csv", "scan.nii.gz"):
            (victims / name / file).write_text(f"the user's {name}/{file}\n")
    before = snapshot(victims)
    env = {**os.environ, "DISTMIS_DATA_HOME": str(ws.dir / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "distmis", "tune", str(space), "--out", "run"],
        cwd=ws.dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        tune_trials: list[Path] = []
        trials: list[Path] = []
        while not (tune_trials and trials):  # observe the directories, not the clock
            assert proc.poll() is None, "the search ended before its first trial's directories appeared"
            assert time.monotonic() < deadline, "no trial directory within 600 s"
            tune_trials = sorted((run / "tune").glob("distmis_trial_*")) if (run / "tune").is_dir() else []
            trials = sorted((run / "trials").iterdir()) if (run / "trials").is_dir() else []
            time.sleep(0.05)
        for at, target in ((tune_trials[0], "tune-trial"), (trials[0], "trial"), (run / "plots", "plots")):
            shutil.rmtree(at, ignore_errors=True)
            at.symlink_to(victims / target, target_is_directory=True)
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        proc.kill()
    assert snapshot(victims) == before, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    assert proc.returncode == 2 and len(errors) == 1, stdout[-2000:] + stderr[-3000:]
    assert f"{run / 'plots'}: a symbolic link" in errors[0], errors[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_trial_id"] and (run / "best").is_dir(), summary  # the other trials' state was synced
