"""Commands that write an output, on a disk too small for it, run as a user runs them.

Each gets one ``distmis: error:`` line naming a path on that disk and ENOSPC, exit code 2, no
traceback, and leaves nothing behind (no half-written output, temporary or lock file). The
searches' own full-disk cases (prepare, tune's bookkeeping, predict) are in
tests/tuning/test_tune_shared_state.py and tests/inference/test_predict.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _support.smalldisk import small_disk

COMMANDS = {
    # a gzip stream's write fails without a file name: the error must still name the output
    "synth": lambda msd, prep, out: ["synth", str(out / "msd"), "--cases", "4", "--shape", "32,32,32"],
    "inspect": lambda msd, prep, out: ["inspect", str(msd), "--out", str(out / "fingerprint")],
    "visualize-png": lambda msd, prep, out: ["visualize", str(prep), "--out", str(out / "case.png")],
    "visualize-gif": lambda msd, prep, out: ["visualize", str(prep), "--out", str(out / "case.gif")],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_full_disk_gives_one_error_naming_the_output_and_leaves_nothing(
    command: str, msd16: Path, prepared16: Path, tmp_path: Path
) -> None:
    with small_disk(tmp_path / "disk", "8k") as disk:
        args = COMMANDS[command](msd16, prepared16, disk)
        result = subprocess.run(
            [sys.executable, "-m", "distmis", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
        assert len(errors) == 1, result.stderr[-2000:]
        assert "ENOSPC" in errors[0] and str(disk) in errors[0], errors[0]
        assert "Traceback" not in result.stderr
        assert list(disk.iterdir()) == []  # nothing half-written, no temporary, no lock file
