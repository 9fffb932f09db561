"""What ``distmis tune --resume`` may continue: only the search it was given, with the same settings.

A resumed search reruns Tune's saved experiment (its sampler, scheduler, budget and concurrency
are restored from ``tune/``) with trials built from the configuration given now. A different file
would mix two searches in one ``results.csv`` (it happened: ``best.yaml`` then claimed 2 epochs for
a 1-epoch trial). So the given file is compared with the search's ``search.yaml``, and only what
a resume really applies may differ:

* ``tracking.final_flush_seconds``: how long the end waits for MLflow;
* ``tracking.uri``: the credentials of the same store (a resume reattaches to the runs it made).

Anything else is refused with the differing keys named. A comparison's mode directory, a
comparison and a finalize are refused too, naming the command that continues them.

Ray Tune's own state in ``tune/`` is checked too (:func:`check_tune_state`): Tune, given a state
file it cannot read, logs "Failed to restore the run state" and starts the experiment over.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from distmis.config import ExperimentConfig
from distmis.exceptions import TuningError
from distmis.files import MARKER, marker_info
from distmis.links import link_error
from distmis.schema import RunFile

M = TypeVar("M", bound=BaseModel)

#: what a resume may change, and why it is safe
MAY_CHANGE = ("tracking.final_flush_seconds",)
COMPARE_PLAN = "compare.json"


def check_resume_target(out: Path, space_file: Path | None) -> None:
    """Refuse a directory ``distmis tune --resume`` does not own, naming the command that does."""
    space = space_file or "<file>"
    if (out / COMPARE_PLAN).is_file():
        raise TuningError(
            f"{out}: a comparison, not a search; continue it with: distmis compare {space} --out {out} --resume"
        )
    if (out.parent / COMPARE_PLAN).is_file():
        raise TuningError(
            f"{out}: the {out.name} mode of the comparison {out.parent}; continue the comparison with: "
            f"distmis compare <file> --out {out.parent} --resume"
        )
    info = marker_info(out) if out.is_dir() else None
    if info is None and (out / MARKER).is_symlink():
        raise link_error(out / MARKER, what="output marker")
    if info is None and os.path.lexists(out / MARKER):
        raise TuningError(
            f"{out / MARKER}: not the marker distmis writes (a link, a FIFO or a damaged file), so who wrote {out} "
            "is unknown; nothing is resumed there"
        )
    written_by = str((info or {}).get("written_by", ""))
    if written_by.startswith("distmis finalize"):
        raise TuningError(
            f"{out}: a finalize, not a search; continue it with: distmis finalize <search> --out {out} --resume"
        )
    if info is not None and written_by != "distmis tune":
        raise TuningError(f"{out}: written by {written_by!r}, not by distmis tune; nothing to resume here")


#: Ray Tune's state files in ``tune/`` (``<kind>-<session>``): a resume loads the newest of each
#: kind by name. ``experiment_state`` is JSON; the others are pickles, whatever their suffix.
TUNER_STATE = "tuner.pkl"
TUNE_STATE_FILES = (
    "experiment_state-*.json",
    TUNER_STATE,
    "basic-variant-state-*.json",
    "search_gen_state-*.json",
    "searcher-state-*.pkl",
    "callback-states-*.pkl",
)


def check_tune_state(tune_dir: Path, *, command: str) -> None:
    """Refuse a resume from Ray Tune state that Tune could not load, naming the file.

    Tune would start a new, empty experiment in its place (after a log line nobody reads) and
    spend the GPU-hours of the trials already done again. Each file is read, not executed: the
    JSON parsed, a pickle's opcodes walked to its end (a truncated one has no end).

    Raises:
        TuningError: a state file is empty, truncated or not what its kind is.
    """
    import pickletools

    for pattern in TUNE_STATE_FILES:
        found = sorted(tune_dir.glob(pattern))
        if not found:
            continue
        newest = found[-1]
        try:
            data = newest.read_bytes()
            if not data:
                raise ValueError("it is empty")
            if pattern.startswith("experiment_state"):
                json.loads(data)
            else:
                try:
                    for _ in pickletools.genops(data):
                        pass
                except ValueError:
                    raise ValueError("it is truncated") from None
        except json.JSONDecodeError as exc:
            reason = f"it is not whole JSON: {exc.msg} at byte {exc.pos}"
        except (OSError, ValueError) as exc:
            reason = str(exc.strerror) if isinstance(exc, OSError) else str(exc)
        else:
            continue
        raise TuningError(
            f"{newest}: Ray Tune's saved state cannot be read ({reason}; a kill or a full disk while it was "
            f"written), so --resume would start {command} over; its finished trials stay in "
            f"{tune_dir.parent}; start again with another --out"
        )


def check_search_state(out: Path, *, journal: str, tune_dir: str, command: str) -> None:
    """Refuse, before Ray or MLflow start, a resume whose own state is missing or damaged.

    Without this, a deleted ``tune/`` failed after Ray and MLflow had started, a deleted journal
    raised a KeyError from the searcher, and a journal with a damaged line in its middle trained for
    seconds and then printed Optuna's JSONDecodeError tracebacks. A journal whose *last* line was
    cut short (a kill during Optuna's append) is what Optuna itself skips when reading; it is
    dropped here, and kept beside the journal, because Optuna's next append would glue a new
    record to it and damage the journal for good.

    Raises:
        TuningError: naming the file and what to do.
    """
    tune_state = out / tune_dir
    journal_path = out / journal
    again = f"its finished trials stay in {out}; start {command} again with another --out"
    if journal_path.exists() and not tune_state.is_dir():
        raise TuningError(f"{tune_state}: missing (Ray Tune's state of the search), so it cannot be resumed; {again}")
    uses_journal = any(tune_state.glob("searcher-state-*.pkl"))
    if uses_journal and not journal_path.is_file():
        raise TuningError(
            f"{journal_path}: missing (the Optuna study: every trial sampled so far), so the search cannot be resumed; "
            f"{again}"
        )
    if journal_path.is_file():
        _journal_records(journal_path, again)
    # a link in tune/'s place is refused, naming it, when the search's directory is claimed
    if tune_state.is_dir() and not tune_state.is_symlink() and not (tune_state / TUNER_STATE).is_file():
        raise TuningError(
            f"{tune_state / TUNER_STATE}: missing (Ray Tune writes it when the search starts, and cannot restore the "
            f"search without it); {again}"
        )


def _journal_records(path: Path, again: str) -> tuple[list[bytes], bytes]:
    """An Optuna journal's whole records and the torn bytes after them (``b""`` when none).

    Raises:
        TuningError: a record before the last is damaged (Optuna cannot read past it).
    """
    from distmis.files import refuse_link

    refuse_link(path, what="Optuna journal")
    lines = path.read_bytes().split(b"\n")
    whole, torn = lines[:-1], lines[-1]  # the text after the last newline is a record cut short, if any
    for number, line in enumerate(whole, start=1):
        try:
            json.loads(line)
        except ValueError:
            if number < len(whole):
                raise TuningError(
                    f"{path}: record {number} of {len(whole)} is not whole JSON, so Optuna cannot read the study; "
                    f"{again}"
                ) from None
            torn, whole = line + b"\n" + torn, whole[:-1]
    return whole, torn


def mend_journal(path: Path) -> None:
    """Drop a torn last record of an Optuna journal, keeping its bytes beside it (``<journal>.torn``).

    Call only while holding the search's lock: a running search's append looks torn while it is
    being written.
    """
    from distmis.files import atomic_file

    if not path.is_file():
        return
    whole, torn = _journal_records(path, "start it again with another --out")
    if not torn.strip():
        return
    kept = path.with_name(path.name + ".torn")
    with atomic_file(kept) as tmp:
        tmp.write_bytes(torn)
    with atomic_file(path) as tmp:
        tmp.write_bytes(b"".join(line + b"\n" for line in whole))
    print(
        f"distmis: {path}: its last record was cut short (a kill while Optuna wrote it); dropped it, as Optuna does "
        f"when it reads the journal, keeping {len(whole)} whole record(s) (the torn bytes are in {kept.name})",
        flush=True,
    )


def check_resume_config(out: Path, config: ExperimentConfig, space_file: Path | None, tracking_uri: str | None) -> None:
    """Refuse a resume whose configuration differs from the search's recorded ``search.yaml``.

    Raises:
        TuningError: naming the differing keys and what may change.
    """
    recorded_file = out / RunFile.SEARCH_FILE
    if space_file is None or not recorded_file.is_file():
        return  # a search started from code records no file: nothing to compare with
    from distmis.config import load_config

    try:
        recorded = load_config(recorded_file, require_space=True)
    except Exception as exc:  # noqa: BLE001 - a damaged record is itself a reason to stop
        raise TuningError(f"{recorded_file}: cannot read the search being resumed ({exc})") from None
    keys = [k for k in differences(recorded.to_yaml_dict(), config.to_yaml_dict()) if k not in MAY_CHANGE]
    keys += _store_difference(out, config, tracking_uri)
    if keys:
        shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
        raise TuningError(
            f"{space_file}: differs from the search being resumed ({recorded_file}) in {shown}; a resume continues "
            f"the same search (it may change only {', '.join(MAY_CHANGE)} and the credentials of its MLflow "
            "store): resume with the file it started from, or start a new search with another --out"
        )


def _store_difference(out: Path, config: ExperimentConfig, cli: str | None) -> list[str]:
    """``tracking.uri`` when the resume names another MLflow store than the one the search's runs are in."""
    from distmis.tracking import read_tracking_state, redact_uri

    state = read_tracking_state(out)
    store = state.tracking_uri if state else None
    given = cli or config.tracking.uri
    if store and given and redact_uri(given) != store:
        return [f"tracking.uri (or --tracking-uri): its runs are in {store}"]
    return []


def differences(before: Any, after: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configuration documents."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "uri" and prefix == "tracking":
                continue  # compared as a store (_store_difference): credentials may be given again
            keys += differences(before.get(key), after.get(key), path)
        return keys
    return [] if before == after else [prefix or "<root>"]


__all__ = [
    "TUNE_STATE_FILES",
    "check_tune_state",
    "MAY_CHANGE",
    "check_resume_config",
    "check_resume_target",
    "check_search_state",
    "mend_journal",
    "differences",
    "read_recorded",
]


def read_recorded(path: Path, *, what: str, model: type[M]) -> M:
    """A plan or record a command wrote for its ``--resume`` (``finalize.json``, ``compare.json``),
    read through its ``model`` as damaged input: a kill or a full disk while it was written leaves it
    torn, and a hand edit may leave it whole but wrong.

    Raises:
        TuningError: naming the file, the field or what is wrong, and what to do.
    """
    from distmis.documents import load_json_document

    try:
        return load_json_document(model, path, error=TuningError, what=f"the {what}'s record")
    except TuningError as exc:
        raise TuningError(
            f"{exc}; the {what} cannot be resumed from it (a kill or a full disk while it was written?): "
            "start it again with another --out"
        ) from None


def check_resumed_choices(
    recorded_file: Path, given: Mapping[str, Any], recorded: Mapping[str, Any], spell: Callable[[str, Any], str]
) -> None:
    """Refuse command-line choices given with ``--resume`` that differ from the recorded ones.

    ``finalize`` and ``compare`` resume the plan they recorded (``finalize.json``,
    ``compare.json``): what already ran was run for it, so a different ``--folds`` or ``--modes``
    can neither be applied nor ignored in silence. ``given`` holds ``None`` for what was not given;
    ``spell(key, value)`` writes a choice as the user types it (``--folds 5``).

    Raises:
        TuningError: naming each differing choice, as asked and as recorded.
    """
    differing = [k for k, v in given.items() if v is not None and v != recorded[k]]
    if not differing:
        return
    asked = ", ".join(spell(k, given[k]) for k in differing)
    was = ", ".join(spell(k, recorded[k]) for k in differing)
    raise TuningError(
        f"{recorded_file.parent}: --resume continues what {recorded_file.name} records ({was}), but this "
        f"command asks for {asked}; drop {'them' if len(differing) > 1 else 'it'} to resume, or run "
        "without --resume into another --out"
    )
