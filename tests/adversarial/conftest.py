"""Hostile input, run the way a user runs it: ``python -m distmis ...`` from a shell, one case each.

Every case gets its own directory holding copies of what it needs (a raw MSD dataset written
with nibabel, a prepared dataset, a trained model, YAML files). The whole directory is
snapshotted before and after the command, so each case checks, besides the exit code and
the single ``distmis: error:`` line naming the file or option:

* every input file is byte-identical afterwards (checksums before and after);
* no output was left behind (no file appeared, none vanished).

The inputs are built with nibabel and the ``distmis`` command line only (no library
imports), so the same cases can be run against an older checkout for comparison:
``DISTMIS_ADVERSARIAL_REPORT=out.jsonl`` appends one JSON line per case with its outcome.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

ERROR_PREFIX = "distmis: error:"
#: a case that has not answered by then hangs or trains: a failure (bad input is refused fast)
CASE_TIMEOUT = float(os.environ.get("DISTMIS_ADVERSARIAL_TIMEOUT", "240"))


def write_msd(
    root: Path,
    *,
    cases: int = 6,
    shape: tuple[int, int, int] = (16, 16, 16),
    modalities: int = 2,
    test_cases: int = 1,
    seed: int = 0,
    spacing: tuple[float, float, float] = (1.0, 1.0, 1.0),
) -> Path:
    """A small, valid MSD dataset written with nibabel alone (labels 0..2, float32 images) at ``spacing`` mm."""
    rng = np.random.default_rng(seed)
    for sub in ("imagesTr", "labelsTr", "imagesTs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    training, test = [], []
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"))
    affine = np.diag([*spacing, 1.0])
    for i in range(cases + test_cases):
        centre = np.array(shape) / 2 + rng.uniform(-2, 2, 3)
        r = np.sqrt((((grid.T - centre) / (np.array(shape) * 0.2)) ** 2).sum(-1)).T
        label = np.where(r < 0.6, 2, np.where(r < 1.0, 1, 0)).astype(np.uint8)
        head = r < 2.2
        image = np.stack([(head * 100 + label * 50 + rng.normal(0, 5, shape)) * head for _ in range(modalities)], -1)
        cid = f"CASE_{i:03d}"
        if i < cases:
            nib.save(nib.Nifti1Image(image.astype(np.float32), affine), root / "imagesTr" / f"{cid}.nii.gz")
            nib.save(nib.Nifti1Image(label, affine), root / "labelsTr" / f"{cid}.nii.gz")
            training.append({"image": f"./imagesTr/{cid}.nii.gz", "label": f"./labelsTr/{cid}.nii.gz"})
        else:
            nib.save(nib.Nifti1Image(image.astype(np.float32), affine), root / "imagesTs" / f"{cid}.nii.gz")
            test.append(f"./imagesTs/{cid}.nii.gz")
    meta = {
        "name": "HOSTILE",
        "description": "adversarial test data",
        "tensorImageSize": "4D",
        "modality": {str(m): f"mod{m}" for m in range(modalities)},
        "labels": {"0": "background", "1": "edema", "2": "core"},
        "numTraining": cases,
        "numTest": test_cases,
        "training": training,
        "test": test,
    }
    (root / "dataset.json").write_text(json.dumps(meta, indent=2))
    return root


def run_distmis(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = CASE_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    full_env = {**inherited, **(env or {})}  # what the case sets, nothing of this shell's
    return subprocess.run(
        [sys.executable, "-m", "distmis", *argv], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


@dataclass
class Assets:
    """Built once per session, copied into each case (cases may damage their copy)."""

    root: Path
    raw: Path
    prepared: Path
    model: Path
    cache: Path


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Assets:
    root = tmp_path_factory.mktemp("adversarial-assets")
    cache = root / "cache"
    env = {"DISTMIS_DATA_HOME": str(cache)}
    raw = write_msd(root / "raw")
    prepared = root / "prepared"
    for argv in (["prepare", str(raw), str(prepared), "--shape", "16,16,16", "--split", "0.5,0.25,0.25"],):
        result = run_distmis(argv, cwd=root, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
    config = root / "train.yaml"
    config.write_text(
        f"name: m\ndata: {{source: {prepared}}}\ntrain: {{epochs: 1, batch_size_per_replica: 1, "
        "patch: [16, 16, 16]}\nmodel: {depth: 2, filters: 4, norm: none}\n"
    )
    result = run_distmis(["train", str(config), "--out", str(root / "run")], cwd=root, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return Assets(root, raw, prepared, root / "run" / "best", cache)


@dataclass
class Workspace:
    """One case's directory: copies of the assets it asks for, and the files it writes."""

    dir: Path
    assets: Assets
    env: dict[str, str] = field(default_factory=dict)

    def raw(self, name: str = "data") -> Path:
        return Path(shutil.copytree(self.assets.raw, self.dir / name))

    def prepared(self, name: str = "prepared") -> Path:
        return Path(shutil.copytree(self.assets.prepared, self.dir / name))

    def model(self, name: str = "model") -> Path:
        return Path(shutil.copytree(self.assets.model, self.dir / name))

    def file(self, name: str, text: str | bytes) -> Path:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return path

    def dataset_json(self, raw: Path) -> dict:
        return json.loads((raw / "dataset.json").read_text())

    def write_dataset_json(self, raw: Path, meta: dict | str) -> None:
        (raw / "dataset.json").write_text(meta if isinstance(meta, str) else json.dumps(meta, indent=2))

    def search(
        self,
        space: str,
        *,
        source: str | None = None,
        extra: str = "",
        name: str = "space.yaml",
        train: str = "epochs: 1, batch_size_per_replica: 1",
    ) -> Path:
        """A search-space file training on a copy of the prepared data (or ``source``)."""
        src = source or str(self.prepared())
        return self.file(
            name,
            f"name: s\ndata: {{source: {src}}}\ntrain: {{{train}}}\n"
            f"model: {{depth: 2, filters: 4}}\n{extra}space:\n{space}",
        )


