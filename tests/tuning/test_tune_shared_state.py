"""Shared state, the environment and full disks, end to end: two searches on one
``--out``, a resume with another file, a Ray address that does not answer, a disk that fills.

Every wait here watches a state it can see (a lock file naming its holder, a row in a CSV, a
process's exit), never how long another process usually takes.
"""

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

import pytest
import yaml
from _support.blackhole import BlackholeProxy
from _support.raycluster import clean_env, free_port, stop_group
from _support.smalldisk import pages, resize, small_disk
from test_search import read_results, space_file

pytestmark = pytest.mark.slow


def _distmis(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "distmis", *args],
        env=env or clean_env(PYTHONUNBUFFERED="1"),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distmis", *args],
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _wait_for(predicate, what: str, proc: subprocess.Popen | None = None, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def _lock_holder(out: Path) -> dict:
    try:
        return json.loads((out / ".distmis-lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


def test_a_second_search_on_the_same_out_is_refused_naming_the_first(prepared16: Path, tmp_path: Path) -> None:
    path = space_file(tmp_path, prepared16, name="two", algorithm="random", samples=2, epochs=2, concurrency=1,
                      space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}})  # fmt: skip
    out = tmp_path / "out"
    first = _distmis("tune", str(path), "--out", str(out), log=tmp_path / "first.log")
    try:
        # the first one holds the lock (its PID is in the lock file) before the second starts
        _wait_for(lambda: _lock_holder(out).get("pid") == first.pid, "lock held by the first search", first)
        second = _run("tune", str(path), "--out", str(out))
        assert second.returncode == 2, second.stdout[-1500:] + second.stderr[-1500:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1 and f"PID {first.pid}" in errors[0] and "in use by distmis tune" in errors[0], errors
        # a resume while it runs is refused the same way: one writer at a time
        third = _run("tune", str(path), "--out", str(out), "--resume")
        assert third.returncode == 2 and f"PID {first.pid}" in third.stderr, third.stderr[-1500:]
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-2000:]
    finally:
        stop_group(first, timeout=5)
    rows = read_results(out)
    assert len(rows) == 2 and all(r["status"] == "TERMINATED" for r in rows)  # the refused ones took nothing


def test_a_prepared_dataset_in_use_by_a_search_is_not_replaced_under_it(msd16: Path, tmp_path: Path) -> None:
    """``prepare --overwrite`` of the dataset a search is training on is refused (it replaced the
    shards under the running trials); once the search has ended it goes ahead."""
    data = tmp_path / "prepared"
    assert _run("prepare", str(msd16), str(data), "--shape", "16,16,16", "--processes", "1").returncode == 0
    path = space_file(tmp_path, data, name="reader", algorithm="random", samples=1, epochs=1, concurrency=1,
                      space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}})  # fmt: skip
    out = tmp_path / "out"
    search = _distmis("tune", str(path), "--out", str(out), log=tmp_path / "search.log")
    try:
        # its trials directory exists only after the search took the dataset's shared lock; the
        # driver is paused so that, however fast the trial runs, the search still holds it
        _wait_for(lambda: (out / "trials").is_dir(), "the search's trials directory", search)
        os.kill(search.pid, signal.SIGSTOP)
        try:
            before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
            refused = _run("prepare", str(msd16), str(data), "--shape", "16,16,16", "--overwrite", "--processes", "1")
            after = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
        finally:
            os.kill(search.pid, signal.SIGCONT)
        assert refused.returncode == 2, refused.stdout[-1500:] + refused.stderr[-1500:]
        errors = [line for line in refused.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1 and str(data) in errors[0] and "being read by a running distmis" in errors[0], errors
        assert "Traceback" not in refused.stderr
        assert after == before  # the dataset the search reads is byte-identical
        assert not list(tmp_path.glob(".prepared*"))  # no temporary, no sibling lock left
        assert search.wait(timeout=300) == 0, (tmp_path / "search.log").read_text()[-2000:]
    finally:
        stop_group(search, timeout=5)
    again = _run("prepare", str(msd16), str(data), "--shape", "16,16,16", "--overwrite", "--processes", "1")
    assert again.returncode == 0, again.stderr[-1500:]  # nobody reads it now


def test_a_search_killed_with_sigkill_leaves_no_lock_that_blocks_resume(prepared16: Path, tmp_path: Path) -> None:
    path = space_file(tmp_path, prepared16, name="killed", algorithm="random", samples=2, epochs=3, concurrency=1,
                      space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}})  # fmt: skip
    out = tmp_path / "out"
    proc = _distmis("tune", str(path), "--out", str(out), log=tmp_path / "first.log")
    try:

        def first_epoch() -> bool:
            runs = list((out / "trials").glob("*/metrics.csv")) if (out / "trials").exists() else []
            return any(len(list(csv.DictReader(open(m)))) >= 1 for m in runs)

        _wait_for(first_epoch, "a trained epoch", proc)
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up at all: the kernel drops its lock
        proc.wait(timeout=30)
    finally:
        stop_group(proc, timeout=5)
    assert (out / ".distmis-lock").is_file()  # the file stays; the lock does not
    resumed = _run("tune", str(path), "--out", str(out), "--resume", timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert len(read_results(out)) == 2


def test_resume_with_another_file_is_refused_and_changes_nothing(prepared16: Path, tmp_path: Path) -> None:
    path = space_file(tmp_path, prepared16, name="rs", algorithm="random", samples=1, epochs=1, concurrency=1,
                      space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}})  # fmt: skip
    out = tmp_path / "out"
    assert _run("tune", str(path), "--out", str(out)).returncode == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".distmis-lock"}
    doc = yaml.safe_load(path.read_text())
    doc["train"]["epochs"] = 2
    doc["search"]["metric"] = "val_iou"
    doc["name"] = "renamed"
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(doc))
    refused = _run("tune", str(other), "--out", str(out), "--resume")
    assert refused.returncode == 2, refused.stderr[-2000:]
    error = next(line for line in refused.stderr.splitlines() if line.startswith("distmis: error:"))
    for key in ("name", "search.metric", "train.epochs"):
        assert key in error, error
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".distmis-lock"}
    assert after == before  # results.csv, summary.json, best.yaml untouched
    # what a resume may change is accepted
    doc = yaml.safe_load(path.read_text())
    doc.setdefault("tracking", {})["final_flush_seconds"] = 5
    allowed = tmp_path / "allowed.yaml"
    allowed.write_text(yaml.safe_dump(doc))
    assert _run("tune", str(allowed), "--out", str(out), "--resume").returncode == 0


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_a_ray_address_that_does_not_answer_is_named_within_the_bound(
    kind: str, prepared16: Path, tmp_path: Path
) -> None:
    """A stale RAY_ADDRESS: nothing listens (refused), or something accepts and never answers."""
    from distmis.raysession import CONNECT_SECONDS

    path = space_file(tmp_path, prepared16, name="dead", algorithm="random", samples=1, epochs=1,
                      space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}})  # fmt: skip
    proxy = BlackholeProxy(free_port(), hang_after_requests=0) if kind == "silent" else None
    port = proxy.port if proxy else free_port()
    if proxy:
        proxy.hang()
    out = tmp_path / "out"
    start = time.monotonic()
    try:
        result = _run("tune", str(path), "--out", str(out), env=clean_env(RAY_ADDRESS=f"127.0.0.1:{port}"))
    finally:
        if proxy:
            proxy.stop()
    waited = time.monotonic() - start
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and "RAY_ADDRESS" in errors[0], errors
    assert "Traceback" not in result.stderr
    assert waited < CONNECT_SECONDS + 60  # the bound, plus the command's own start-up
    assert not out.exists()  # nothing left behind


