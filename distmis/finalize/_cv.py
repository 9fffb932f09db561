"""Cross-validation: out-of-fold predictions, their scores, and the choice they make.

Every fold model predicts its own fold's validation cases from their raw NIfTI, as ``distmis
predict`` would (the recorded preprocessing, sliding windows, mirroring when the finalize uses
it), and is scored against the raw labels in the scan's geometry. A case is predicted by exactly
one fold model per configuration, so every train + validation case is scored once per
configuration ("out of fold"), by a model that never saw it.

The probabilities are kept (``oof/<configuration>/<case>.npz``, float16): the choice of an
ensemble of two configurations averages them, and the post-processing decision relabels them.
They are what makes the finalize resumable without predicting again; on large data they take
about a quarter of the raw scans' size per configuration.

The choice, as nnU-Net's ``find_best_configuration``:

1. the configuration with the best cross-validated mean of the plain Dice (the mean over the
   classes, or over the regions of a region model);
2. with ``pairs``, also every pair of configurations, their probabilities averaged: a pair wins
   if its cross-validated Dice is higher than the best single configuration's;
3. with ``postprocess``, per class or region: keep only its largest connected component when
   that raises its cross-validated Dice (on the out-of-fold predictions of the choice).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distmis.finalize._plan import FinalizePlan

MAIN = "dice"


@dataclass
class Selection:
    """What cross-validation chose."""

    members: list[str]  # candidate names whose fold models form the ensemble
    cv: dict[str, dict[str, Any]]  # metric -> {"folds": [...], "mean", "std"} of the choice
    largest_component: list[tuple[str, list[int]]] = field(default_factory=list)
    postprocess_gain: dict[str, float] = field(default_factory=dict)  # mask -> CV Dice with minus without
    pair_cv: dict[str, float] = field(default_factory=dict)  # "c0+c1" -> CV mean Dice of that pair


def raw_cases(plan: FinalizePlan) -> dict[str, Any]:
    """The raw cases behind the cross-validation cases (their files and headers checked)."""
    from distmis.data import load_manifest, read_dataset_json
    from distmis.inference import check_cases

    raw = Path(load_manifest(plan.prepared).info.source.path)
    dataset = read_dataset_json(raw, require_files=False)
    by_id = {c.case_id: c for c in dataset.training}
    wanted = [c for g in plan.groups for c in g]
    missing = [c for c in wanted if c not in by_id]
    if missing:
        from distmis.exceptions import DataError

        raise DataError(f"{raw / 'dataset.json'}: cases {missing[:5]} of the search's data are not listed any more")
    cases = {c: by_id[c] for c in wanted}
    check_cases(list(cases.values()), None, raw / "dataset.json")
    return cases


def out_of_fold(
    plan: FinalizePlan,
    fold_models: dict[tuple[str, int], Path],
    cases: dict[str, Any],
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, dict[str, Path]]:
    """Predict every fold's validation cases with that fold's model of every configuration.

    Returns ``{configuration: {case: probabilities .npz}}``; a prediction already on disk (a
    resumed finalize) is not made again. ``progress(done, total, what)`` follows each one made.
    """
    from distmis.data import load_case_image
    from distmis.files import atomic_file
    from distmis.inference import (
        PredictOptions,
        build_models,
        make_predict_fn,
        predict_probabilities,
        read_model_record,
    )

    options = PredictOptions(tta=plan.tta)
    found: dict[str, dict[str, Path]] = {c.name: {} for c in plan.candidates}
    jobs: list[tuple[str, int, Path, dict[str, Path]]] = []
    for (name, fold), model_dir in sorted(fold_models.items()):
        targets = {case: plan.out / "oof" / name / f"{case}.npz" for case in plan.groups[fold]}
        found[name].update(targets)
        todo = {case: path for case, path in targets.items() if not path.is_file()}
        if todo:
            jobs.append((name, fold, model_dir, todo))
    total, done = sum(len(todo) for *_, todo in jobs), 0
    for name, fold, model_dir, todo in jobs:
        record = read_model_record(model_dir)
        predict = make_predict_fn(build_models(record), tta=plan.tta)
        for case, target in todo.items():
            image = load_case_image(cases[case].image, record.channels, expected_by=f"the model {model_dir}")[0]
            probs = predict_probabilities(image, record, predict, options)
            with atomic_file(target) as tmp, open(tmp, "wb") as fh:
                np.savez_compressed(fh, probabilities=probs.astype(np.float16))
            done += 1
            if progress:
                progress(done, total, f"{name}/fold{fold}: {case}")
    return found


def load_probabilities(path: Path) -> np.ndarray:
    with np.load(path) as data:
        return np.asarray(data["probabilities"], dtype=np.float32)


def case_scores(
    plan: FinalizePlan,
    record: Any,
    cases: dict[str, Any],
    probabilities: Callable[[str], np.ndarray],
    masks: list[tuple[str, list[int]]] | None = None,
) -> dict[str, dict[str, float]]:
    """Every case's scores (``dice``, ``dice_<class>`` ...) of the probabilities ``probabilities(case)``
    gives, turned into labels as ``predict`` does (and with the largest components of ``masks``)."""
    from distmis.data import load_case_label, load_nifti_header
    from distmis.inference import keep_largest_components, label_values_of, probabilities_to_labels, score_labels

    regions = record.preprocessing.trained_regions
    labels = record.preprocessing.label_names
    scores = {}
    for case_id, case in cases.items():
        pred = probabilities_to_labels(probabilities(case_id), 0.5, regions, label_values_of(record))
        if masks:
            pred = keep_largest_components(pred, masks)
        affine, _ = load_nifti_header(case.label)
        spacing = [float(s) for s in np.linalg.norm(affine[:3, :3], axis=0)]
        truth = load_case_label(case.label, pred.shape, labels)
        scores[case_id] = score_labels(record, truth, pred, spacing, distances=False)
    return scores


def cv_summary(plan: FinalizePlan, scores: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per metric: each fold's mean over its cases, then the mean and standard deviation over folds."""
    metrics = sorted({k for s in scores.values() for k in s})
    out: dict[str, dict[str, Any]] = {}
    for metric in metrics:
        per_fold = []
        for group in plan.groups:
            values = [scores[c][metric] for c in group if c in scores and math.isfinite(scores[c][metric])]
            per_fold.append(float(np.mean(values)) if values else math.nan)
        finite = [v for v in per_fold if math.isfinite(v)]
        out[metric] = {
            "folds": per_fold,
            "mean": float(np.mean(finite)) if finite else math.nan,
            "std": float(np.std(finite)) if finite else math.nan,
        }
    return out


