"""Run pytest with one busy CPU hog beside it: the suite's process-heavy part under load.

A test that waits on another process must observe a state (a file, a row, a port), never assume
that one process is faster than another; a busy CI machine is where such an assumption breaks.
This keeps one core busy (a spinning process at normal priority) for as long as pytest runs,
and passes every argument on to pytest.

    python tests/_support/stress.py [pytest arguments]        # make test-stress
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time

#: the tests that start processes and wait on them: Ray clusters, trials, servers, SLURM
PROCESS_HEAVY = [
    "tests/tuning",
    "tests/tracking",
    "tests/compare",
    "tests/cluster",
    "tests/training/test_distributed.py",
    "tests/inference/test_predict.py",
]


def _spin() -> None:
    while True:
        pass


def main() -> int:
    hog = multiprocessing.Process(target=_spin, name="distmis-cpu-hog", daemon=True)
    hog.start()
    start = time.monotonic()
    try:
        args = sys.argv[1:] or PROCESS_HEAVY
        return subprocess.call([sys.executable, "-m", "pytest", *args])
    finally:
        hog.terminate()
        hog.join(10)
        print(f"stress: pytest beside one busy CPU hog, {(time.monotonic() - start) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    sys.exit(main())
