"""A search, comparison or finalize copied (``cp -a``) or moved, then resumed: refused, naming both places.

Their state names their own files by absolute path (Tune's experiment, the Optuna journal, the
MLflow mapping), so a resumed copy wrote into its original. Each case checks the one error line and
that the original and the copy are byte-identical afterwards (conftest.check_case).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Assets, Workspace, check_case

pytestmark = pytest.mark.slow

SPACE = "  lr: {loguniform: [1.0e-3, 1.0e-2]}\n"


def _made(directory: Path, command: str, *, location: Path | None = None) -> Path:
    """A directory as distmis leaves it once started: its marker, recording where it was made."""
    directory.mkdir(parents=True)
    record = {"written_by": f"distmis {command}", "version": "0.1.0", "location": str(location or directory)}
    (directory / ".distmis-output").write_text(json.dumps(record) + "\n")
    return directory


def _copy(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)  # as a user copies it
    return dst


def _search(ws: Workspace, name: str) -> tuple[Path, Path]:
    space = ws.search(SPACE)
    run = _made(ws.dir / name, "tune")
    (run / "search.yaml").write_text(space.read_text())
    (run / "optuna.journal").write_text("")
    (run / "tune").mkdir()
    return space, run


def test_a_copied_search_is_not_resumed_into_its_original(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space, run = _search(ws, "run")
    _copy(run, ws.dir / "copy")
    argv = ["tune", str(space), "--out", "copy", "--resume"]
    check_case("tune_copy_resumed", "copies", ws, argv, f"a copy of the search in {run}")


def test_a_moved_search_says_where_it_can_be_resumed(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space, run = _search(ws, "run")
    shutil.move(run, ws.dir / "moved")
    argv = ["tune", str(space), "--out", "moved", "--resume"]
    check_case("tune_moved_resumed", "copies", ws, argv, f"was made in {run} and has moved")


def test_a_copied_comparison_is_not_resumed_into_its_original(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    space = ws.search(SPACE)
    cmp = _made(ws.dir / "cmp", "compare")
    (cmp / "compare.json").write_text(json.dumps({"modes": ["experiment"], "points": [], "slots": 2}))
    _copy(cmp, ws.dir / "cmp2")
    argv = ["compare", str(space), "--out", "cmp2", "--resume"]
    check_case("compare_copy_resumed", "copies", ws, argv, f"a copy of the comparison in {cmp}")


def test_a_copied_finalize_is_not_resumed_into_its_original(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    _space, run = _search(ws, "run")
    final = _made(run / "finalize", "finalize")
    (final / "finalize.json").write_text("{}")
    _copy(run, ws.dir / "run2")
    check_case(
        "finalize_copy_resumed", "copies", ws, ["finalize", "run2", "--resume"], f"a copy of the finalize in {final}"
    )
