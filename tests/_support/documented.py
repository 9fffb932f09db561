"""The ``distmis`` commands the README and docs/ show, and a runner that runs them as written.

Each documentation file's commands run in order in a workspace of their own, as a reader would
type them one after another. Paths that exist only on a user's machine get stand-ins made on
first use: an MSD brain-tumour dataset (``synth``), a CT dataset (``ctdata``), the search files
of the repository, a training file and the two files ``simulate``'s example compares. An
absolute path (``/data/Task01_BrainTumour``, ``/shared/runs/x``) is read inside the workspace.

The suite runs the commands that take seconds (``QUICK``); the rest (a search, finalize, predict,
evaluate, compare, train) need minutes, and their own tests run them with the real parts:

    python tests/_support/documented.py            # the quick ones
    python tests/_support/documented.py --all      # every one (about 7 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SHELL_OPERATORS = {">", ">>", "|", "&&", "||", ";", "2>&1", "&"}
#: subcommands that finish in seconds on the stand-ins
QUICK = {"synth", "inspect", "init", "prepare", "visualize", "validate", "simulate", "cluster", "doctor"}
#: commands that cannot run here (a part of the command as written), and why
NOT_HERE = {
    " ui ": "a server that runs until stopped (tests/tracking opens it in a real browser)",
    " --tracking-uri ": "a tracking server on another host",
    " --verbose ": "the search above again, with Ray Tune's own tables",
    " tune my_space.yaml ": "a Ray cluster that is already running (RAY_ADDRESS)",
    " runs/pilot ": "a finished search without a scheduler, which no example makes",
    " tune brats.yaml ": "the search init planned for the user's data: hours on GPUs",
    " runs/Task01_BrainTumour": "the search init planned for the user's data",
    " runs/x/final ": "a search of the reader's (docs/index.md's runs/quickstart is run)",
    " finalize runs/x ": "a search of the reader's (docs/index.md's runs/quickstart is run)",
}


@dataclass
class Command:
    """One documented command: where it is written and its words after ``distmis``."""

    page: Path
    line: int
    argv: list[str]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def words(self) -> list[str]:
        """What distmis parses: up to a bare ``--`` (the rest is passed on) or a shell operator."""
        words = self.argv[: self.argv.index("--")] if "--" in self.argv else self.argv
        return list(itertools.takewhile(lambda w: w not in SHELL_OPERATORS, words))

    @property
    def typed(self) -> list[str]:
        """What the shell hands distmis: every word before a shell operator."""
        return list(itertools.takewhile(lambda w: w not in SHELL_OPERATORS, self.argv))

    @property
    def stdout_to(self) -> str | None:
        """The file a ``>`` sends the command's output to, if any."""
        return self.argv[self.argv.index(">") + 1] if ">" in self.argv else None

    def skipped_because(self) -> str | None:
        text = f" {' '.join(self.words)} "  # not what a bare -- passes on
        return next((why for key, why in NOT_HERE.items() if key in text), None)


