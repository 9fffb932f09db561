"""Ray Tune's storage for a search: the local disk, where every file Tune copies in appears whole.

Why not Tune's default: Ray Tune keeps its experiment state (``experiment_state-*.json``, the
searcher's ``basic-variant-state-*.json`` or ``searcher-state-*.pkl``) in a staging directory
under ``/tmp/ray`` and copies it into ``--out/tune`` every few seconds with pyarrow's
``copy_files``, which writes each file in place. A command killed with SIGKILL during such a
copy leaves an empty ``basic-variant-state-*.json``; on ``--resume`` Tune cannot load it, logs
"Failed to restore the run state" and starts a new, empty experiment instead. A SLURM job killed at its wall time, the OOM
killer or a node failure can stop a search at the same moment.

pyarrow lets a program give Tune its own filesystem (``RunConfig.storage_filesystem``, a
:class:`pyarrow.fs.PyFileSystem`); this one is pyarrow's :class:`~pyarrow.fs.LocalFileSystem`
with one difference: a file is written under a hidden temporary name beside its own (distmis's
own temporary siblings, :func:`distmis.files.temporary_sibling`) and renamed over it when it is
closed. A rename within a directory is atomic on POSIX filesystems, so a kill leaves the
previous version of a file or the new one, never a part of it. The hidden ``.distmis-tmp-*``
file such a kill leaves behind matches no pattern of Tune's; a ``--resume`` removes it
(:func:`remove_partials`) before Tune reads the directory.
"""

from __future__ import annotations

import io
import logging
import os
import stat
from pathlib import Path
from typing import IO, Any

import pyarrow
import pyarrow.fs as pafs

from distmis.exceptions import OutputError
from distmis.files import open_nofollow, refuse_link, remove_temporaries, temporary_sibling
from distmis.links import NOFOLLOW, link_error

#: a file up to this size is held in memory until it is closed, and left alone when the file
#: under its name already holds the same bytes; a larger one goes on in its temporary file
_COMPARED_BYTES = 256 * 1024


class _WholeFile:
    """A binary file that replaces ``path`` only when complete (written under a temporary name and
    renamed), and not at all when ``path`` already holds the same bytes; a write or close that
    fails (a full disk) removes the temporary file and leaves ``path`` as it was.

    Why the comparison: Tune copies every file of its experiment directory at each sync, and only
    the running trials' files have changed. A temporary file and a rename for each of them made
    the driver's work per sync grow with every trial the search has run
    (``benchmarks/tune_storage.py``).
    """

    def __init__(self, path: str) -> None:
        self._path = Path(path)
        self._buffer: io.BytesIO | None = io.BytesIO()
        self._partial: Path | None = None
        self._file: IO[bytes] | None = None
        self._failed = False
        self._closed = False

    def _to_partial(self) -> None:
        """Go on in the temporary file, created now and given what the buffer holds."""
        self._partial = temporary_sibling(self._path)
        self._file = self._partial.open("wb")  # closed (and renamed) by close()
        if self._buffer is not None:
            self._file.write(self._buffer.getvalue())
            self._buffer = None

    def write(self, data: Any) -> int:
        try:
            if self._buffer is not None:
                written = self._buffer.write(data)
                if self._buffer.tell() > _COMPARED_BYTES:
                    self._to_partial()
                return written
            assert self._file is not None
            return self._file.write(data)
        except BaseException as exc:
            self._failed = True  # a full disk: the file under its name stays as it was
            raise self._naming(exc) from exc

    def flush(self) -> None:
        try:
            if self._file is not None:
                self._file.flush()
        except BaseException as exc:
            self._failed = True
            raise self._naming(exc) from exc

    def _naming(self, exc: BaseException) -> BaseException:
        """A write's OS error names no file; the one line the user sees must say which."""
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            return OSError(exc.errno, exc.strerror, str(self._path))
        return exc

    def tell(self) -> int:
        if self._buffer is not None:
            return self._buffer.tell()
        assert self._file is not None
        return self._file.tell()

    @property
    def closed(self) -> bool:
        return self._closed

    def _unchanged(self, data: bytes) -> bool:
        """Whether ``path`` is a regular file of one name that holds ``data`` already (read without
        following a link: a link is never taken for the file, and is refused by the write).

        Not :func:`open_nofollow`: it opens for writing, which a read-only file refuses, and this
        runs for every file of every sync of Tune's."""
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)
        except OSError:
            return False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size != len(data):
                return False
            held = b""
            while len(held) <= len(data) and (chunk := os.read(fd, len(data) + 1 - len(held))):
                held += chunk
            return held == data
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._failed:  # after a failed write the caller closes too: the write's error is the one to see
                return
            if self._buffer is not None and self._unchanged(self._buffer.getvalue()):
                return
            refuse_link(self._path)
            if self._buffer is not None:
                self._to_partial()
            assert self._file is not None and self._partial is not None
            self._file.close()
            self._partial.replace(self._path)
        except BaseException as exc:
            self._failed = True
            raise self._naming(exc) from exc
        finally:
            if self._file is not None and not self._file.closed:
                self._file.close()
            if self._failed and self._partial is not None:
                self._partial.unlink(missing_ok=True)


