"""The ``distmis`` command line.

Each subcommand lives in its own module with ``add_arguments(parser)`` and ``run(args)``;
heavy libraries (TensorFlow, Ray) are imported inside ``run`` so that ``--help`` and
``validate`` stay fast. A ``DistmisError`` is printed as one ``distmis: error:`` line and
exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from distmis import __version__
from distmis.exceptions import DistmisError
from distmis.exitcodes import KEYBOARD_INTERRUPT, USAGE
from distmis.tensorflow_env import apply_tensorflow_env, exit_without_teardown

TENSORFLOW_HINT = "pip install 'distmis[cpu]' (or 'distmis[gpu]' on GPU nodes)"


class _Parser(argparse.ArgumentParser):
    """argparse with distmis' error format: one ``distmis: error:`` line naming the option, exit 2."""

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")
        command = self.prog.removeprefix("distmis").strip()
        hint = f" (see distmis {command} --help)" if command else " (see distmis --help)"
        self.exit(2, f"distmis: error: {message}{hint}\n")


COMMANDS = {
    "synth": "write a synthetic MSD-layout NIfTI dataset",
    "prepare": "MSD dataset -> chunked per-case arrays + info.json",
    "init": "write a search file for an MSD dataset, planned from its fingerprint (patch, labels, recipe, budget)",
    "inspect": "fingerprint an MSD dataset: shapes, spacing, intensities, labels, warnings, a suggested patch",
    "visualize": "draw a prepared case (channels + label overlay) as PNG or GIF",
    "train": "train one configuration (no search)",
    "tune": "run a hyperparameter search from a search-space YAML",
    "compare": "experiment vs data vs hybrid parallelism: same configurations, same resources, side by side",
    "finalize": "cross-validate a search's best configurations and write RUN/final/, an ensemble of fold models",
    "simulate": "replay recorded learning curves through a search's own searcher and scheduler on a virtual clock",
    "predict": "segment raw NIfTI scans with a trained model (sliding window, source geometry out)",
    "evaluate": "score a model on held-out raw cases: Dice, IoU, HD95 (mm), sensitivity, specificity",
    "validate": "check a configuration / search-space file without running it",
    "ui": "start the MLflow UI over the tracking store (127.0.0.1 by default)",
    "cluster": "SLURM: print or submit an sbatch script that runs a command on a per-job Ray cluster",
    "doctor": "check ports, temp path length, GPUs, TF/Keras, token file mode, Ray and SLURM versions",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="distmis",
        description="Hyperparameter search for 3D medical image segmentation on Ray: experiment vs data parallelism.",
    )
    parser.add_argument("--version", action="version", version=f"distmis {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"distmis.cli.{name}")
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (testable without a subprocess)."""
    # TensorFlow reads its environment at import: set before anything can import it
    apply_tensorflow_env()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after a bare `--` is a command to pass on (distmis cluster ... -- distmis tune x.yaml)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an option error already printed
        return int(exc.code or 0)
    args.passthrough = passthrough
    try:
        return int(args._module.run(args) or 0)
    except DistmisError as exc:
        from distmis.redact import redact

        print(f"distmis: error: {redact(str(exc))}", file=sys.stderr)  # a URI in a message keeps no password
        return USAGE
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("tensorflow", "keras"):
            print(
                f"distmis: error: {exc.name.split('.')[0]} is not installed in this environment "
                f"({sys.executable}); {TENSORFLOW_HINT}",
                file=sys.stderr,
            )
            return USAGE
        raise
    except KeyboardInterrupt:
        print("distmis: interrupted", file=sys.stderr)
        return KEYBOARD_INTERRUPT
    except Exception as exc:
        from distmis.files import disk_failure

        failure = disk_failure(exc)
        if failure is None:
            raise
        print(f"distmis: error: {failure}", file=sys.stderr)
        return USAGE


def entrypoint() -> None:
    """The ``distmis`` command: :func:`main`, then an exit that skips the interpreter's teardown.

    Why: once everything is written and every exit handler has run, Python's own teardown
    frees Ray's, MLflow's, pandas's and matplotlib's modules one object at a time, which the
    user waits for and nothing needs. The handler registered here is the first, so it
    runs last: Ray has stopped, the private token is removed, logs are flushed, non-daemon
    threads have ended (Python joins them before any exit handler); then the process ends with
    :func:`main`'s code. A call that raises is left to Python's usual exit.
    """
    code: list[int] = []
    atexit.register(_exit_now, code)
    try:
        code.append(main())
    except BrokenPipeError:
        code.append(_reader_gone())
    sys.exit(code[0])


def _reader_gone() -> int:
    """Standard output's reader went away (``distmis validate x.yaml | head -1``): end quietly.

    Python ignores SIGPIPE, so a write to a closed pipe raises instead of ending the process
    as it ends ``cat`` or ``git log``. What is still buffered goes to ``/dev/null`` (Python's
    recipe in the :mod:`signal` docs), and the exit code is the one a shell reports for a
    tool ended by SIGPIPE, so ``set -o pipefail`` still sees it.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError):  # stdout already closed or replaced
        os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _exit_now(code: list[int]) -> None:
    if code:
        exit_without_teardown(code[0])
