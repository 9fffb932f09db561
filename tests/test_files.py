"""How distmis writes: atomically, only over its own outputs, never over an input, with the user's umask."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from distmis.exceptions import OutputError
from distmis.files import (
    MARKER,
    atomic_directory,
    atomic_file,
    check_output,
    replace_directory,
    write_secret,
    written_by_distmis,
)


def test_output_may_not_be_contain_or_lie_inside_an_input(tmp_path: Path) -> None:
    data = tmp_path / "data" / "mine"
    data.mkdir(parents=True)
    (tmp_path / "link").symlink_to(data)
    for out, word in (
        (data, "is the"),
        (tmp_path / "data", "contains the"),
        (data / "sub", "lies inside the"),
        (tmp_path / "link", "is the"),
        (tmp_path / "link" / "x", "lies inside the"),
    ):
        with pytest.raises(OutputError, match=f"--out .* {word} source dataset"):
            check_output(out, option="--out", inputs={"source dataset": data})
    assert check_output(tmp_path / "elsewhere", option="--out", inputs={"source dataset": data, "model": None})


def test_too_long_a_name_is_refused_before_touching_the_disk(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="longer than this filesystem allows"):
        check_output(tmp_path / ("x" * 300) / "y", option="OUT")


def test_overwrite_replaces_only_what_distmis_wrote(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with atomic_directory(out, command="test") as tmp:
        (tmp / "a.txt").write_text("first")
    assert json.loads((out / MARKER).read_text())["written_by"] == "distmis test"
    with pytest.raises(OutputError, match="already exists; pass --overwrite"), atomic_directory(out, command="test"):
        pass
    with atomic_directory(out, command="test", overwrite=True) as tmp:
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "b.txt"]
    users = tmp_path / "users"
    users.mkdir()
    (users / "scan.nii.gz").write_bytes(b"precious")
    with (
        pytest.raises(OutputError, match="was not written by distmis"),
        atomic_directory(users, command="test", overwrite=True),
    ):
        pass
    assert (users / "scan.nii.gz").read_bytes() == b"precious"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".distmis-tmp")]  # nothing left over


def test_a_failure_leaves_neither_output_nor_temporary_nor_parents(tmp_path: Path) -> None:
    out = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(RuntimeError), atomic_directory(out, command="test") as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("bad input found late")
    assert list(tmp_path.iterdir()) == []


def test_replace_directory_swaps_in_one_step(tmp_path: Path) -> None:
    old, new = tmp_path / "best", tmp_path / "new"
    old.mkdir()
    (old / "weights").write_text("old")
    new.mkdir()
    (new / "weights").write_text("new")
    replace_directory(new, old)
    assert (old / "weights").read_text() == "new" and not new.exists()


def test_modes_follow_the_umask_and_secrets_are_private(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        with atomic_directory(tmp_path / "shared", command="test") as tmp:
            (tmp / "info.json").write_text("{}")
        with atomic_file(tmp_path / "table.csv") as tmp:
            tmp.write_text("a,b\n")
        write_secret(tmp_path / "token", "s3cret")
    finally:
        os.umask(previous)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)
    assert mode(tmp_path / "shared") == 0o750
    assert mode(tmp_path / "shared" / MARKER) == 0o640
    assert mode(tmp_path / "table.csv") == 0o640
    assert mode(tmp_path / "token") == 0o600


def test_prepared_data_is_readable_by_the_group(prepared16: Path) -> None:
    umask = os.umask(0o022)  # read (and put back at once): nothing else runs in this process meanwhile
    os.umask(umask)
    assert stat.S_IMODE(prepared16.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((prepared16 / "info.json").stat().st_mode) == 0o666 & ~umask
    assert written_by_distmis(prepared16)
