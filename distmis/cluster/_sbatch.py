"""Fill the sbatch template (``cluster/distmis.sbatch.template``, package data) into a job script.

Every value the user gives is checked against what SLURM accepts, and every value that reaches
the script body is shell-quoted: the script runs only what the user wrote. Values that end up
in ``#SBATCH`` lines (which sbatch reads before any shell does) cannot be quoted there, so they
are restricted to characters that need no quoting.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from distmis.exceptions import ClusterError
from distmis.redact import has_credentials, redact

_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PARTITION = re.compile(r"^[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*$")
# what may stand in an #SBATCH line unquoted (the job directory's parent is the log directory)
_SBATCH_PATH = re.compile(r"^[A-Za-z0-9._/%+@=,:-]+$")
# SLURM's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME_FORMATS = (
    (re.compile(r"^(\d+)$"), lambda m: int(m[1]) * 60),
    (re.compile(r"^(\d+):(\d{1,2})$"), lambda m: int(m[1]) * 60 + int(m[2])),
    (re.compile(r"^(\d+):(\d{1,2}):(\d{1,2})$"), lambda m: int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])),
    (re.compile(r"^(\d+)-(\d+)$"), lambda m: int(m[1]) * 86400 + int(m[2]) * 3600),
    (re.compile(r"^(\d+)-(\d+):(\d{1,2})$"), lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60),
    (
        re.compile(r"^(\d+)-(\d+):(\d{1,2}):(\d{1,2})$"),
        lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4]),
    ),
)


def _template() -> str:
    # cluster/distmis.sbatch.template in the repository is a link to this file
    return resources.files("distmis").joinpath("resources/distmis.sbatch.template").read_text()


def time_limit_seconds(text: str) -> int | None:
    """Seconds of a SLURM ``--time`` value (``None`` for UNLIMITED).

    Raises:
        ClusterError: not one of SLURM's formats, or zero.
    """
    if text.strip().upper() in ("UNLIMITED", "INFINITE"):
        return None
    for pattern, seconds in _TIME_FORMATS:
        match = pattern.match(text)
        if match:
            total = seconds(match)
            if total <= 0:
                raise ClusterError(f"--time {text!r}: the wall time must be longer than 0")
            return total
    raise ClusterError(
        f"--time {text!r}: expected SLURM's format: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
        "D-HH:MM:SS (e.g. 12:00:00)"
    )


def _printable(value: str, option: str) -> None:
    bad = sorted({c for c in value if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ClusterError(
            f"{option}: control characters {[hex(ord(c)) for c in bad]} (a newline in a job script "
            "would start a new command)"
        )


@dataclass(frozen=True)
class JobOptions:
    """What ``distmis cluster sbatch|submit`` puts into the job script, checked on construction."""

    nodes: int
    cpus_per_node: int
    gpus_per_node: int = 0
    time: str = "01:00:00"
    partition: str | None = None
    job_name: str = "distmis"
    job_dir: str = "runs/slurm-%j"
    venv: str | None = None
    timeout: int = 300
    signal_window: int = 120
    max_requeues: int = 5
    resume_on_requeue: bool = True

    def __post_init__(self) -> None:
        for name in ("nodes", "cpus_per_node", "timeout", "signal_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ClusterError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {value!r}")
        for name in ("gpus_per_node", "max_requeues"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ClusterError(f"--{name.replace('_', '-')}: expected an integer >= 0, got {value!r}")
        _printable(self.job_name, "--job-name")
        if not _JOB_NAME.match(self.job_name):
            raise ClusterError(f"--job-name {self.job_name!r}: use letters, digits, '.', '_' and '-' (at most 128)")
        if self.partition is not None:
            _printable(self.partition, "--partition")
            if not _PARTITION.match(self.partition):
                raise ClusterError(
                    f"--partition {self.partition!r}: expected partition names of letters, digits, "
                    "'.', '_', '-', separated by commas"
                )
        _printable(self.time, "--time")
        limit = time_limit_seconds(self.time)
        if limit is not None and self.signal_window >= limit:
            raise ClusterError(
                f"--signal-window {self.signal_window} s: must be shorter than the wall time "
                f"--time {self.time} ({limit} s)"
            )
        _printable(self.job_dir, "--job-dir")
        if not _SBATCH_PATH.match(self.job_dir):
            bad = sorted({c for c in self.job_dir if not _SBATCH_PATH.match(c)})
            raise ClusterError(
                f"--job-dir {self.job_dir!r}: characters {bad} are not allowed (its parent directory "
                "goes into #SBATCH --output, which no shell quotes); use letters, digits and ._/%+@=,:-"
            )
        if self.venv is not None:
            _printable(self.venv, "--venv")

    @property
    def job_dir_absolute(self) -> str:
        return self.job_dir if self.job_dir.startswith("/") else str(Path(self.job_dir).absolute())

    @property
    def log_dir(self) -> str:
        return str(Path(self.job_dir_absolute).parent)


def check_venv(venv: str) -> Path:
    """The virtual environment the nodes activate: it must exist here (shared filesystem)."""
    path = Path(venv).expanduser()
    if not (path / "bin" / "activate").is_file():
        raise ClusterError(
            f"--venv {venv}: no bin/activate there; give the virtual environment the nodes should "
            "use, or --no-venv to set the environment up in the script yourself"
        )
    return path.absolute()


def render_sbatch(command: list[str], options: JobOptions) -> str:
    """The text of an sbatch script that runs ``command`` on a fresh Ray cluster over ``options.nodes`` nodes."""
    if not command:
        raise ClusterError("give the command to run after --, e.g. -- distmis tune my_space.yaml")
    for i, arg in enumerate(command):
        if "\0" in arg:
            raise ClusterError(f"command argument {i + 1}: contains a NUL byte")
        if has_credentials(arg):
            raise ClusterError(
                f"command argument {i + 1} ({redact(arg)}) carries credentials in a URI: a job script keeps its "
                "command in plain text, and SLURM stores it; give the address without them and the secret "
                "through the environment, which sbatch passes on (MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD for an MLflow server, PGPASSWORD or ~/.pgpass for PostgreSQL)"
            )
    activate = (
        f"source {shlex.quote(str(Path(options.venv) / 'bin' / 'activate'))}"
        if options.venv
        else "# (no virtual environment: set up python with distmis here)"
    )
    return Template(_template()).safe_substitute(
        job_name=options.job_name,
        nodes=options.nodes,
        cpus_per_node=options.cpus_per_node,
        gpu_line=f"#SBATCH --gpus-per-node={options.gpus_per_node}"
        if options.gpus_per_node
        else "# (no GPUs requested)",
        time=options.time,
        partition_line=f"#SBATCH --partition={options.partition}" if options.partition else "# (default partition)",
        log_dir=options.log_dir,
        signal_window=options.signal_window,
        activate_line=activate,
        job_dir_pattern=shlex.quote(options.job_dir_absolute),
        timeout=options.timeout,
        max_requeues=options.max_requeues,
        resume_on_requeue="yes" if options.resume_on_requeue else "no",
        command=" ".join(shlex.quote(arg) for arg in command),
    )


def default_venv() -> str:
    """The environment this command runs in (what the nodes should activate)."""
    return sys.prefix


__all__ = ["JobOptions", "check_venv", "default_venv", "render_sbatch", "time_limit_seconds"]
