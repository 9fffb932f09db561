"""What a person sees while a search runs: one live view, the rest in a log file.

Ray Tune's own reporter prints boxed per-trial tables, checkpoint paths and every worker
process's output ("[repeated 5x across cluster]"); TensorFlow and Ray print from C++. A
64-second search printed about 360 lines. While the trials run, :func:`quiet_output` sends
all of that - Python and C-level writes alike (file descriptors 1 and 2) - to a log file in
the experiment directory, and distmis writes only its live view and its notices to the
terminal. ``--verbose`` keeps everything on the console, as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from distmis.links import open_nofollow

_console: Any = None  # the terminal while output is redirected, else None (stdout)
_notices: Any = None  # the terminal's stderr while output is redirected


def console() -> Any:
    """The rich Console that reaches the person at the terminal."""
    from rich.console import Console

    return _console if _console is not None else Console()


def notify(message: str) -> None:
    """A notice the person must see even while output goes to the log (``distmis: warning: ...``)."""
    print(message, file=_notices if _notices is not None else sys.stderr, flush=True)


@contextlib.contextmanager
def quiet_output(log_path: Path, *, verbose: bool) -> Iterator[Path | None]:
    """Send stdout and stderr (file descriptors 1 and 2) to ``log_path`` for the block."""
    global _console, _notices
    if verbose:
        yield None
        return
    from rich.console import Console

    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open_nofollow(log_path, "ab", what="log")
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved_out), "w", buffering=1)
    notices = os.fdopen(os.dup(saved_err), "w", buffering=1)
    with log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    _console, _notices = Console(file=terminal), notices
    try:
        yield log_path
    except OSError as exc:
        # a print on a full disk fails writing this log, and says no file: the user is told which
        if exc.filename is None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(exc.errno, exc.strerror, str(log_path)) from exc
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        _console = _notices = None
        terminal.close()
        notices.close()


__all__ = ["console", "notify", "quiet_output"]


@contextlib.contextmanager
def progress_bar(description: str) -> Iterator[Callable[..., None]]:
    """A progress bar on the console; yields ``update(done, total, description=None)``.

    On a terminal it redraws in place; in a log or a pipe rich draws it once, when it ends.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console()
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int, description: str | None = None) -> None:
            if description:
                bar.update(task, description=description)
            bar.update(task, completed=done, total=total)

        yield update
