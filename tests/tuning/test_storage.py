"""Ray Tune's storage for a search writes whole files only (distmis.tuning._storage).

A search or finalize killed while Tune copied its state into ``--out/tune`` left an empty
``basic-variant-state-*.json``, and its ``--resume`` silently started a new experiment. Here a
process is killed in the middle of writing a state file through that storage: the file under
Tune's name is the old one, whole, and the new bytes are only in a hidden partial file.
"""

from __future__ import annotations

import errno
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from _support.smalldisk import small_disk

from distmis.exceptions import OutputError
from distmis.files import TEMPORARY_PREFIX, temporary_sibling
from distmis.tuning import remove_partials, tune_storage

WRITER = """
import os, signal, sys
from distmis.tuning import tune_storage
fs = tune_storage(os.path.dirname(sys.argv[1]))
stream = fs.open_output_stream(sys.argv[1])
stream.write(b"new state, " * 100_000)
stream.flush()
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a SLURM job's end would, mid-write
"""


def test_a_writer_killed_mid_file_leaves_the_old_file_whole(tmp_path: Path) -> None:
    state = tmp_path / "experiment_state-2026.json"
    state.write_bytes(b"old state")
    done = subprocess.run([sys.executable, "-c", WRITER, str(state)], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert state.read_bytes() == b"old state"
    partial = [p for p in tmp_path.iterdir() if p != state]
    assert len(partial) == 1 and partial[0].name.startswith(".") and partial[0].stat().st_size > 0
    assert sorted(tmp_path.glob("experiment_state-*.json")) == [state]  # Tune's pattern sees only the whole file
    assert remove_partials(tmp_path) == partial  # what a --resume does first, holding --out
    assert [p.name for p in tmp_path.iterdir()] == [state.name] and state.read_bytes() == b"old state"


def test_only_the_storages_own_orphans_are_removed(tmp_path: Path) -> None:
    tune = tmp_path / "tune"
    deep = tune / "trial_0" / "checkpoint_000001"
    deep.mkdir(parents=True)
    orphans = [temporary_sibling(tune / "experiment_state-x.json"), temporary_sibling(deep / "state.npz")]
    outside = tmp_path / "precious.nii.gz"
    kept = {
        tune / ".notes.partial": b"a user's",  # hidden, but not named as distmis names its temporaries
        tune / TEMPORARY_PREFIX.lstrip("."): b"not hidden",
        deep / "state.npz": b"whole",
        outside: b"scan",
    }
    for path in orphans:
        path.write_bytes(b"cut sh")
    for path, data in kept.items():
        path.write_bytes(data)
    link = tune / f"{TEMPORARY_PREFIX}link"
    link.symlink_to(outside)  # named like an orphan: neither it nor what it points to is touched
    named_dir = temporary_sibling(tune / "dir", directory=True)
    assert sorted(remove_partials(tune)) == sorted(orphans)
    assert not any(p.exists() for p in orphans)
    assert {p: p.read_bytes() for p in kept} == kept
    assert link.is_symlink() and named_dir.is_dir()


def test_tune_copies_a_directory_through_it_whole_and_sends_it_to_trials(tmp_path: Path) -> None:
    source = tmp_path / "staging"
    (source / "sub").mkdir(parents=True)
    files = {f"sub/f{i}.bin": bytes(range(256)) * (4096 + i) for i in range(3)}
    for name, data in files.items():
        (source / name).write_bytes(data)
    storage = pickle.loads(pickle.dumps(tune_storage(tmp_path)))  # as Ray sends it to each trial process
    pafs.copy_files(str(source), str(tmp_path / "out"), destination_filesystem=storage)
    assert {n: (tmp_path / "out" / n).read_bytes() for n in files} == files
    assert sorted(p.name for p in (tmp_path / "out" / "sub").iterdir()) == sorted(Path(n).name for n in files)
    storage.copy_file(str(source / "sub" / "f0.bin"), str(tmp_path / "copy.bin"))
    assert (tmp_path / "copy.bin").read_bytes() == files["sub/f0.bin"]


def test_a_write_that_meets_a_full_disk_reports_it_and_leaves_the_old_file(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:
        state = disk / "experiment_state-2026.json"
        state.write_bytes(b"old state")
        with pytest.raises(OSError) as failed, tune_storage(disk).open_output_stream(str(state)) as stream:
            stream.write(b"new state, " * 20_000)
        # the disk's error, not one from the clean-up after it (the close that follows the failed write)
        assert failed.value.errno == errno.ENOSPC, failed.value
        assert state.read_bytes() == b"old state" and [p.name for p in disk.iterdir()] == [state.name]


def test_a_file_that_already_holds_the_same_bytes_is_left_alone_and_a_link_is_still_refused(tmp_path: Path) -> None:
    """Tune copies every file of its experiment at each sync: an unchanged one is not written again
    (same inode, no temporary left), a changed one is replaced whole, and a link to a file with the
    very same bytes is refused as any link is."""
    source, out = tmp_path / "staging", tmp_path / "out"
    source.mkdir()
    (source / "result.json").write_bytes(b'{"epoch": 1}\n')
    (source / "progress.csv").write_bytes(b"epoch\n1\n")
    out.mkdir()
    storage = tune_storage(out)
    pafs.copy_files(str(source), str(out), destination_filesystem=storage)
    before = {p.name: p.stat().st_ino for p in out.iterdir()}
    (source / "progress.csv").write_bytes(b"epoch\n1\n2\n")
    pafs.copy_files(str(source), str(out), destination_filesystem=storage)
    assert (out / "result.json").stat().st_ino == before["result.json"]
    assert (out / "progress.csv").stat().st_ino != before["progress.csv"]
    assert (out / "progress.csv").read_bytes() == b"epoch\n1\n2\n"
    assert sorted(p.name for p in out.iterdir()) == ["progress.csv", "result.json"]

    precious = tmp_path / "precious.json"
    precious.write_bytes(b'{"epoch": 1}\n')
    (out / "result.json").unlink()
    (out / "result.json").symlink_to(precious)
    with (
        pytest.raises(OutputError, match="symbolic link"),
        storage.open_output_stream(str(out / "result.json")) as stream,
    ):
        stream.write(b'{"epoch": 1}\n')  # what the copy writes for that file
    assert (out / "result.json").is_symlink() and precious.read_bytes() == b'{"epoch": 1}\n'
    assert sorted(p.name for p in out.iterdir()) == ["progress.csv", "result.json"]


def test_a_directory_link_planted_below_the_storage_root_during_a_search_is_never_written_through(
    tmp_path: Path,
) -> None:
    """A link planted while a search runs (a trial's directory pointing at a folder of scans) would
    take every later write, new directory and checkpoint removal below it into its target: in a trial
    process each is refused naming the link; the driver leaves each undone, so that its syncs of
    everything else go on; the target is as it was."""
    out, precious = tmp_path / "out", tmp_path / "scans"
    (out / "tune" / "trial_0" / "checkpoint_000000").mkdir(parents=True)
    (precious / "checkpoint_000000").mkdir(parents=True)
    (precious / "checkpoint_000000" / "scan.nii.gz").write_bytes(b"a scan")
    (precious / "result.json").write_bytes(b"theirs")
    before = {p: p.read_bytes() for p in precious.rglob("*") if p.is_file()}
    shutil.rmtree(out / "tune" / "trial_0")
    (out / "tune" / "trial_0").symlink_to(precious, target_is_directory=True)
    trial = out / "tune" / "trial_0"
    attempts: list[tuple[str, tuple[str, ...]]] = [
        ("open_output_stream", (str(trial / "result.json"),)),
        ("open_append_stream", (str(trial / "progress.csv"),)),
        ("create_dir", (str(trial / "checkpoint_000001"),)),
        ("delete_dir", (str(trial / "checkpoint_000000"),)),
        ("delete_dir_contents", (str(trial),)),
        ("delete_file", (str(trial / "result.json"),)),
        ("move", (str(out / "tune" / "x"), str(trial / "x"))),
    ]
    in_a_trial = pickle.loads(pickle.dumps(tune_storage(out)))  # as Ray sends it to each trial process
    for method, args in attempts:
        with pytest.raises(OutputError, match=r"tune/trial_0: a symbolic link .*never writes through a link"):
            done = getattr(in_a_trial, method)(*args)
            if hasattr(done, "close"):
                done.close()
    driver = tune_storage(out)
    for method, args in attempts:
        done = getattr(driver, method)(*args)
        if hasattr(done, "close"):
            done.write(b"ours")
            done.close()
    assert {p: p.read_bytes() for p in precious.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in precious.iterdir()) == ["checkpoint_000000", "result.json"]
    # beside the link, and above the root, the storage works as before
    with tune_storage(out).open_output_stream(str(out / "tune" / "experiment_state-x.json")) as stream:
        stream.write(b"{}")
    assert (out / "tune" / "experiment_state-x.json").read_bytes() == b"{}"
