"""How distmis writes files: all at once, never over an input, and only over its own outputs.

Researchers' raw scans are irreplaceable, so every output goes through this module:

* **All or nothing.** A file or directory is written under a temporary name beside its
  target (same filesystem) and renamed into place; on any error, Ctrl-C included, the
  temporary is removed. An existing directory is *exchanged* with the new one in a single
  ``renameat2(RENAME_EXCHANGE)`` where the kernel offers it, so there is no instant at which
  neither exists (a crash between "remove old" and "rename new" would leave no ``best/``).
* **Only over our own outputs.** Every output directory carries a small marker file
  (:data:`MARKER`) recording which command wrote it; single-file outputs carry the same
  signature inside the file (PNG/GIF text, NIfTI ``descrip``). ``--overwrite`` replaces a
  target only when that mark is there: a user's own directory is never deleted.
* **Never over an input.** :func:`check_output` refuses an output that is, contains, or
  lies inside one of the command's inputs (source data, prepared data, model, scans), and
  names the input it would destroy.
* **Shareable.** Files and directories get the modes the user's umask gives (a research
  group reads a prepared dataset on a shared filesystem); only secrets are made 0600 by
  their writers. ``mkdtemp``/``mkstemp`` alone would give 0700/0600.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from distmis.exceptions import DistmisError, OutputError
from distmis.links import (
    NOFOLLOW,
    ensure_directory,
    link_error,
    open_nofollow,
    read_regular_text,
    refuse_link,
    refuse_links_within,
)
from distmis.locks import LOCK_FILE, output_lock, sibling_lock

MARKER = ".distmis-output"
SIGNATURE = "distmis"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


# --------------------------------------------------------------------------- ownership
def marker_info(directory: Path) -> dict[str, Any] | None:
    """What the marker of ``directory`` says (``None``: not a distmis output directory)."""
    path = Path(directory) / MARKER
    try:  # a link is another directory's marker, and a FIFO would block: neither marks this one
        data = json.loads(read_regular_text(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and str(data.get("written_by", "")).startswith(SIGNATURE) else None


def write_marker(directory: Path, command: str, *, location: Path | None = None) -> None:
    """Mark ``directory`` as written by ``distmis <command>``; ``location``: where a directory whose
    state names its own files by absolute path was made (see :func:`check_location`)."""
    from distmis import __version__

    record = {
        "written_by": f"{SIGNATURE} {command}",
        "version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if location is not None:
        record["location"] = str(location)
    write_text_atomic(Path(directory) / MARKER, json.dumps(record) + "\n")


def check_location(directory: Path, *, what: str, resume_command: str) -> None:
    """Refuse to continue a directory that was copied or moved from where it was made.

    Ray Tune's state, the Optuna journal's path and the MLflow mapping name files by absolute
    path, so a resumed copy (``cp -a run run2``) appended to its original's journal and wrote
    checkpoints into the original's ``tune/``. A directory without a recorded location (made
    by an older distmis) cannot be checked and is accepted.

    ``resume_command`` names the original as ``<original>``; it is filled in.

    Raises:
        OutputError: naming both places and how to continue.
    """
    recorded = (marker_info(directory) or {}).get("location")
    if not isinstance(recorded, str) or not recorded:
        return
    resume_command = resume_command.replace("<original>", recorded)
    here = Path(directory).resolve()
    if Path(recorded) == here:
        return
    with contextlib.suppress(OSError):
        if Path(recorded).samefile(here):  # the same directory reached by another path
            return
    if Path(recorded).exists():
        raise OutputError(
            f"{directory}: a copy of the {what} in {recorded}; its state names that directory's files, so resuming "
            f"the copy would write into the original. Continue the original with: {resume_command}, or start a "
            "new one with another --out"
        )
    raise OutputError(
        f"{directory}: the {what} was made in {recorded} and has moved; its state names files there, so it can "
        f"only be resumed in that place: move it back and run {resume_command}"
    )


def file_signature(path: Path) -> str | None:
    """The distmis signature embedded in a single-file output, or ``None``.

    PNG ``Software`` text and GIF comments (written by matplotlib / Pillow), NIfTI ``descrip``
    (written by ``distmis predict``).
    """
    path = Path(path)
    name = path.name.lower()
    try:
        if name.endswith((".png", ".gif")):
            from PIL import Image

            with Image.open(path) as img:
                text = img.info.get("Software") or img.info.get("comment") or b""
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        elif name.endswith((".nii", ".nii.gz")):
            import nibabel as nib

            descrip = nib.load(str(path)).header["descrip"]
            text = bytes(descrip.item() if hasattr(descrip, "item") else descrip).decode("utf-8", "replace")
        else:
            return None
    except Exception:  # noqa: BLE001 - unreadable or not of that type: not ours
        return None
    return text if text.startswith(SIGNATURE) else None


def written_by_distmis(path: Path) -> bool:
    """Whether ``path`` (a directory or a single-file output) carries distmis' mark."""
    path = Path(path)
    if path.is_dir():
        return marker_info(path) is not None
    return file_signature(path) is not None


