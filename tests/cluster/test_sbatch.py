"""The generated job script: every option checked, every value quoted, the wall-time protocol.

The script is run for real by bash, with stand-ins for ``srun`` and ``scontrol`` that record
what they were given: what the script executes is observed, not inferred from its text.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# stands in for srun and the head's bootstrap: it stops (75) when the stop file appears, as the head does
STUB_SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$STUB_DIR/srun.args"
jobdir=""; prev=""
for a in "$@"; do [ "$prev" = "--job-dir" ] && jobdir="$a"; prev="$a"; done
trap 'echo USR1 >> "$STUB_DIR/srun.signals"; exit 75' USR1
trap 'echo TERM >> "$STUB_DIR/srun.signals"; exit 143' TERM
if [ -n "${STUB_SLEEP:-}" ]; then
  touch "$STUB_DIR/srun.started"
  for i in $(seq 1 $((STUB_SLEEP * 10))); do
    if [ -e "$jobdir/stop-requested" ]; then echo STOPFILE >> "$STUB_DIR/srun.signals"; exit 75; fi
    sleep 0.1
  done
fi
exit "${STUB_EXIT:-0}"
"""
STUB_SCONTROL = """#!/bin/bash
echo "$@" >> "$STUB_DIR/scontrol.calls"
"""


