"""The documentation: the site builds strictly (a broken link or a page left out of the navigation
fails), and every ``distmis`` command written in the README and the docs names a real subcommand
and only options that subcommand has."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MKDOCS, "-f", str(root / "mkdocs.yml"), "-d", str(site)], capture_output=True, text=True, timeout=300
    )


def test_the_docs_build_strictly_with_the_generated_configuration_reference(tmp_path: Path) -> None:
    done = _build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    page = (tmp_path / "site" / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "train.epochs" in page and "search.startup_trials" in page  # the reference was generated


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "slurm.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the missing page](missing.md).\n", encoding="utf-8")
    done = _build(copy, tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stdout + done.stderr


def _documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after ``distmis``) of every command line in a fenced shell block."""
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
                found.append((f"{path.relative_to(REPO)}:{number}", words[1:]))
    return found


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def test_every_documented_command_names_a_real_subcommand_and_its_options() -> None:
    from distmis.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = _documented_commands()
    assert len(commands) > 20  # the README's and the docs' examples were found
    bad = []
    for where, argv in commands:
        if argv[0] in ("-h", "--help", "--version"):
            continue
        command = sub.choices.get(argv[0])
        if command is None:
            bad.append(f"{where}: no subcommand {argv[0]!r}")
            continue
        words = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
        unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in _options(command)]
        bad += [f"{where}: distmis {argv[0]} has no option {w}" for w in unknown]
    assert bad == []


@pytest.mark.parametrize("name", ["README.md"])
def test_the_readme_is_a_front_page(name: str) -> None:
    text = (REPO / name).read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link