# --------------------------------------------------------------------------- the disk failing
#: errors of the machine, not of the input: a full disk or quota, a read-only or failing device
DISK_ERRNOS = {
    errno.ENOSPC: "ENOSPC, no space left on the device",
    errno.EDQUOT: "EDQUOT, disk quota exceeded",
    errno.EROFS: "EROFS, read-only filesystem",
    errno.EIO: "EIO, input/output error",
}
_DISK_MESSAGES = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT}
#: what to do about each: room does not help a read-only or failing disk
_REMEDIES = {
    errno.ENOSPC: "make room",
    errno.EDQUOT: "make room",
    errno.EROFS: "write the output to a writable filesystem",
    errno.EIO: "check the disk (dmesg), or write elsewhere",
}


def _remedy(code: int) -> str:
    return f"{_REMEDIES.get(code, 'make room')} and run the command again"


def _outside_temporaries(path: str | os.PathLike[str]) -> str:
    """A path inside one of distmis' temporary siblings (``.distmis-tmp-*``, gone once the error
    is shown), named by the directory that holds it and the file it was writing."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if is_temporary(part):
            return f"{Path(*parts[:i])} (writing {parts[-1]})" if i else str(path)
    return str(path)


def disk_failure(exc: BaseException) -> str | None:
    """One line for an error of the disk (full, over quota, read-only, failing), naming the path;
    ``None`` for any other error. TensorFlow reports a full disk as its own error with the path
    in the message, and is recognised too."""
    if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
        where = _outside_temporaries(exc.filename) if exc.filename else "a file"
        return f"{where}: {DISK_ERRNOS[exc.errno]}; {_remedy(exc.errno)} (--resume where it has one)"
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list):
        # copytree gathers its errors as (source, destination, why): name the first disk one
        for entry in exc.args[0]:
            if isinstance(entry, tuple) and len(entry) == 3 and (code := _disk_errno_in(str(entry[2]))):
                return (
                    f"{_outside_temporaries(str(entry[1]))}: {DISK_ERRNOS[code]}; {_remedy(code)} "
                    "(--resume where it has one)"
                )
    text = str(exc)
    if code := _disk_errno_in(text):
        return f"{text.strip().splitlines()[0][:300]} ({DISK_ERRNOS[code]}); {_remedy(code)}"
    return None


def _disk_errno_in(text: str) -> int | None:
    """The errno of a disk failure spelt in ``text`` (TensorFlow's, copytree's messages), else None."""
    return next((code for message, code in _DISK_MESSAGES.items() if message in text), None)


# --------------------------------------------------------------------------- inputs
def input_problem(path: Path) -> str | None:
    """Why an input file cannot be read, in words (``None``: it can): missing, a broken symbolic
    link (and to what), a link loop, a directory, unreadable."""
    path = Path(path)
    if not os.path.lexists(path):
        return "missing"
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python < 3.13 reports a loop so
            return "a symbolic link loop"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "a symbolic link loop"
            return f"a broken symbolic link (to {path.readlink()})"
    try:
        if not path.is_file():
            return "not a regular file" + (" (a directory)" if path.is_dir() else "")
    except OSError as exc:  # ELOOP on some kernels, EACCES on the path
        return exc.strerror or type(exc).__name__
    if not os.access(path, os.R_OK):
        return "not readable by you (permissions)"
    return None


# --------------------------------------------------------------------------- where outputs may go
def _real(path: str | os.PathLike[str]) -> Path:
    return Path(str(path)).expanduser().resolve()


def _name_limits(path: Path) -> tuple[int, int]:
    """NAME_MAX and PATH_MAX of the filesystem ``path`` would be on (its nearest existing ancestor)."""
    for probe in [path, *path.parents]:
        try:
            if probe.exists():
                return os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX")
        except (OSError, ValueError):  # a component too long to even look up
            continue
    return 255, 4096


def check_output(
    out: str | os.PathLike[str],
    *,
    option: str,
    inputs: Mapping[str, str | os.PathLike[str] | None] = (),  # type: ignore[assignment]
) -> Path:
    """Refuse an output path that would destroy or pollute an input, or that cannot exist.

    Args:
        out: the output path.
        option: how the user gave it (``--out``, ``OUT``), for the message.
        inputs: ``{description: path}`` of everything the command reads.

    Returns:
        The output path (as given, expanded).

    Raises:
        OutputError: ``out`` is, contains or lies inside an input, or its name is too long.
    """
    out_path = Path(str(out)).expanduser()
    name_max, path_max = _name_limits(out_path.absolute())
    for part in out_path.absolute().parts:
        if len(part.encode()) > name_max:
            raise OutputError(
                f"{option} {str(out)[:80]}...: a name of {len(part.encode())} bytes is longer than "
                f"this filesystem allows ({name_max})"
            )
    if len(str(out_path.absolute()).encode()) >= path_max:
        raise OutputError(
            f"{option}: the path is {len(str(out_path.absolute()).encode())} bytes long; this "
            f"filesystem allows {path_max}"
        )
    real_out = _real(out_path)
    for what, given in dict(inputs).items():
        if given is None:
            continue
        real_in = _real(given)
        if real_out == real_in:
            raise OutputError(f"{option} {out} is the {what} {given}; writing there would destroy it")
        if real_out in real_in.parents:
            raise OutputError(f"{option} {out} contains the {what} {given}; writing there would destroy it")
        if real_in in real_out.parents:
            raise OutputError(f"{option} {out} lies inside the {what} {given}; outputs never go into an input")
    return out_path


def check_replaceable(out: Path, *, option: str, overwrite: bool) -> None:
    """An existing ``out`` may only be replaced with ``overwrite`` and when distmis wrote it."""
    out = Path(out)
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise OutputError(f"{option} {out}: already exists; pass --overwrite to replace it, or choose another path")
    if out.is_symlink():  # even to distmis's own output: replacing it would replace the link, not its target
        raise link_error(out, what=f"output ({option})")
    if not written_by_distmis(out):
        kind = "directory" if out.is_dir() else "file"
        raise OutputError(
            f"{option} {out}: this {kind} was not written by distmis (no {MARKER} marker / signature); "
            "--overwrite only replaces distmis' own outputs: remove it yourself or choose another path"
        )


# --------------------------------------------------------------------------- atomic writes
def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_directory(new: Path, target: Path) -> None:
    """Put directory ``new`` at ``target``, replacing what is there, with no moment without one."""
    new, target = Path(new), Path(target)
    refuse_link(target)
    if not target.exists():
        new.replace(target)
        return
    if _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the old content
        return
    old = target.with_name(f".{target.name[:40]}.old-{os.getpid()}")
    target.replace(old)
    new.replace(target)
    shutil.rmtree(old, ignore_errors=True)


def make_parents(directory: Path) -> list[Path]:
    """``mkdir -p directory``; returns the directories this call created, outermost first.

    Each level is created with its own ``mkdir``, so of two processes creating the same path at
    once exactly one is told it created it (and only that one may remove it again).
    """
    missing: list[Path] = []
    probe = Path(directory)
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputError(f"{directory}: cannot create output directory ({probe} is not a directory)")
    created: list[Path] = []
    try:
        for level in reversed(missing):
            try:
                level.mkdir()
                created.append(level)
            except FileExistsError:
                if not level.is_dir():
                    raise
    except OSError as exc:
        remove_if_empty(created)
        raise OutputError(f"{directory}: cannot create output directory ({exc.strerror})") from None
    return created


def remove_if_empty(directories: list[Path]) -> None:
    """Undo :func:`make_parents` after a failure (innermost first; non-empty ones stay)."""
    for directory in reversed(directories):
        with contextlib.suppress(OSError):
            directory.rmdir()


#: how every temporary sibling distmis writes before renaming it into place begins: hidden, and
#: matched by no pattern of Ray Tune's or of distmis's own outputs
TEMPORARY_PREFIX = ".distmis-tmp-"


def is_temporary(name: str) -> bool:
    """Whether ``name`` (one path component) is one of distmis's temporary siblings."""
    return name.startswith(TEMPORARY_PREFIX)


