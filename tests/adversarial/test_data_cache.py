"""The data cache: a place distmis names when it cannot use it, never inside the dataset, and never
a reason to block or to read something that is not its own file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import Assets, Workspace, check_case

pytestmark = pytest.mark.slow

TRAIN = (
    "name: m\ndata: {{source: data, prepare: {{shape: [16, 16, 16], split: [0.5, 0.25, 0.25]}}{cache}}}\n"
    "train: {{epochs: 1, batch_size_per_replica: 1, patch: [16, 16, 16]}}\nmodel: {{depth: 2, filters: 4, norm: none}}\n"
)


@pytest.mark.parametrize("home", ["a-file", "missing/parent/nope", "data/cache-in-dataset"])
def test_a_data_home_that_cannot_be_used_names_the_variable(assets: Assets, tmp_path: Path, home: str) -> None:
    ws = Workspace(tmp_path, assets)
    ws.raw()
    ws.file("a-file", "not a directory\n")
    if home.startswith("missing"):
        (ws.dir / "missing").mkdir()
        (ws.dir / "missing").chmod(0o500)  # root ignores it: the parent is then made, and that is fine too
    config = ws.file("train.yaml", TRAIN.format(cache=""))
    env = {"DISTMIS_DATA_HOME": str(ws.dir / home)}
    if home.startswith("missing") and os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    check_case(f"data_home_{home}", "cache", ws, ["train", str(config), "--out", "run"], "$DISTMIS_DATA_HOME", env=env)


def test_a_cache_dir_inside_the_dataset_is_refused(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    ws.raw()
    config = ws.file("train.yaml", TRAIN.format(cache=", cache_dir: data/.cache"))
    check_case("cache_dir_in_dataset", "cache", ws, ["train", str(config), "--out", "run"], "data.cache_dir")


def test_a_fifo_planted_as_the_checksum_stamps_does_not_block_training(assets: Assets, tmp_path: Path) -> None:
    """``verified-cases.json`` made a FIFO: the stamps are not read (the cases are hashed again), and
    training finishes instead of blocking forever on a locked run directory."""
    from conftest import run_distmis

    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    home = ws.dir / "home"
    home.mkdir()
    os.mkfifo(home / "verified-cases.json")
    config = ws.file(
        "train.yaml",
        TRAIN.replace(
            "source: data, prepare: {{shape: [16, 16, 16], split: [0.5, 0.25, 0.25]}}{cache}", f"source: {prepared}"
        )
        .replace("{{", "{")
        .replace("}}", "}"),
    )
    result = run_distmis(["train", str(config), "--out", "run"], cwd=ws.dir, env={"DISTMIS_DATA_HOME": str(home)})
    assert result.returncode == 0, result.stderr[-2000:]
