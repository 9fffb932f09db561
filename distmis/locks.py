"""One owner per output directory: an exclusive OS lock for as long as a command writes there.

Two ``distmis tune`` on the same ``--out``, started together, would both run and share one
MLflow parent run. Every command that writes an output directory (``tune``, ``compare``,
``finalize``, ``prepare``, ``evaluate``) holds an exclusive ``fcntl.flock`` on a lock file for as
long as it runs; a second one gets one error naming the holder (its PID, host and start time).

Why a kernel lock and not a file that says "busy": the kernel releases a ``flock`` when its
process dies, however it dies (SIGKILL, OOM killer, a node reboot), so a lock can never be left
behind to block ``--resume``; the file itself stays and only records who held it last.

* Node-local filesystems: the lock is exact.
* Shared filesystems (NFS v4, Lustre, GPFS, BeeGFS): Linux maps ``flock`` to the filesystem's
  byte-range locks, so a process on another node sees the lock too. If the holder's node dies,
  the file server drops its locks when the node's lease expires (NFS: 90 s by default), after
  which ``--resume`` proceeds; the error says so. A filesystem without locking (an NFS v3 mount
  with ``nolock``) answers ENOLCK: distmis then goes on without the lock and says so once,
  rather than refusing to run.

Directories written piece by piece (a search, a comparison, a finalize) hold ``.distmis-lock``
inside; outputs that appear all at once (``prepare``, ``evaluate``) lock a hidden sibling
``.<name>.distmis-lock`` beside the output, removed again at the end. A prepared dataset also
carries ``.distmis-lock`` inside: the commands training on it hold it shared
(:func:`reader_lock`), and replacing it (``prepare --overwrite``) takes it exclusively.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from distmis.exceptions import OutputError
from distmis.links import open_nofollow

LOCK_FILE = ".distmis-lock"


def _holder(fh: IO[Any]) -> dict[str, Any]:
    fh.seek(0)
    try:
        data = json.loads(fh.read() or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process"
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"distmis {holder.get('command', '?')} (PID {holder.get('pid', '?')} on {holder.get('host', '?')}, started {when})"


def _flock(fh: IO[Any], mode: int) -> bool | None:
    """``flock(mode)`` without waiting: True held, False held by another process, None the
    filesystem cannot lock (ENOLCK, an NFS v3 ``nolock`` mount)."""
    try:
        fcntl.flock(fh.fileno(), mode | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
            return None
        raise
    return True


@contextlib.contextmanager
def output_lock(
    path: Path, *, command: str, option: str = "--out", remove: bool = False, busy_hint: str | None = None
) -> Iterator[Path]:
    """Hold an exclusive lock on ``path`` (a lock file) for the block.

    Args:
        path: the lock file (created if missing; its directory must exist).
        command: who holds it, for the error a second process gets.
        option: how the user named the output, for the message.
        remove: delete the lock file at the end (a sibling lock of an atomic output).
        busy_hint: what to do when it is held (default: wait, or choose another ``option``).

    Raises:
        OutputError: another process holds the lock (naming it).
    """
    path = Path(path)
    existed = os.path.lexists(path)
    held = failed = False
    try:
        # held open for the block: the lock lives with it; never through a link (another's file)
        fh = open_nofollow(path, "a+", what="lock file", encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"{option} {path.parent}: cannot create its lock file {path.name} ({exc.strerror})") from None
    try:
        got = _flock(fh, fcntl.LOCK_EX)
        if got is False:
            hint = busy_hint or f"wait for it to end, or choose another {option}"
            raise OutputError(
                f"{option} {path.parent}: in use by {_describe(_holder(fh))}; {hint} (a holder on another "
                "node that died releases it when the file server's lease expires, about 90 s on NFS)"
            )
        if got is None:
            print(
                f"distmis: warning: {path.parent}: this filesystem cannot lock files (ENOLCK); "
                "nothing stops a second distmis from writing here at the same time",
                file=sys.stderr,
                flush=True,
            )
        held = True
        _record(fh, command)
        try:
            yield path
        except BaseException:
            failed = True
            raise
    finally:
        if held:
            # The holder's record means something only while it is held; emptied on release, a
            # command that refuses its input (a --resume that does not match, say) leaves the
            # directory byte-identical, and one that created the file for nothing removes it.
            if remove or (failed and not existed):
                with contextlib.suppress(OSError):
                    path.unlink()
            else:
                with contextlib.suppress(OSError):
                    fh.seek(0)
                    fh.truncate()
        fh.close()  # releases the lock


def _record(fh: IO[Any], command: str) -> None:
    """Who holds the lock now (read by the next process that finds it held)."""
    with contextlib.suppress(OSError):  # a full disk must not stop the command for its lock note
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps({"command": command, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
        )
        fh.flush()


def directory_lock(out: Path, *, command: str, option: str = "--out") -> contextlib.AbstractContextManager[Path]:
    """The lock of a directory written piece by piece (``out/.distmis-lock``); ``out`` must exist."""
    return output_lock(Path(out) / LOCK_FILE, command=command, option=option)


def source_lock(directory: Path, *, command: str, option: str) -> contextlib.AbstractContextManager[Path | None]:
    """Hold the lock of a directory another command wrote (a search that ``finalize`` reads).

    A search still written by ``distmis tune`` (or resumed while it is read) would hand the reader
    half its trials; holding the search's own lock makes either side refuse, naming the other.
    A directory without a lock file (not written by distmis) or one that cannot be written (a
    read-only archive of a finished search, which nothing can be writing) is read unlocked.
    """
    path = Path(directory) / LOCK_FILE
    if not path.is_file() or not os.access(path, os.W_OK):
        return contextlib.nullcontext(None)
    return output_lock(path, command=command, option=option, busy_hint="run it again once that has ended")


@contextlib.contextmanager
def reader_lock(directory: Path, *, option: str) -> Iterator[None]:
    """Hold a shared lock on a prepared dataset for as long as a command trains on it.

    ``prepare --overwrite`` replaced the shards of a dataset under a running search (the trials
    would then read a mix of two preparations). Readers (``tune``, ``train``, ``finalize``) hold
    ``LOCK_SH`` on the dataset's ``.distmis-lock`` and any number of them may read at once; the
    command that replaces the directory takes ``LOCK_EX`` on the same file (see
    :func:`distmis.files.atomic_directory`), so either side is refused while the other runs. A
    dataset without the file (prepared by an older distmis, or not by distmis) is read unlocked;
    the file is only opened for reading, so a read-only dataset locks too.

    Raises:
        OutputError: the directory is being replaced now, naming the command doing it.
    """
    path = Path(directory) / LOCK_FILE
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - held open for the block: the lock lives with it
    except OSError:
        yield
        return
    try:
        if _flock(fh, fcntl.LOCK_SH) is False:  # None: a filesystem without locks, read unlocked
            raise OutputError(
                f"{option} {directory}: being rewritten by {_describe(_holder(fh))}; run this again once that has ended"
            )
        yield
    finally:
        fh.close()  # releases the lock


def sibling_lock(out: Path, *, command: str, option: str = "OUT") -> contextlib.AbstractContextManager[Path]:
    """The lock of an output that appears all at once: a hidden file beside it, removed at the end."""
    out = Path(out)
    return output_lock(out.parent / f".{out.name[:200]}{LOCK_FILE}", command=command, option=option, remove=True)


__all__ = ["LOCK_FILE", "directory_lock", "output_lock", "reader_lock", "sibling_lock", "source_lock"]