def distmis(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distmis", *argv], cwd=cwd, capture_output=True, text=True, timeout=60)


def generate(tmp_path: Path, *options: str, command: tuple[str, ...] = ("distmis", "tune", "x.yaml")) -> Path:
    result = distmis(
        "cluster",
        "sbatch",
        "--nodes",
        "2",
        "--cpus-per-node",
        "2",
        "--no-venv",
        "--job-dir",
        str(tmp_path / "jobs" / "slurm-%j"),
        *options,
        "--",
        *command,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(result.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    return script


def run_script(
    tmp_path: Path, script: Path, *, restart: int = 0, send: signal.Signals | None = None, **stub: str
) -> subprocess.CompletedProcess[str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_DIR": str(stubs),
        "SLURM_JOB_ID": "123",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_RESTART_COUNT": str(restart),
        **stub,
    }
    proc = subprocess.Popen(
        ["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if send is not None:
        deadline = time.monotonic() + 30
        while not (stubs / "srun.started").exists():
            assert time.monotonic() < deadline, "the stub srun never started"
            time.sleep(0.05)
        time.sleep(0.2)
        proc.send_signal(send)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--job-name", "a\nrm -rf ~"], "--job-name"),
        (["--job-name", "$(touch pwned)"], "--job-name"),
        (["--job-dir", "runs/x$(touch pwned)/%j"], "--job-dir"),
        (["--job-dir", 'runs/a"b/%j'], "--job-dir"),
        (["--job-dir", "runs/with space/%j"], "--job-dir"),
        (["--job-dir", "runs/`touch pwned`/%j"], "--job-dir"),
        (["--job-dir", "runs/x\n#SBATCH --wrap=id/%j"], "--job-dir"),
        (["--partition", "gpu;reboot"], "--partition"),
        (["--partition", "gpu\n#SBATCH --uid=0"], "--partition"),
        (["--time", "garbage"], "--time"),
        (["--time", "0"], "--time"),
        (["--time", "1:00\n"], "--time"),
        (["--time", "00:01:00", "--signal-window", "120"], "--signal-window"),
        (["--timeout", "-5"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--nodes", "two"], "--nodes"),
        (["--max-requeues", "-1"], "--max-requeues"),
        (["--venv", "/nowhere/venv"], "--venv"),
    ],
)
def test_hostile_options_are_refused_and_nothing_is_written(tmp_path: Path, options: list[str], named: str) -> None:
    args = ["cluster", "sbatch", "--nodes", "2", *options, "--", "distmis", "tune", "x.yaml"]
    if "--venv" not in options:
        args.insert(2, "--no-venv")
    result = distmis(*args, cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("distmis: error:")]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(errors) == 1 and named in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no ./runs, no literal $(touch ...) folders


def test_printing_writes_nothing(tmp_path: Path) -> None:
    result = distmis("cluster", "sbatch", "--nodes", "2", "--job-dir", "runs/deep/slurm-%j", "--", "true", cwd=tmp_path)
    assert result.returncode == 0 and "#SBATCH --nodes=2" in result.stdout
    assert list(tmp_path.iterdir()) == []
    assert "mkdir -p" in result.stderr  # told what to create before submitting


def test_the_script_runs_exactly_the_given_command(tmp_path: Path) -> None:
    hostile = ("distmis", "tune", "a; touch pwned1", "$(touch pwned2)", "`touch pwned3`", "two\nlines", "it's", "*")
    script = generate(tmp_path, "--job-name", "my-run.1", "--time", "1-00:30", command=hostile)
    result = run_script(tmp_path, script)
    assert result.returncode == 0, result.stdout + result.stderr
    args = (tmp_path / "stubs" / "srun.args").read_bytes().split(b"\0")[:-1]
    cut = args.index(b"--")
    assert [a.decode() for a in args[cut + 1 :]] == list(hostile)  # verbatim, nothing added (not a requeue)
    assert not list(tmp_path.rglob("pwned*"))
    assert (tmp_path / "jobs" / "slurm-123").is_dir()
    assert not (tmp_path / "stubs" / "scontrol.calls").exists()  # finished: not requeued


def test_a_requeued_run_resumes(tmp_path: Path) -> None:
    script = generate(tmp_path)
    result = run_script(tmp_path, script, restart=1)
    args = (tmp_path / "stubs" / "srun.args").read_bytes().split(b"\0")[:-1]
    assert result.returncode == 0 and args[-1] == b"--resume"


def test_interrupted_search_is_requeued_until_the_cap(tmp_path: Path) -> None:
    script = generate(tmp_path, "--max-requeues", "3")
    result = run_script(tmp_path, script, restart=0, STUB_EXIT="75")
    assert result.returncode == 0
    assert (tmp_path / "stubs" / "scontrol.calls").read_text().split() == ["requeue", "123"]
    (tmp_path / "stubs" / "scontrol.calls").unlink()
    capped = run_script(tmp_path, script, restart=3, STUB_EXIT="75")
    assert capped.returncode == 75 and "not requeued" in capped.stdout
    assert not (tmp_path / "stubs" / "scontrol.calls").exists()
    failed = run_script(tmp_path, script, restart=0, STUB_EXIT="1")  # a real failure is not requeued
    assert failed.returncode == 1 and not (tmp_path / "stubs" / "scontrol.calls").exists()


def test_the_wall_time_warning_reaches_the_search_and_requeues(tmp_path: Path) -> None:
    script = generate(tmp_path)
    result = run_script(tmp_path, script, send=signal.SIGUSR1, STUB_SLEEP="30")
    assert result.returncode == 0, result.stdout + result.stderr
    # passed on as the stop file (a signal through srun would reach Ray's processes too and kill them)
    assert (tmp_path / "stubs" / "srun.signals").read_text().split() == ["STOPFILE"]
    assert (tmp_path / "jobs" / "slurm-123" / "stop-requested").exists()
    assert (tmp_path / "stubs" / "scontrol.calls").read_text().split() == ["requeue", "123"]


def test_cancel_stops_the_search_without_requeue(tmp_path: Path) -> None:
    script = generate(tmp_path)
    result = run_script(tmp_path, script, send=signal.SIGTERM, STUB_SLEEP="30")
    assert (tmp_path / "stubs" / "srun.signals").read_text().split() == ["TERM"]
    assert result.returncode == 143 and not (tmp_path / "stubs" / "scontrol.calls").exists()


def test_submit_without_sbatch_is_one_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/nonexistent"}
    result = subprocess.run(
        [sys.executable, "-m", "distmis", "cluster", "submit", "--no-venv", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.startswith("distmis: error: sbatch: not found on PATH")
    assert list(tmp_path.iterdir()) == []
