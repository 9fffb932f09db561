"""Small helpers shared by subcommands: shape parsing and progress bars."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator


def shape3(text: str) -> tuple[int, int, int]:
    """Parse ``32,32,32`` (or a single ``32``) into a 3-tuple of positive ints."""
    try:
        parts = [int(p) for p in text.replace("x", ",").split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected X,Y,Z positive integers, got {text!r}") from None
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or any(p <= 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected X,Y,Z positive integers, got {text!r}")
    return parts[0], parts[1], parts[2]


def fractions3(text: str) -> tuple[float, float, float]:
    try:
        parts = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TRAIN,VAL,TEST fractions, got {text!r}") from None
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected TRAIN,VAL,TEST fractions, got {text!r}")
    return parts[0], parts[1], parts[2]


@contextlib.contextmanager
def progress(description: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar; yields ``update(done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
