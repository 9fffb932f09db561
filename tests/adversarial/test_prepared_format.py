"""The prepared format's record and its bad inputs, each run from the shell as a user would.

An older format is refused with the command that prepares the data again; a truncated chunk, a
missing case array and a foreground coordinate outside the volume each give one error line naming
the file, before any training; an interrupted prepare is finished by ``--resume`` without redoing
the cases it completed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from conftest import Assets, Workspace, check_case, run_distmis, write_msd

from distmis.files import TEMPORARY_PREFIX, is_temporary

pytestmark = pytest.mark.slow


def _train_config(ws: Workspace, source: Path) -> Path:
    return ws.file(
        "train.yaml",
        f"name: t\ndata: {{source: {source}}}\ntrain: {{epochs: 1, batch_size_per_replica: 1, patch: [8, 8, 8], "
        "foreground_oversampling: 1.0}\nmodel: {depth: 2, filters: 4, norm: none}\n",
    )


def _first_train_case(prepared: Path) -> str:
    return json.loads((prepared / "info.json").read_text())["splits"]["train"]["cases"][0]


def test_a_dataset_of_another_format_is_refused_with_the_command_to_prepare_it_again(
    assets: Assets, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    info = json.loads((prepared / "info.json").read_text())
    info["format"] = "distmis-prepared/1"
    info["preprocessing"]["shape"] = [16, 16, 16]
    (prepared / "info.json").write_text(json.dumps(info))
    check_case("old-format", "record", ws, ["train", str(_train_config(ws, prepared)), "--out", "run"], "info.json")
    result = run_distmis(["visualize", "prepared", "--out", "case.png"], cwd=ws.dir)
    assert "format 'distmis-prepared/1', expected" in result.stderr and "distmis prepare" in result.stderr, (
        result.stderr
    )
    assert "--overwrite --shape 16,16,16" in result.stderr, result.stderr


@pytest.mark.parametrize(
    "damage",
    [
        "truncated_chunk",
        "missing_array",
        "foreground_outside",
        "foreground_undeclared",
        "label_shape",
        "image_channels",
        "label_dtype",
        "val_case_shape",
    ],
)
def test_each_damaged_case_is_named_before_training(assets: Assets, tmp_path: Path, damage: str) -> None:
    ws = Workspace(tmp_path, assets)
    prepared = ws.prepared()
    case = _first_train_case(prepared)
    image = prepared / "cases" / f"{case}.image.b2nd"
    if damage == "truncated_chunk":
        image.write_bytes(image.read_bytes()[: image.stat().st_size // 2])
        token = image.name
    elif damage == "missing_array":
        image.unlink()
        token = image.name
    elif damage.startswith("foreground"):
        # a record that passes its checksum (rewritten consistently) but points outside the volume,
        # or at a label value the dataset does not declare
        foreground = prepared / "cases" / f"{case}.foreground.npz"
        value, coords = ("1", [[3, 4, 99]]) if damage == "foreground_outside" else ("7", [[3, 4, 5]])
        np.savez(foreground, **{value: np.array(coords, np.int32)})
        _rewrite_checksum(prepared, case, "foreground")
        token = foreground.name
    else:
        # an array of another shape, channel count or dtype, its checksum kept consistent
        if damage == "val_case_shape":
            case = json.loads((prepared / "info.json").read_text())["splits"]["val"]["cases"][0]
        kind = "image" if damage == "image_channels" else "label"
        array = prepared / "cases" / f"{case}.{kind}.b2nd"
        shape, dtype = {
            "label_shape": ((16, 16, 15), np.uint8),
            "val_case_shape": ((16, 16, 15), np.uint8),
            "image_channels": ((16, 16, 16, 1), np.float32),
            "label_dtype": ((16, 16, 16), np.float32),
        }[damage]
        import blosc2

        array.unlink()
        blosc2.asarray(np.zeros(shape, dtype), urlpath=str(array), mode="w")
        _rewrite_checksum(prepared, case, kind)
        token = array.name
    config = _train_config(ws, prepared)
    check_case(damage, "format", ws, ["train", str(config), "--out", "run"], token)


def _rewrite_checksum(prepared: Path, case: str, kind: str) -> None:
    """Make ``info.json`` agree with the file as it is now (a consistent but wrong record)."""
    path = prepared / "cases" / f"{case}.{kind}.{'npz' if kind == 'foreground' else 'b2nd'}"
    info = json.loads((prepared / "info.json").read_text())
    entry = info["cases"][case]["files"][kind]
    entry.update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), bytes=path.stat().st_size)
    (prepared / "info.json").write_text(json.dumps(info))


def _done_cases(partial: Path) -> list[Path]:
    """The cases prepare has finished; a ``.done.json`` still being written is a hidden temporary sibling."""
    if not (partial / "cases").is_dir():
        return []
    return sorted(p for p in (partial / "cases").glob("*.done.json") if not is_temporary(p.name))


def test_a_killed_prepare_resumes_without_redoing_its_finished_cases(tmp_path: Path) -> None:
    raw = write_msd(tmp_path / "raw", cases=24, shape=(48, 48, 48))
    env = {**os.environ, "DISTMIS_DATA_HOME": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "distmis", "prepare", str(raw), "out", "--shape", "48,48,48", "--processes", "1"]
    partial = tmp_path / ".out.distmis-partial"
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 240
    while len(_done_cases(partial)) < 3 and proc.poll() is None:  # observe the files, not the clock
        assert time.monotonic() < deadline, "prepare wrote no finished case within 240 s"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if (tmp_path / "out").exists():
        pytest.skip("prepare finished before it could be killed (nothing left to resume)")
    kept = {p.name: p.stat().st_mtime_ns for p in (partial / "cases").glob("*.image.b2nd")}
    finished = [p.name.removesuffix(".done.json") for p in _done_cases(partial)]
    assert finished, "no case had finished when prepare was killed"
    # what a kill in the middle of a write leaves: a half-written temporary sibling
    (partial / "cases" / f"{TEMPORARY_PREFIX}0123456789ab.image.b2nd").write_bytes(b"half a scan")
    # a done-record naming a file outside the work directory is a case to make again, not an error
    damaged = finished[-1]
    record = json.loads((partial / "cases" / f"{damaged}.done.json").read_text())
    record["record"]["files"]["image"]["file"] = "../../raw/imagesTr/outside.b2nd"
    (partial / "cases" / f"{damaged}.done.json").write_text(json.dumps(record))
    # a label fixed in the source after the kill: that case is made again, the others are kept
    changed = finished[0]
    label = raw / "labelsTr" / f"{changed}.nii.gz"
    fixed = np.asarray(nib.load(label).dataobj).copy()
    fixed[fixed == 2] = 1
    nib.save(nib.Nifti1Image(fixed, np.eye(4)), label)
    resumed = subprocess.run([*argv, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not partial.exists()
    out = tmp_path / "out"
    assert not [p for p in out.rglob("*") if is_temporary(p.name)], "a killed run's temporaries reached the output"
    for case in finished[1:-1]:  # the cases it had finished were kept, not written again
        name = f"{case}.image.b2nd"
        assert (out / "cases" / name).stat().st_mtime_ns == kept[name], case
    for case in (changed, damaged):
        name = f"{case}.image.b2nd"
        assert (out / "cases" / name).stat().st_mtime_ns != kept[name], f"{case} was not made again"
    info = json.loads((out / "info.json").read_text())
    assert sorted(info["cases"]) == sorted(f"CASE_{i:03d}" for i in range(24)) or len(info["cases"]) == 24
    # the same as a prepare that was never interrupted
    fresh = subprocess.run([*argv[:5], "fresh", *argv[6:]], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    again = json.loads((tmp_path / "fresh" / "info.json").read_text())
    for kind in ("image", "label"):
        assert {c: r["files"][kind]["sha256"] for c, r in info["cases"].items()} == {
            c: r["files"][kind]["sha256"] for c, r in again["cases"].items()
        }, kind
    assert info["fingerprint"] == again["fingerprint"]


def test_resume_with_other_options_is_refused(tmp_path: Path) -> None:
    raw = write_msd(tmp_path / "raw", cases=4, shape=(16, 16, 16))
    partial = tmp_path / ".out.distmis-partial"
    partial.mkdir()
    (partial / ".distmis-job.json").write_text(json.dumps({"shape": [8, 8, 8]}))
    result = run_distmis(["prepare", str(raw), "out", "--shape", "16,16,16", "--resume"], cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert result.returncode == 2 and len(errors) == 1 and "other options" in errors[0], result.stderr
    assert not (tmp_path / "out").exists() and partial.is_dir()


def test_a_target_shape_larger_than_memory_is_refused_before_any_read(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    raw = ws.raw()
    argv = ["prepare", str(raw), "prepared", "--shape", "2048,2048,2048"]
    check_case("prepare_shape_typo", "bounds", ws, argv, "shape 2048,2048,2048")