def temporary_sibling(target: Path, *, directory: bool = False) -> Path:
    """A new, empty temporary file (or directory) beside ``target``, to be renamed over it when
    complete; its permissions are those the umask gives, as for any file distmis writes.

    Created with the modes a new file or directory asks for (0o666, 0o777), so the kernel applies
    the umask: ``tempfile``'s private 0o600 would need a chmod after it, and the umask read first,
    for every file Ray Tune copies into a search's ``tune/`` (all of them, every few seconds).
    """
    # a short temporary name: a target name near the filesystem limit must still fit
    parent = target.parent if str(target.parent) else Path()
    suffix = "" if directory else "".join(target.suffixes[-2:])[:16]
    for _ in range(100):
        tmp = parent / f"{TEMPORARY_PREFIX}{secrets.token_hex(6)}{suffix}"
        try:
            if directory:
                tmp.mkdir(0o777)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o666))
        except FileExistsError:
            continue  # a name already taken: draw another
        return tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name beside it", str(target))


@contextlib.contextmanager
def atomic_directory(
    out: Path, *, command: str, overwrite: bool = False, option: str = "OUT", inside_own_output: bool = False
) -> Iterator[Path]:
    """Yield a temporary sibling of ``out``; it becomes ``out`` (marked) only if the block succeeds.

    An existing ``out`` is replaced only with ``overwrite`` and only if distmis wrote it
    (checked before and again at the end, in case it appeared meanwhile).
    ``inside_own_output`` is for parts of an output distmis already owns (a run's
    ``checkpoint/`` and ``best/``), which may predate markers: they are replaced as they are.

    Raises:
        OutputError: ``out`` exists and may not be replaced.
    """
    out = Path(out)
    if not inside_own_output:
        check_replaceable(out, option=option, overwrite=overwrite)
    parents = make_parents(out.parent if str(out.parent) else Path())
    with contextlib.ExitStack() as held:
        try:
            if not inside_own_output:  # one writer at a time: a second command is refused, naming the first
                held.enter_context(sibling_lock(out, command=command, option=option))
                if (out / LOCK_FILE).is_file():  # readers of the old one (a search on a prepared dataset)
                    held.enter_context(
                        output_lock(out / LOCK_FILE, command=command, option=option, busy_hint=_READERS_HINT)
                    )
            tmp = temporary_sibling(out, directory=True)
        except BaseException:
            remove_if_empty(parents)
            raise
        try:
            yield tmp
            write_marker(tmp, command)
            if not inside_own_output:
                check_replaceable(out, option=option, overwrite=overwrite)
            replace_directory(tmp, out)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            held.close()  # the lock file goes before the parents it may sit in
            remove_if_empty(parents)
            _raise_naming(exc, out)
            raise