def choose(
    plan: FinalizePlan,
    record: Any,
    cases: dict[str, Any],
    oof: dict[str, dict[str, Path]],
    singles: dict[str, dict[str, dict[str, Any]]],
) -> Selection:
    """The configuration (or pair) with the best cross-validated Dice, and its post-processing."""
    best = max(singles, key=lambda name: _mean(singles[name]))
    selection = Selection(members=[best], cv=singles[best])
    if plan.pairs and len(plan.candidates) > 1:
        for a, b in itertools.combinations([c.name for c in plan.candidates], 2):
            pair_scores = case_scores(plan, record, cases, _averaged(oof, [a, b]))
            table = cv_summary(plan, pair_scores)
            selection.pair_cv[f"{a}+{b}"] = _mean(table)
            if _mean(table) > _mean(selection.cv):
                selection.members, selection.cv = [a, b], table
    if plan.postprocess:
        _decide_postprocessing(plan, record, cases, oof, selection)
    return selection


def _decide_postprocessing(
    plan: FinalizePlan, record: Any, cases: dict[str, Any], oof: dict[str, dict[str, Path]], selection: Selection
) -> None:
    """Per mask, the largest component only where that raises the mask's cross-validated Dice."""
    from distmis.inference import scored_masks

    probabilities = _averaged(oof, selection.members)
    kept: list[tuple[str, list[int]]] = []
    for name, values, _kind in scored_masks(record):
        mask_values = values if values is not None else _foreground_values(record)
        key = f"{MAIN}_{name}" if values is not None else MAIN
        trial = cv_summary(plan, case_scores(plan, record, cases, probabilities, [*kept, (name, mask_values)]))
        gain = trial[key]["mean"] - selection.cv[key]["mean"]
        selection.postprocess_gain[name] = gain
        if gain > 0:
            kept.append((name, mask_values))
            selection.cv = trial
    selection.largest_component = kept


def _foreground_values(record: Any) -> list[int]:
    return record.preprocessing.foreground_values  # type: ignore[no-any-return]


def _mean(table: dict[str, dict[str, Any]]) -> float:
    value = table.get(MAIN, {}).get("mean", math.nan)
    return value if math.isfinite(value) else -math.inf


def _averaged(oof: dict[str, dict[str, Path]], members: list[str]) -> Callable[[str], np.ndarray]:
    def probabilities(case: str) -> np.ndarray:
        return np.mean([load_probabilities(oof[m][case]) for m in members], axis=0)

    return probabilities


def single_tables(
    plan: FinalizePlan, record: Any, cases: dict[str, Any], oof: dict[str, dict[str, Path]]
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, dict[str, float]]]]:
    """Each configuration's CV summary, and its per-case scores."""
    tables, per_case = {}, {}
    for c in plan.candidates:
        per_case[c.name] = case_scores(plan, record, cases, _averaged(oof, [c.name]))
        tables[c.name] = cv_summary(plan, per_case[c.name])
    return tables, per_case


__all__ = ["MAIN", "Selection", "case_scores", "choose", "cv_summary", "out_of_fold", "raw_cases", "single_tables"]