def documented_commands() -> list[Command]:
    """Every ``distmis`` command line in a fenced shell block of the README and docs/."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        in_shell = False
        # a command continued over lines (a trailing backslash) is one command, at its first line
        text_lines = path.read_text(encoding="utf-8").replace("\\\n", " ").splitlines()
        for number, line in enumerate(text_lines, start=1):
            if line.startswith("```"):
                in_shell = line.strip() in ("```bash", "```sh", "```shell", "```console")
                continue
            if not in_shell:
                continue
            text = line.split(" #", 1)[0].strip().removeprefix("$ ")
            words = shlex.split(text, comments=True) if text else []
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words = words[1:]  # VAR=value distmis ...
            if words and Path(words[0]).name == "distmis" and len(words) > 1:
                found.append(Command(path, number, words[1:]))
    return found


def _synth(out: Path, *extra: str) -> None:
    from distmis.cli import main

    assert main(["synth", str(out), "--cases", "12", "--shape", "32,32,32", *extra]) == 0


def _ct(out: Path) -> None:
    from _support.ctdata import write_ct

    write_ct(out, cases=8, shape=(32, 32, 32))


def _copy(relative: str) -> Callable[[Path], None]:
    def copy(out: Path) -> None:
        (shutil.copytree if (REPO / relative).is_dir() else shutil.copy)(REPO / relative, out)

    return copy


def _training_file(out: Path) -> None:
    """The quickstart's model trained once on the prepared data the docs' prepare example made."""
    doc = yaml.safe_load((REPO / "search_spaces" / "quickstart.yaml").read_text())
    doc["data"]["source"] = "data/prepared"
    doc.pop("space", None)
    out.write_text(yaml.safe_dump(doc))


def _anatomy_variant(algorithm: str) -> Callable[[Path], None]:
    def write(out: Path) -> None:
        doc = yaml.safe_load((REPO / "benchmarks" / "curves" / "anatomy32.yaml").read_text())
        doc["name"], doc["search"]["algorithm"] = out.stem, algorithm
        out.write_text(yaml.safe_dump(doc))

    return write


#: what a documented path stands for where it is not in the workspace yet
STANDINS: dict[str, Callable[[Path], None]] = {
    "Task01_BrainTumour": _synth,
    "data/Task01_BrainTumour": _synth,
    "Task03_Liver": _ct,
    "search_spaces": _copy("search_spaces"),
    "benchmarks": lambda out: (out.mkdir(), _copy("benchmarks/curves")(out / "curves")),
    "my_space.yaml": _copy("search_spaces/quickstart.yaml"),
    "config.yaml": _training_file,
    "random.yaml": _anatomy_variant("random"),
    "default.yaml": _anatomy_variant("optuna"),
    "one_case.nii.gz": lambda out: shutil.copy(sorted(out.parent.glob("data/msd_synth/imagesTs/*"))[0], out),
    "scans": lambda out: shutil.copytree(out.parent / "data" / "msd_synth" / "imagesTs", out),
}


def _in_workspace(word: str) -> str:
    """An absolute path of the docs, read inside the workspace."""
    return word.lstrip("/") if word.startswith("/") and not word.startswith("//") else word


@contextlib.contextmanager
def _inside(directory: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def run(command: Command, workspace: Path) -> tuple[int, float, str]:
    """Run one command in ``workspace`` (stand-ins made first); returns its exit code, seconds and output."""
    from distmis.cli import main

    words = command.words
    argv = [_in_workspace(w) for w in words] + command.typed[len(words) :]
    with _inside(workspace):
        for word in argv[1:]:
            root = word.split("/", 1)[0]
            for key in (word, root):
                if key in STANDINS and not Path(key).exists():
                    Path(key).parent.mkdir(parents=True, exist_ok=True)
                    STANDINS[key](Path(key).resolve())
        output = Path(_in_workspace(command.stdout_to)) if command.stdout_to else workspace / ".output"
        t0 = time.perf_counter()
        with open(output, "w") as sink, contextlib.redirect_stdout(sink):
            code = main(argv)
        return code, time.perf_counter() - t0, output.read_text()


def run_all(root: Path, *, quick_only: bool = True, echo: bool = False) -> tuple[list[Command], list[str]]:
    """Run the documented commands, each page's in its own workspace under ``root``; returns the
    commands run and the failures."""
    ran, failures = [], []
    for page, commands in itertools.groupby(documented_commands(), key=lambda c: c.page):
        workspace = root / page.stem
        workspace.mkdir(parents=True, exist_ok=True)
        for command in commands:
            skip = command.skipped_because() or (
                None if not quick_only or command.argv[0] in QUICK else "takes minutes (--all)"
            )
            if skip:
                if echo:
                    print(f"  skip  {command.where}: distmis {' '.join(command.argv)} ({skip})", flush=True)
                continue
            code, seconds, _ = run(command, workspace)
            ran.append(command)
            if echo:
                print(f"  rc={code} {seconds:6.1f}s  {command.where}: distmis {' '.join(command.argv)}", flush=True)
            if code != 0:
                failures.append(f"{command.where}: distmis {' '.join(command.argv)} exited {code}")
    return ran, failures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="also the commands that take minutes")
    p.add_argument("--out", type=Path, default=None, help="the workspaces' folder (default: a new temporary one)")
    a = p.parse_args()
    import tempfile

    root = a.out or Path(tempfile.mkdtemp(prefix="distmis-docs-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    print(f"workspaces in {root}", flush=True)
    ran, failures = run_all(root, quick_only=not a.all, echo=True)
    print("\n".join(failures) or f"all {len(ran)} commands run exited 0")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "tests"))  # as the suite's conftest puts it: _support is importable
    sys.exit(main())