#: the job record inside a resumable work directory: the options its cases were made with
WORK_JOB = ".distmis-job.json"


def partial_sibling(out: Path) -> Path:
    """Where a resumable command keeps its unfinished output: a fixed, hidden name beside ``out``."""
    return out.parent / f".{out.name}.distmis-partial"


@contextlib.contextmanager
def resumable_directory(
    out: Path, *, command: str, overwrite: bool, resume: bool, job: dict[str, Any]
) -> Iterator[Path]:
    """:func:`atomic_directory` for long work that can be finished later: the work directory has a
    fixed name (:func:`partial_sibling`) and outlives an interrupted run (Ctrl-C, a kill), so that
    ``--resume`` goes on from what it holds. It is reused only with ``resume`` and when it was made
    with the same ``job`` (the options); otherwise a fresh one replaces it. A failure other than an
    interruption removes it, as :func:`atomic_directory` does.

    Raises:
        OutputError: ``out`` may not be replaced; the work directory is not distmis's; ``resume``
            with a work directory made with other options.
    """
    out = Path(out)
    check_replaceable(out, option="OUT", overwrite=overwrite)
    parents = make_parents(out.parent if str(out.parent) else Path())
    work = partial_sibling(out)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(sibling_lock(out, command=command, option="OUT"))
            if (out / LOCK_FILE).is_file():
                held.enter_context(output_lock(out / LOCK_FILE, command=command, option="OUT", busy_hint=_READERS_HINT))
            _open_work(work, resume=resume, job=job, command=command)
        except BaseException:
            remove_if_empty(parents)
            raise
        try:
            yield work
            (work / WORK_JOB).unlink()
            write_marker(work, command)
            check_replaceable(out, option="OUT", overwrite=overwrite)
            replace_directory(work, out)
        except KeyboardInterrupt:
            raise  # the work is kept for --resume
        except BaseException as exc:
            shutil.rmtree(work, ignore_errors=True)
            held.close()
            remove_if_empty(parents)
            _raise_naming(exc, out)
            raise