def refuse_linked_directories(path: str, root: Path | None) -> None:
    """Refuse ``path`` when a directory between ``root`` and it is a symbolic link.

    Why each time and not once: the output is checked for links when it is claimed, but a link
    planted while the search runs (``RUN/tune/<trial>`` pointing at a folder of scans) would send
    every later write, directory creation and checkpoint removal of Tune's below it into the
    link's target. A path outside ``root`` is not Tune's storage and is left to its writer.

    Raises:
        OutputError: naming the link.
    """
    if root is None:
        return
    target = Path(path)
    try:
        inside = target.relative_to(root)
    except ValueError:
        return
    current = root
    for part in inside.parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise link_error(current, what="search state (Ray Tune's storage)")


class WholeFileLocalHandler(pafs.FileSystemHandler):
    """pyarrow's local filesystem, whose output streams replace a file only when complete, and which
    neither writes, creates, moves nor removes anything below a directory link inside ``root``.

    ``skip_linked``: an operation below such a link is left undone, with one warning per link,
    instead of raised. The driver's copy is made so: its experiment sync copies the whole staging
    directory at once, and one refused file (a failed trial's ``error.txt`` below a linked trial
    directory) would fail every later sync, leaving the search's state, and so its best trial, as
    they were before the link. The copies sent to the trials raise, and the trial fails.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *, skip_linked: bool = False) -> None:
        self._local = pafs.LocalFileSystem()
        self._root = Path(root).absolute() if root is not None else None
        self._skip_linked = skip_linked
        self._warned: set[str] = set()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WholeFileLocalHandler) and other._root == self._root

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((type(self), self._root))

    def __reduce__(self) -> tuple[Any, tuple[str | None]]:
        # sent to every trial process with Tune's storage context: as this class, which they can import
        return (WholeFileLocalHandler, (None if self._root is None else str(self._root),))

    def _allowed(self, path: str, *, itself: bool = False) -> bool:
        """Whether ``path`` may be written; False (warned once) where the driver skips a link."""
        try:
            refuse_linked_directories(path, self._root)
            if itself and self._root is not None:
                refuse_link(path, what="search state (Ray Tune's storage)")
        except OutputError as exc:
            if not self._skip_linked:
                raise
            if str(exc) not in self._warned:
                self._warned.add(str(exc))
                logging.getLogger("distmis").warning("not written: %s", exc)
            return False
        return True

    def get_type_name(self) -> str:
        return "distmis-whole-file-local"

    def normalize_path(self, path: str) -> str:
        return str(self._local.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return list(self._local.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return list(self._local.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        if self._allowed(path, itself=True):
            self._local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        if self._allowed(path):
            self._local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        if self._allowed(path, itself=True):
            self._local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise PermissionError("distmis never empties the root directory")

    def delete_file(self, path: str) -> None:
        if self._allowed(path):
            self._local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        if self._allowed(src) and self._allowed(dest):
            self._local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with self._local.open_input_stream(src) as source, self.open_output_stream(dest, None) as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)

    def open_input_stream(self, path: str) -> pyarrow.NativeFile:
        return self._local.open_input_stream(path)

    def open_input_file(self, path: str) -> pyarrow.NativeFile:
        return self._local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        if not self._allowed(path):
            return pyarrow.PythonFile(io.BytesIO(), mode="w")  # written nowhere
        return pyarrow.PythonFile(_WholeFile(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pyarrow.NativeFile:
        if not self._allowed(path):
            return pyarrow.PythonFile(io.BytesIO(), mode="w")
        return pyarrow.PythonFile(open_nofollow(path, "ab"), mode="w")


def remove_partials(directory: Path) -> list[Path]:
    """Remove the temporary files that writes of this storage, killed midway, left under ``directory``
    (:func:`distmis.files.remove_temporaries`). Call only while holding the search's ``--out`` (its
    lock): no write of distmis's is in flight in it then, so every such file is an orphan.
    Returns the files removed.
    """
    return remove_temporaries(directory)


def tune_storage(root: str | os.PathLike[str]) -> pafs.FileSystem:
    """The filesystem a search's driver gives Ray Tune for its storage ``root`` (see the module
    docstring); below a directory link it skips (see :class:`WholeFileLocalHandler`)."""
    return pafs.PyFileSystem(WholeFileLocalHandler(root, skip_linked=True))


__all__ = ["WholeFileLocalHandler", "refuse_linked_directories", "remove_partials", "tune_storage"]
