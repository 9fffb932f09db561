"""What a finalize will do, checked before anything runs: which configurations, which folds.

The candidates are the ``top`` best configurations of a finished search (by its own metric and
mode, each configuration once). The folds are :func:`distmis.data.fold_groups` of the search's
training and validation cases; its test split is never touched. Everything a fold would fail on
hours later is refused now, with one error naming the option or the file: more candidates than
the search has, more folds than cases, a fold too small for one training batch, a fold whose
validation cases lack a class (its cross-validated Dice would be undefined), a directory without
results.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distmis.config import ExperimentConfig, load_config
from distmis.data import (
    SPLITS_FILE,
    CaseSplits,
    check_same_splits,
    cv_cases,
    fold_groups,
    load_manifest,
    read_search_splits,
)
from distmis.exceptions import ConfigError, DataError, TuningError
from distmis.files import check_location, marker_info
from distmis.finalize._records import Candidate, FinalizeRecord, read_selection
from distmis.links import refuse_link
from distmis.schema import RunFile
from distmis.search_summary import SearchSummaryFile, read_search_summary
from distmis.tracking import TrackingState, read_tracking_state
from distmis.tuning import check_resumed_choices, check_tune_state, read_recorded

PLAN_FILE = "finalize.json"
#: what a new finalize does unless told otherwise (nnU-Net's 5 folds; the two best configurations)
DEFAULTS: dict[str, Any] = {"top": 2, "folds": 5, "seed": 0, "tta": True, "pairs": True, "postprocess": True}
#: how each choice is spelt on the command line, for errors
_OPTIONS = {"top": "--top", "folds": "--folds", "seed": "--seed", "tta": "--no-tta", "pairs": "--no-pairs",
            "postprocess": "--no-postprocess"}  # fmt: skip


@dataclass(frozen=True)
class FinalizeOptions:
    """What a user asks of ``distmis finalize``: built once by the command line (or a caller) and
    handed whole to :func:`plan_finalize`.

    A choice left as ``None`` takes the search file's ``finalize`` section, else :data:`DEFAULTS`
    (a new finalize), or the recorded value (``resume``).
    """

    run: Path  # the finished search directory
    top: int | None = None
    folds: int | None = None
    seed: int | None = None
    out: Path | None = None  # default RUN/finalize
    final: Path | None = None  # default RUN/final
    resume: bool = False
    overwrite: bool = False
    tta: bool | None = None
    pairs: bool | None = None
    postprocess: bool | None = None

    def choices(self) -> dict[str, Any]:
        """The choices a resumed finalize must keep, as given (``None``: not given)."""
        return {k: getattr(self, k) for k in DEFAULTS}


@dataclass
class FinalizePlan:
    run: Path  # the search directory
    out: Path  # the finalize's own directory (trials, out-of-fold predictions, reports)
    final: Path  # the model it writes
    config: ExperimentConfig  # the search's configuration, reading the search's prepared data
    prepared: Path
    candidates: list[Candidate]
    folds: int
    seed: int
    groups: list[list[str]]  # the validation cases of each fold
    tta: bool = True
    pairs: bool = True
    postprocess: bool = True
    resume: bool = False
    search_tracking: TrackingState = field(default_factory=TrackingState)
    splits: CaseSplits | None = None  # the data's splits as this finalize saw them (checked, recorded)

    def as_json(self) -> dict[str, Any]:
        """``finalize.json``, what a resumed finalize reads back (:class:`FinalizeRecord`)."""
        return FinalizeRecord(
            run=str(self.run),
            splits=self.splits,
            candidates=self.candidates,
            folds=self.folds,
            seed=self.seed,
            groups=self.groups,
            tta=self.tta,
            pairs=self.pairs,
            postprocess=self.postprocess,
        ).model_dump()


def _spell(key: str, value: Any) -> str:
    """A finalize choice as typed: ``--folds 3``; a switch by whether it was on."""
    if isinstance(value, bool):
        return _OPTIONS[key] if not value else f"without {_OPTIONS[key]}"
    return f"{_OPTIONS[key]} {value}"


def plan_finalize(options: FinalizeOptions) -> FinalizePlan:
    """Read the search in ``options.run`` and plan its finalize (on ``--resume``, the recorded plan).

    A choice left as ``None`` takes the search file's ``finalize`` section, else :data:`DEFAULTS` (a
    new finalize), or the recorded value (``resume``); one given on ``resume`` must equal the
    recorded one, because the folds already trained were trained for it: a resumed finalize never
    silently does something else.

    Raises:
        TuningError: not a finished search, K or F out of range, a finalize already there, a
            choice given on ``resume`` that differs from the recorded finalize.
        ConfigError / DataError: the search's files or data, naming them.
    """
    given, resume, overwrite = options.choices(), options.resume, options.overwrite
    run = Path(options.run).resolve()
    out_dir = Path(options.out).resolve() if options.out else run / "finalize"
    final_dir = Path(options.final).resolve() if options.final else run / "final"
    if not options.out:  # a place inside the search that distmis names: a link there is not the user's choice
        refuse_link(out_dir, what="finalize directory")
    if resume:
        check_location(
            out_dir, what="finalize", resume_command="distmis finalize <original search> --out <original> --resume"
        )
    summary, config, prepared = _read_search(run)
    splits = _checked_splits(run, prepared)
    recorded = out_dir / PLAN_FILE
    if recorded.is_file() and not resume:
        raise TuningError(f"{out_dir}: a finalize already exists here; pass --resume to continue it, or choose --out")
    if resume and not recorded.is_file():
        raise TuningError(f"{out_dir}: no finalize to resume here (no {PLAN_FILE}); run without --resume")
    if resume:
        record = read_recorded(recorded, what="finalize", model=FinalizeRecord)
        if record.splits is not None:  # what the folds already trained were split from
            check_same_splits(record.splits, splits, recorded_in=str(recorded), data=prepared)
        chosen = {**{k: getattr(record, k) for k in DEFAULTS if k != "top"}, "top": len(record.candidates)}
        check_resumed_choices(recorded, given, chosen, _spell)
        check_tune_state(out_dir / RunFile.TUNE_DIR, command="the finalize")
    else:
        chosen = _new_choices(given, config)
    top, folds, seed = int(chosen["top"]), int(chosen["folds"]), int(chosen["seed"])
    tta, pairs, postprocess = bool(chosen["tta"]), bool(chosen["pairs"]), bool(chosen["postprocess"])
    planned = _planned_keys(given, config) if not resume else set()
    with _named_in_search_file(planned, run / RunFile.SEARCH_FILE):
        candidates = _candidates(summary, config, top)
        manifest = load_manifest(prepared)
        groups = fold_groups(cv_cases(manifest), folds, seed)
        _check_fold_sizes(config, groups, candidates)
    plan = FinalizePlan(
        run=run,
        out=out_dir,
        final=final_dir,
        config=config,
        prepared=prepared,
        candidates=candidates,
        folds=folds,
        seed=seed,
        groups=groups,
        tta=tta,
        pairs=pairs,
        postprocess=postprocess,
        resume=resume,
        search_tracking=_search_tracking(run),
        splits=splits,
    )
    with _named_in_search_file(planned, run / RunFile.SEARCH_FILE):
        check_fold_classes(plan)
    check_final(final_dir, out_dir, resume=resume, overwrite=overwrite)
    return plan


def check_final(final: Path, out: Path, *, resume: bool, overwrite: bool) -> None:
    """Before any fold trains: the model's place can be written, is not the finalize's own directory,
    and replaces an earlier model only with ``overwrite`` (or when this finalize wrote it, on
    ``resume``).

    Raises:
        TuningError: naming ``final`` and what to do.
    """
    from distmis.files import check_replaceable, temporary_sibling

    if final == out or final in out.parents or out in final.parents:
        raise TuningError(
            f"--out {out}: the finalize's own directory cannot hold or be its model {final}; choose another --out"
        )
    parent = final.parent
    try:  # tried, not asked (os.access): root, read-only mounts and ACLs answer differently
        temporary_sibling(final, directory=True).rmdir()
    except OSError as exc:
        raise TuningError(
            f"{parent}: not writable ({exc.strerror}), so the model could not be written to {final} after the folds "
            "have trained; make it writable, or finalize a copy of the search"
        ) from None
    if not (final.exists() or final.is_symlink()):
        return
    selection = read_selection(final)
    ours = resume and selection is not None and selection.finalize == str(out)
    if not (overwrite or ours):
        raise TuningError(
            f"{final}: already holds the model of an earlier finalize (its report describes it); pass --overwrite "
            "to replace it, or finalize into another search copy"
        )
    check_replaceable(final, option="the model directory", overwrite=True)


def _checked_splits(run: Path, prepared: Path) -> CaseSplits:
    """The data's splits, checked against those the search recorded: the folds must come from the
    search's own train+val and its test cases stay untouched.

    Without ``splits.json`` (deleted: every search of this version writes one) the trials' models
    still record the splits they trained on, and those are checked instead; the finalize's plan
    records what it used either way.
    """
    from distmis.console import notify

    now = load_manifest(prepared).info.case_splits
    recorded, where = read_search_splits(run), f"the search {run} ({SPLITS_FILE})"
    if recorded is None:
        recorded, where = _splits_of_trial_models(run)
        notify(
            f"distmis: warning: {run}: no {SPLITS_FILE}; "
            + (
                f"the data's splits are checked against {where} instead"
                if recorded is not None
                else "no trial model records its splits either, so they cannot be checked: the test cases are "
                f"those {prepared} lists now (recorded in the finalize's {PLAN_FILE})"
            )
        )
    if recorded is not None:
        check_same_splits(recorded, now, recorded_in=where, data=prepared)
    return now


def _splits_of_trial_models(run: Path) -> tuple[CaseSplits | None, str]:
    """The splits a trial's model trained on (its ``best/preprocessing.json``), the first that has them
    (a record that cannot be read is passed over: the next trial's may)."""
    from distmis.data import ModelPreprocessing
    from distmis.documents import load_json_document

    for record in sorted((run / RunFile.TRIALS_DIR).glob(f"*/{RunFile.BEST_MODEL_DIR}/{RunFile.PREPROCESSING}")):
        if record.is_symlink() or not record.is_file():
            continue
        try:
            splits = load_json_document(ModelPreprocessing, record, error=TuningError, what="a model's record").splits
        except TuningError:
            continue
        if splits is not None:
            return splits, f"the trial model {record.parent}"
    return None, ""


def _new_choices(given: dict[str, Any], config: ExperimentConfig) -> dict[str, Any]:
    """A new finalize's choices: the command line's, else the search file's ``finalize`` section
    (where ``distmis init --finalize`` planned them for the budget), else :data:`DEFAULTS`."""
    planned = config.finalize.model_dump()
    return {k: v if v is not None else planned[k] if planned[k] is not None else DEFAULTS[k] for k, v in given.items()}


def _planned_keys(given: dict[str, Any], config: ExperimentConfig) -> set[str]:
    """The choices a new finalize takes from the search file's ``finalize`` section."""
    return {k for k, v in config.finalize.model_dump().items() if v is not None and given.get(k) is None}


@contextmanager
def _named_in_search_file(planned: set[str], search_file: Path) -> Iterator[None]:
    """An error about ``--top N`` or ``--folds N`` that the user never typed names the search file's
    key it came from instead, so that they know which line to change."""
    try:
        yield
    except (TuningError, DataError) as exc:
        text = str(exc)
        for key in planned & {"top", "folds", "seed"}:
            option = _OPTIONS[key]
            if text.startswith(f"{option} "):
                number, _, rest = text.removeprefix(f"{option} ").partition(":")
                raise type(exc)(f"{search_file}: finalize.{key} {number} (or give {option}):{rest}") from None
        raise


def _read_search(run: Path) -> tuple[SearchSummaryFile, ExperimentConfig, Path]:
    """The search's summary, configuration (on its prepared data) and prepared directory."""
    if not run.is_dir():
        raise TuningError(f"{run}: no such search directory")
    info = marker_info(run)
    if info is not None and info.get("written_by") != "distmis tune":
        raise TuningError(f"{run}: written by {info.get('written_by')!r}, not a search (distmis tune's --out)")
    missing = [name for name in (RunFile.RESULTS, RunFile.SUMMARY, RunFile.SEARCH_FILE) if not (run / name).is_file()]
    if missing:
        raise TuningError(
            f"{run}: a run directory without results (no {', '.join(missing)}); finalize takes a finished search: "
            f"finish it first (distmis tune <file> --out {run} --resume)"
        )
    summary = read_search_summary(run, error=TuningError)
    try:
        config = load_config(run / RunFile.SEARCH_FILE, require_space=True)
    except ConfigError as exc:
        raise TuningError(f"{run / RunFile.SEARCH_FILE}: the search's configuration is not readable: {exc}") from None
    prepared = Path(summary.prepared)
    if not (prepared / RunFile.PREPARED_INFO).is_file():
        raise TuningError(f"{run / RunFile.SUMMARY}: its prepared data {prepared} is gone; prepare it again")
    data = config.to_yaml_dict()
    data["data"]["source"] = str(prepared)  # the search file's relative paths meant its own directory
    return summary, ExperimentConfig.model_validate(data), prepared


def _candidates(summary: SearchSummaryFile, config: ExperimentConfig, top: int) -> list[Candidate]:
    metric, mode = config.search.metric, config.search.mode
    scored: dict[str, tuple[float, str, dict[str, Any]]] = {}
    for trial in summary.trials_detail:
        value = trial.best.get(metric)
        if trial.status != "TERMINATED" or value is None or not math.isfinite(value):
            continue
        key = json.dumps(trial.params, sort_keys=True)
        better = key not in scored or (value > scored[key][0] if mode == "max" else value < scored[key][0])
        if better:
            scored[key] = (value, trial.trial_id, dict(trial.params))
    ranked = sorted(scored.values(), key=lambda t: t[0], reverse=mode == "max")
    if not ranked:
        failed = sum(t.status == "ERROR" for t in summary.trials_detail)
        raise TuningError(
            f"{summary.out}: no trial finished with a {metric} value ({failed} failed: the "
            "error column of its results.csv says why); nothing to cross-validate"
        )
    if top < 1 or top > len(ranked):
        raise TuningError(
            f"--top {top}: the search has {len(ranked)} configuration(s) with a {metric} value; choose 1..{len(ranked)}"
        )
    return [
        Candidate(rank=i, trial_id=trial_id, params=params, search_value=value)
        for i, (value, trial_id, params) in enumerate(ranked[:top])
    ]


def _check_fold_sizes(config: ExperimentConfig, groups: list[list[str]], candidates: list[Candidate]) -> None:
    from distmis.config import apply_params

    total = sum(len(g) for g in groups)
    for c in candidates:
        trial = apply_params(config, c.params)
        batch = trial.train.batch_size_per_replica * trial.parallelism.workers_per_trial
        smallest = total - max(len(g) for g in groups)
        if smallest < batch:
            # a fold trains on the other folds' cases: more folds, more training cases per fold
            enough = next((f for f in range(len(groups) + 1, total + 1) if total - math.ceil(total / f) >= batch), None)
            advice = (
                f"use more folds (--folds {enough} trains each fold on {total - math.ceil(total / enough)})"
                if enough
                else f"the search's {total} train+val cases are too few for that batch"
            )
            raise TuningError(
                f"--folds {len(groups)}: a fold trains on {smallest} case(s), fewer than one global batch of {batch} "
                f"({c.name}: train.batch_size_per_replica x workers); {advice}, or a smaller batch"
            )


def check_fold_classes(plan: FinalizePlan) -> None:
    """Every fold's validation cases hold every foreground class (and region) at least once.

    Raises:
        TuningError: naming the fold and the class.
    """
    from distmis.data import label_presence
    from distmis.labels import metric_suffix

    manifest = load_manifest(plan.prepared)
    present = label_presence(manifest, [c for g in plan.groups for c in g])
    masks: dict[str, set[int]] = {}
    if manifest.info.label_mode == "binary":
        masks["foreground"] = {v for v in manifest.info.label_names if v > 0}
    else:
        masks.update({metric_suffix(n): {v} for v, n in manifest.info.label_names.items() if v > 0})
        masks.update({metric_suffix(n): set(vals) for n, vals in (manifest.info.regions or {}).items()})
    for index, group in enumerate(plan.groups):
        for name, values in masks.items():
            if not any(present[case] & values for case in group):
                raise TuningError(
                    f"--folds {plan.folds}: fold {index} ({len(group)} validation case(s)) has no case with {name}; its "
                    "cross-validated Dice would be undefined: use fewer folds (or another --seed)"
                )


def _search_tracking(run: Path) -> TrackingState:
    """The search's MLflow record, or an empty one for a search that has none (its runs then start afresh)."""
    return read_tracking_state(run) or TrackingState()


__all__ = ["PLAN_FILE", "FinalizePlan", "check_fold_classes", "plan_finalize"]