def _open_work(work: Path, *, resume: bool, job: dict[str, Any], command: str) -> None:
    refuse_link(work, what=f"the unfinished {command} output")
    if work.exists() and work.stat().st_uid != os.geteuid():
        raise OutputError(f"{work}: belongs to another user; distmis {command} works there only in its own")
    if work.exists():
        recorded = None
        try:  # never a link, nor a FIFO that would block the resume before its first line
            recorded = json.loads(read_regular_text(work / WORK_JOB, follow_links=False))
        except (OSError, ValueError):
            raise OutputError(
                f"{work}: exists but holds no {WORK_JOB} written by distmis {command}; remove it or choose another OUT"
            ) from None
        if resume and recorded == job:  # half-written files must not end up, hidden, in the output
            remove_temporaries(work)
            return
        if resume:
            changed = sorted(k for k in set(job) | set(recorded or {}) if (recorded or {}).get(k) != job.get(k))
            raise OutputError(
                f"--resume: the unfinished {command} at {work} was started with other options ({', '.join(changed)}); "
                "run it again with those options and --resume, or without --resume to start over"
            )
        shutil.rmtree(work)
    ensure_directory(work)
    with open_nofollow(work / WORK_JOB, "w") as fh:
        json.dump(job, fh)


def remove_temporaries(directory: Path) -> list[Path]:
    """Remove the temporary siblings (:func:`is_temporary`) that writes killed midway left under
    ``directory``, and return them. Only regular files are touched; symbolic links are neither
    followed nor removed. Call only while holding the output that ``directory`` belongs to: no write
    of distmis's is in flight in it then, so every such file is an orphan.
    """
    removed = []
    for root, _dirs, files in os.walk(directory):  # os.walk does not follow links to directories
        for name in files:
            path = Path(root) / name
            if is_temporary(name) and not path.is_symlink() and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


_READERS_HINT = (
    "it is being read by a running distmis tune, train or finalize (a shared lock names no one); run this "
    "again once they have ended, or write to another place"
)


