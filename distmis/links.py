"""Every path distmis writes, replaces or removes is opened without following a symbolic link.

Why: a project directory on a cluster is often writable by a whole group. A link planted at a
path distmis writes (a run's ``.distmis-lock``, its ``metrics.csv``) would make someone else's
distmis write into the link's target, a file of theirs. So a write opens its file with
``O_NOFOLLOW`` and checks what it opened (a regular file with one name: a hard link to another
file is refused as well); a path about to be replaced or used as a directory is looked at with
``lstat``. A link found there is refused with one error that names it, and nothing is written.

The user's own choice of where an output goes (``--out`` under a linked scratch directory) is
not affected: only the last component of a path is checked, and the directories distmis makes
inside its outputs are checked when it makes or reuses them (:func:`ensure_directory`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

from distmis.exceptions import OutputError

#: ``open()`` modes distmis writes with, as ``os.open`` flags (binary and text alike)
_MODES = {
    "w": os.O_WRONLY | os.O_CREAT,  # truncated only once the file is known to be ours to write
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
    "r+": os.O_RDWR | os.O_CREAT,
}
#: the flags every file distmis opens takes: a symbolic link is not followed, nor handed to a child
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def link_error(path: str | os.PathLike[str], *, what: str = "") -> OutputError:
    """The one error for a symbolic link found where distmis writes."""
    path = Path(path)
    try:
        target = f" (to {path.readlink()})"
    except OSError:
        target = ""
    kind = f"its {what}" if what else "a file"
    return OutputError(
        f"{path}: a symbolic link{target} where distmis writes {kind}; distmis never writes through a link: "
        "remove the link (its target is untouched), or choose another output"
    )


def refuse_link(path: str | os.PathLike[str], *, what: str = "") -> None:
    """Refuse ``path`` when it is a symbolic link (before it is replaced, removed or written).

    Raises:
        OutputError: ``path`` is a symbolic link.
    """
    if Path(path).is_symlink():
        raise link_error(path, what=what)


def open_nofollow(path: str | os.PathLike[str], mode: str = "w", *, what: str = "", **kwargs: Any) -> IO[Any]:
    """``open(path, mode)`` for writing, refusing a symbolic link, a hard link or a non-regular file.

    ``mode`` is one of ``w``, ``a``, ``a+``, ``r+`` with an optional ``b``; ``kwargs`` go to
    :func:`os.fdopen` (``encoding``, ``newline``). New files get the modes the umask gives.

    Raises:
        OutputError: ``path`` is a symbolic link, has other names (a hard link), or is not a
            regular file (a FIFO would block, a device would be written to).
    """
    binary = "b" in mode
    base = mode.replace("b", "").replace("t", "")
    flags = _MODES[base] | NOFOLLOW
    existed = os.path.lexists(path)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_error(path, what=what) from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise OutputError(f"{path}: not a regular file; distmis writes only regular files there") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OutputError(f"{path}: not a regular file; distmis writes only regular files there")
        if info.st_nlink > 1 and existed:
            raise OutputError(
                f"{path}: this file has {info.st_nlink} names (a hard link to another file); distmis never writes "
                "through a link: remove it, or choose another output"
            )
        os.set_blocking(fd, True)
        if base == "w" and existed:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, ("w" if base == "w" else base) + ("b" if binary else ""), **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular_text(path: str | os.PathLike[str], *, follow_links: bool = False) -> str:
    """The UTF-8 text of ``path`` when it is a regular file (and, unless ``follow_links``, not a link to one).

    A FIFO in a record's place would block the reader forever before its first line of output;
    opened without blocking, it is refused. Without ``follow_links``, for the files distmis keeps
    for itself (checksum stamps, an output's marker): a link could make it read another's file as
    its own.

    Raises:
        OSError: missing, a link (ELOOP) unless followed, or not a regular file (EINVAL).
        UnicodeDecodeError: not UTF-8.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else NOFOLLOW))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, encoding="utf-8") as fh:
            fd = -1
            return fh.read()
    finally:
        if fd >= 0:
            os.close(fd)


def refuse_links_within(root: str | os.PathLike[str], *, what: str = "") -> None:
    """Refuse a symbolic link anywhere inside ``root`` (an output distmis is about to write into
    again: a search resumed, a run retrained).

    Why the whole tree and not each path as it is written: Ray Tune writes its state through its
    own filesystem layer, and a directory link (``RUN/plots`` pointing at a user's folder) would
    send every file written below it into the link's target. Checked once when the output is
    claimed, under its lock, before anything is written; links are not followed while looking.

    Raises:
        OutputError: naming the first link found (in sorted order).
    """
    pending = [os.fspath(root)]
    while pending:
        try:
            entries = sorted(os.scandir(pending.pop()), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.is_symlink():
                raise link_error(entry.path, what=what or "output")
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)


def ensure_directory(path: str | os.PathLike[str], *, what: str = "") -> Path:
    """``mkdir -p path``, refusing a symbolic link at ``path`` itself (a directory distmis makes
    inside its own output: files written there would land in the link's target).

    Raises:
        OutputError: ``path`` is a symbolic link, or exists and is not a directory.
    """
    path = Path(path)
    refuse_link(path, what=what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{path}: exists and is not a directory") from None
    refuse_link(path, what=what)  # made by someone else between the check and the mkdir
    return path


__all__ = [
    "NOFOLLOW",
    "ensure_directory",
    "link_error",
    "open_nofollow",
    "read_regular_text",
    "refuse_link",
    "refuse_links_within",
]