def fake_search(ws: Workspace, name: str, space_text: str, *, tune: bool = False) -> Path:
    """A search directory as ``distmis tune`` leaves it once started (marker, search.yaml, journal;
    ``tune``: Ray Tune's state directory too, which a resume needs beside the journal)."""
    out = ws.dir / name
    out.mkdir()
    (out / ".distmis-output").write_text(json.dumps({"written_by": "distmis tune", "version": "0.1.0"}) + "\n")
    (out / "search.yaml").write_text(space_text)
    (out / "optuna.journal").write_text("")
    if tune:
        (out / "tune").mkdir()
        (out / "tune" / "tuner.pkl").write_bytes(pickle.dumps({}))  # what Ray Tune saves when a search starts
    return out


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file (and a marker for every directory) under ``root``."""
    found: dict[str, str] = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        found[rel + "/"] = "dir"
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                found[os.path.relpath(path, root)] = "link:" + str(path.readlink())
                continue
            if not path.is_file():  # a FIFO planted by a case: opening it would block the snapshot
                found[os.path.relpath(path, root)] = f"special:{path.lstat().st_mode:o}"
                continue
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            found[os.path.relpath(path, root)] = h.hexdigest()
    return found


def classify(result: subprocess.CompletedProcess[str] | None, token: str, changed: list[str]) -> str:
    """One word for the comparison table: what a user saw."""
    if result is None:
        return "hung"
    if changed and any(not c.startswith("+") for c in changed):
        return "destroyed input" if result.returncode == 0 else "changed input"
    if "Traceback (most recent call last)" in result.stderr:
        return "traceback"
    errors = [line for line in result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    if result.returncode == 0:
        return "accepted"
    if result.returncode == 2 and len(errors) == 1 and token in errors[0] and not changed:
        return "clear error"
    if result.returncode == 2 and len(errors) == 1 and token in errors[0]:
        return "error, left output"
    return "unclear error"


def check_case(
    case_id: str,
    group: str,
    ws: Workspace,
    argv: list[str],
    token: str,
    *,
    env: dict[str, str] | None = None,
    allowed_new: tuple[str, ...] = (),
) -> None:
    """Run ``distmis argv`` in ``ws.dir`` and assert the four properties (see the module docstring)."""
    before = snapshot(ws.dir)
    result: subprocess.CompletedProcess[str] | None
    try:
        result = run_distmis(
            argv, cwd=ws.dir, env={"DISTMIS_DATA_HOME": str(ws.dir.parent / f"{ws.dir.name}-cache"), **(env or {})}
        )
    except subprocess.TimeoutExpired:
        result = None
    after = snapshot(ws.dir)
    changed = sorted(
        [f"~{k}" for k in before if k in after and before[k] != after[k]]
        + [f"-{k}" for k in before if k not in after]
        + [f"+{k}" for k in after if k not in before and not k.startswith(allowed_new or ("\0",))]
    )
    outcome = classify(result, token, changed)
    report = os.environ.get("DISTMIS_ADVERSARIAL_REPORT")
    if report:
        with open(report, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "case": case_id,
                        "group": group,
                        "outcome": outcome,
                        "rc": None if result is None else result.returncode,
                        "stderr": "" if result is None else result.stderr[-600:],
                    }
                )
                + "\n"
            )
    assert result is not None, f"{case_id}: no answer within {CASE_TIMEOUT:.0f} s"
    errors = [line for line in result.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
    detail = f"\nstdout: {result.stdout[-1500:]}\nstderr: {result.stderr[-3000:]}"
    assert result.returncode == 2, f"{case_id}: exit {result.returncode}{detail}"
    assert len(errors) == 1, f"{case_id}: {len(errors)} error lines{detail}"
    assert token in errors[0], f"{case_id}: the error does not name {token!r}: {errors[0]}"
    assert "Traceback" not in result.stderr, f"{case_id}: traceback{detail}"
    first_line = result.stderr.lstrip().splitlines()[0] if result.stderr.strip() else ""
    assert first_line.startswith(("distmis:", "  ")), f"{case_id}: output before the error: {first_line!r}{detail}"
    assert not changed, f"{case_id}: files changed, appeared or vanished: {changed[:10]}{detail}"
