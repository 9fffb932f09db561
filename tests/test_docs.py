"""The documentation: the site builds strictly (a broken link or a page left out of the navigation
fails), every ``distmis`` command written in the README and the docs parses as written with
distmis's own parser, and the ones that take seconds run as written and exit 0."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _support.documented import QUICK, documented_commands, run_all

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


def test_every_documented_command_parses_with_the_real_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """Each command as written (its subcommand, options, their values and the positional arguments):
    what argparse would refuse before distmis ran anything."""
    from distmis.cli import build_parser

    parser = build_parser()
    commands = documented_commands()
    assert len(commands) > 20  # the README's and the docs' examples were found
    bad = []
    for command in commands:
        try:
            parser.parse_args(command.words)
        except SystemExit as exc:
            if exc.code not in (0, None):  # --help and --version exit 0
                error = capsys.readouterr().err.strip().splitlines()
                bad.append(f"{command.where}: distmis {' '.join(command.argv)}: {error[-1] if error else exc.code}")
    assert bad == []


def test_the_documented_commands_that_take_seconds_run_as_written(tmp_path: Path) -> None:
    """synth, inspect, init, prepare, visualize, validate, simulate, cluster sbatch and doctor, as the
    README and docs/ write them, in order, on stand-ins for the user's data (``tests/_support/documented.py
    --all`` runs the searches and what follows them too)."""
    ran, failures = run_all(tmp_path)
    assert failures == []
    assert {c.argv[0] for c in ran} == QUICK and len(ran) >= 14


@pytest.mark.parametrize("name", ["README.md"])
def test_the_readme_is_a_front_page(name: str) -> None:
    text = (REPO / name).read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link


def test_no_page_repeats_a_heading() -> None:
    """A heading written twice is a section pasted twice, and its second anchor (``#x_1``) is one no
    link means; mkdocs builds it without a warning."""
    repeated = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = page.read_text(encoding="utf-8").splitlines()
        fence = False
        seen: set[str] = set()
        for line in lines:
            fence ^= line.lstrip().startswith("```")
            heading = re.match(r"#{1,6} (.+)", line) if not fence else None
            if heading and heading.group(1).strip() in seen:
                repeated.append(f"{page.name}: {heading.group(1).strip()}")
            elif heading:
                seen.add(heading.group(1).strip())
    assert repeated == []


#: the pages that record measurements, each with the date it was made; every other page is usage
DATED_PAGES = {"benchmarks.md"}


def test_usage_pages_carry_no_calendar_dates() -> None:
    """A date on a usage page is a measurement that belongs in docs/benchmarks.md, where each
    section names its date and command; a usage page read next year must not read as a diary."""
    dated = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if page.name in DATED_PAGES:
            continue
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\b20\d\d-[01]\d-[0-3]\d\b", line):
                dated.append(f"{page.name}:{number}: {line.strip()}")
    assert dated == []


def test_the_simulate_page_is_a_usage_page() -> None:
    """What it simulates, how to run it, how to read it, its fidelity in one table and its limits:
    the studies behind them are in docs/benchmarks.md."""
    text = (REPO / "docs" / "simulate.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    for heading in ("## Reading the table", "## Fidelity", "## Limits", "## Simulating your own cluster"):
        assert heading in text.splitlines()
