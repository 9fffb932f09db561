"""Shared fixtures: tiny real datasets written with nibabel and prepared with distmis."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distmis.tensorflow_env import apply_tensorflow_env

# the TensorFlow environment distmis's own processes run in, before any test module imports TensorFlow
apply_tensorflow_env()
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

REPO = Path(__file__).resolve().parents[1]

#: the test modules that take longest, longest first, as measured by the per-module summary this
#: file prints (2 xdist workers on 2 cores). ``make test`` runs each module whole on one worker
#: (``--dist loadscope --no-loadscope-reorder``) and hands them out in collection order, so
#: starting the longest ones first (longest-processing-time-first) keeps one worker from starting
#: a 10-minute module while the other is nearly done. Every other module follows in its usual
#: order. A module missing here only costs time, never a result.
LONGEST_MODULES = (
    "tests/cluster/test_slurm.py",
    "tests/tuning/test_data_parallel.py",
    "tests/tracking/test_mlflow.py",
    "tests/compare/test_compare.py",
    "tests/finalize/test_finalize.py",
    "tests/tuning/test_search.py",
    "tests/tuning/test_tune_shared_state.py",
    "tests/adversarial/test_hostile_input.py",
    "tests/adversarial/test_shared_state.py",
    "tests/tracking/test_viewers.py",
)


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first (see :data:`LONGEST_MODULES`); a stable sort keeps each module's own order."""
    rank = {module: index for index, module in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(_module(item.nodeid), len(rank)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print each module's time (set-up, call and tear-down of its tests) to keep LONGEST_MODULES current."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                seconds[_module(report.nodeid)] = seconds.get(_module(report.nodeid), 0.0) + report.duration
    if not seconds:
        return
    terminalreporter.section("time per test module (longest first; tests/conftest.py:LONGEST_MODULES)")
    for module, total in sorted(seconds.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{total:8.1f}s {module}")


@pytest.fixture(scope="session")
def msd16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic MSD dataset: 12 training cases of 16^3 x 4 modalities, 2 test cases."""
    from distmis.data import write_synthetic_msd

    return write_synthetic_msd(tmp_path_factory.mktemp("msd") / "msd16", cases=12, shape=(16, 16, 16), seed=3)


@pytest.fixture(scope="session")
def prepared16(msd16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``msd16`` prepared: split 8/2/2, binary labels, 2 shards per split."""
    from distmis.data import prepare_dataset

    out = tmp_path_factory.mktemp("prep") / "prepared16"
    prepare_dataset(msd16, out, shape=(16, 16, 16), split=(0.7, 0.15, 0.15), shards=2, seed=0, workers=2)
    return out


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "data-home"
    monkeypatch.setenv("DISTMIS_DATA_HOME", str(home))
    return home