def test_prepare_on_a_full_disk_names_the_path_and_leaves_nothing(msd16: Path, tmp_path: Path) -> None:
    # smaller than the prepared shards (about 1 MiB at 16^3 x 4 channels x 12 cases, float16)
    with small_disk(tmp_path / "disk", "256k") as disk:
        result = _run("prepare", str(msd16), str(disk / "prepared"), "--shape", "16,16,16", "--processes", "1")
        assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1 and "ENOSPC" in errors[0] and str(disk) in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        assert list(disk.iterdir()) == []  # no half-written output, no temporary, no lock file


@pytest.fixture(scope="module")
def disk_probe(prepared16: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 1-trial search file, and what that search wrote on a roomy disk: ``probe/out`` and its
    SQLite store ``probe/mlflow.db``. Both full-disk searches size their small disks from it, so it
    runs once for the two (skipped, before any search, where no small disk can be made)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount to make a small tmpfs")
    root = tmp_path_factory.mktemp("disk-probe")
    path = space_file(root, prepared16, name="full", algorithm="random", samples=1, epochs=1, concurrency=1,
                      space={"lr": {"loguniform": [3.0e-3, 2.0e-2]}})  # fmt: skip
    probe = root / "probe"
    probe.mkdir()
    done = _run("tune", str(path), "--out", str(probe / "out"), "--tracking-uri", f"sqlite:///{probe / 'mlflow.db'}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return path, probe


def test_a_search_whose_bookkeeping_meets_a_full_disk_fails_clearly_and_resumes(
    disk_probe: tuple[Path, Path], tmp_path: Path
) -> None:
    """The trials finish, then results, plots and best/ do not fit: one error line naming ENOSPC, the
    MLflow parent run FAILED with the reason; with room again, --resume writes them and finishes it."""
    from mlflow.tracking import MlflowClient

    path, probe = disk_probe[0], disk_probe[1] / "out"  # how much the search writes, on a roomy disk
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # what the search writes at its end (the top-level entries only: a trial's own best/ is written
    # while it trains), counted in tmpfs pages: every file takes whole 4 KiB pages
    bookkeeping = {"results.csv", "best.yaml", "summary.json", "timings.json", "best", "plots"}
    files = [p for p in probe.rglob("*") if p.is_file()]
    at_end = [p for p in files if p.relative_to(probe).parts[0] in bookkeeping]
    used = sum(pages(p) for p in files if p not in at_end)
    end = sum(pages(p) for p in at_end)
    assert end > 256 * 1024, f"the end writes only {end} bytes: too little to fill a disk with a margin"
    # room for the trials with half the end's size to spare (for what a slower run writes more, such
    # as Ray's warnings in tune.log), and not for the end
    with small_disk(tmp_path / "disk", f"{(used + end // 2) // 1024}k") as disk:
        out = disk / "out"
        result = _run("tune", str(path), "--out", str(out), "--tracking-uri", store, timeout=400)
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1 and "ENOSPC" in errors[0], result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        assert not [p for p in out.rglob(".distmis-tmp-*")]  # nothing half-written
        client = MlflowClient(tracking_uri=store)
        parent = next(
            r
            for r in client.search_runs([client.get_experiment_by_name("full").experiment_id])
            if r.data.tags.get("distmis.out") == str(out)
        )
        assert parent.info.status == "FAILED" and "No space left" in parent.data.tags.get("distmis.error", "")
        trials = client.search_runs(
            [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
        )
        assert trials and all(t.info.status == "FINISHED" for t in trials)  # the trials finished; the end did not fit
        resize(disk, "64m")
        resumed = _run("tune", str(path), "--out", str(out), "--resume", "--tracking-uri", store, timeout=400)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        assert len(read_results(out)) == 1 and (out / "best" / "weights.npz").is_file()
        assert client.get_run(parent.info.run_id).info.status == "FINISHED"


def test_a_full_disk_that_also_holds_the_sqlite_store_gives_one_line_and_no_traceback(
    disk_probe: tuple[Path, Path], tmp_path: Path
) -> None:
    """MLflow's SQLAlchemy store logged its own traceback when the disk it shares with the search
    filled, before distmis's one error line; a print into the full tune.log named no file."""
    path, probe = disk_probe  # the search and its store, together, on a roomy disk
    written = sum(pages(p) for p in probe.rglob("*") if p.is_file())
    with small_disk(tmp_path / "disk", f"{written * 2 // 3 // 1024}k") as disk:  # two thirds of what it needs
        result = _run(
            "tune", str(path), "--out", str(disk / "out"), "--tracking-uri", f"sqlite:///{disk / 'mlflow.db'}"
        )
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1, result.stderr[-3000:]
        assert "ENOSPC" in errors[0] or "disk is full" in errors[0], errors[0]
        assert str(disk) in errors[0], errors[0]
        assert "Traceback" not in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