@contextlib.contextmanager
def atomic_file(path: Path, *, own_directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix); renamed to ``path`` if the block succeeds.

    ``own_directory``: the file's directory is one distmis makes inside its own output (a search's
    ``plots/``), where a link is refused as at the file itself: one planted there while a long command
    ran would have the file written into the link's target.
    """
    path = Path(path)
    refuse_link(path)
    if own_directory:
        refuse_link(path.parent)
    parents = make_parents(path.parent if str(path.parent) else Path())
    if own_directory:
        refuse_link(path.parent)  # planted between the check and the mkdir
    tmp = temporary_sibling(path)
    try:
        yield tmp
        refuse_link(path)  # planted while the block ran: the link goes unreplaced, its target untouched
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        remove_if_empty(parents)
        _raise_naming(exc, path)
        raise


def _raise_naming(exc: BaseException, path: Path) -> None:
    """Re-raise an OS error that names no file as one naming ``path``, the output being written.

    A ``write()`` or ``close()`` on a full disk (nibabel's gzip stream, ``json.dump``) raises
    ENOSPC without a file name, and the one line shown to the user must say where it happened.
    """
    # only a plain OS error: one without an errno (shutil.Error, copytree's list of failures, is an
    # OSError too) keeps its own text, which disk_failure reads
    if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_secret(path: Path, text: str) -> None:
    """Write a secret (a token) readable by its owner only, atomically."""
    path = Path(path)
    refuse_link(path)
    make_parents(path.parent)
    tmp = temporary_sibling(path)
    try:
        tmp.chmod(0o600)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class OutputClaim:
    """``out`` claimed by one command for as long as it runs: created (marked) or checked, and locked.

    For an output written piece by piece (a search, a comparison, a training run). ``out`` must not
    exist, or be empty, or be a directory distmis marked for the same command. The lock
    (:mod:`distmis.locks`) is held from the claim to its end, so a second process writing here is
    refused at once; only a claim that created ``out`` and holds its lock removes it again, when
    :meth:`setting_up` fails with bad input: bad input leaves nothing behind, and a refused second
    process never touches the first one's directory.
    """

    def __init__(self, out: Path, *, command: str, option: str, new: bool = True) -> None:
        self.out, self.command, self.option, self.new = Path(out), command, option, new
        self.created: list[Path] = []
        self._lock = contextlib.ExitStack()

    def __enter__(self) -> OutputClaim:
        from distmis.locks import directory_lock

        out = self.out
        if self.new:
            self.created = make_parents(out) if not out.exists() else []
            if not self.created:
                self._check_existing()
        elif not out.is_dir():
            raise OutputError(f"{self.option} {out}: not a directory")
        self._lock.enter_context(directory_lock(out, command=self.command, option=self.option))
        try:
            refuse_links_within(out, what=f"{self.command} output")
        except BaseException as exc:
            self._lock.__exit__(type(exc), exc, exc.__traceback__)  # a lock file made for nothing goes too
            raise
        if self.new and marker_info(out) is None:
            write_marker(out, self.command, location=out.resolve())
        return self

    def _check_existing(self) -> None:
        out, option = self.out, self.option
        if not out.is_dir():
            raise OutputError(f"{option} {out}: exists and is not a directory")
        info = marker_info(out)
        if info is None and any(p.name != LOCK_FILE for p in out.iterdir()):
            raise OutputError(f"{option} {out}: a non-empty directory not written by distmis; choose another path")
        if info is not None and info.get("written_by") != f"{SIGNATURE} {self.command}":
            raise OutputError(
                f"{option} {out}: holds the output of {info.get('written_by')!r}, "
                f"not of distmis {self.command}; choose another path"
            )

    @contextlib.contextmanager
    def setting_up(self) -> Iterator[Path]:
        """The part of the command where bad input may still be found: on a :class:`DistmisError`
        a directory this claim created is removed again."""
        try:
            yield self.out
        except DistmisError:
            if self.created:
                shutil.rmtree(self.out, ignore_errors=True)
                remove_if_empty(self.created[:-1])
            raise

    def __exit__(self, *exc: Any) -> None:
        # the lock sees the error too: a lock file made for a command that failed is removed again
        self._lock.__exit__(*exc)


@contextlib.contextmanager
def owned_output_directory(out: Path, *, command: str, option: str) -> Iterator[Path]:
    """Claim ``out`` (:class:`OutputClaim`) for the block; a new one is removed again on bad input."""
    with OutputClaim(out, command=command, option=option) as claim, claim.setting_up():
        yield out


__all__ = [
    "MARKER",
    "SIGNATURE",
    "TEMPORARY_PREFIX",
    "OutputClaim",
    "atomic_directory",
    "atomic_file",
    "check_location",
    "check_output",
    "check_replaceable",
    "disk_failure",
    "ensure_directory",
    "file_signature",
    "input_problem",
    "is_temporary",
    "make_parents",
    "marker_info",
    "open_nofollow",
    "owned_output_directory",
    "refuse_link",
    "remove_if_empty",
    "replace_directory",
    "temporary_sibling",
    "write_json_atomic",
    "write_marker",
    "write_secret",
    "write_text_atomic",
    "written_by_distmis",
]
