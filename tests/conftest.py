"""Shared fixtures: tiny real datasets written with nibabel and prepared with distmis."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distmis.tensorflow_env import apply_tensorflow_env

# the TensorFlow environment distmis's own processes run in, before any test module imports TensorFlow
apply_tensorflow_env()
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# as distmis.tracking.mlflow_client sets it, for the test modules that import mlflow first
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

REPO = Path(__file__).resolve().parents[1]


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print each module's time (set-up, call and tear-down of its tests).

    ``make test`` runs each module whole on one xdist worker (``--dist loadscope``), so these are the
    units the two workers share out: the figures to read before changing how they are scheduled.
    """
    seconds: dict[str, float] = {}
    worker_of: dict[str, str] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                module = _module(report.nodeid)
                seconds[module] = seconds.get(module, 0.0) + report.duration
                node = getattr(report, "node", None)  # set by pytest-xdist on the controller
                worker_of[module] = node.gateway.id if node is not None else "-"
    if not seconds:
        return
    terminalreporter.section("time per test module (longest first)")
    for module, total in sorted(seconds.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{total:8.1f}s {worker_of[module]:>4s} {module}")


@pytest.fixture(scope="session")
def msd16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic MSD dataset: 12 training cases of 16^3 x 4 modalities, 2 test cases."""
    from distmis.data import write_synthetic_msd

    return write_synthetic_msd(tmp_path_factory.mktemp("msd") / "msd16", cases=12, shape=(16, 16, 16), seed=3)


@pytest.fixture(scope="session")
def prepared16(msd16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``msd16`` prepared: split 8/2/2, binary labels."""
    from distmis.config import PrepareConfig
    from distmis.data import prepare_dataset

    out = tmp_path_factory.mktemp("prep") / "prepared16"
    prepare_dataset(msd16, out, PrepareConfig(shape=(16, 16, 16), split=(0.7, 0.15, 0.15), seed=0), workers=2)
    return out


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "data-home"
    monkeypatch.setenv("DISTMIS_DATA_HOME", str(home))
    return home
