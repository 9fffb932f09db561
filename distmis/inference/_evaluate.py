"""``distmis evaluate``: predict held-out cases from their raw NIfTI and score them in mm.

Evaluation deliberately goes back to the *raw* scans and labels named by the prepared
directory's ``info.json`` (its source ``dataset.json`` and split), rather than scoring the
preprocessed arrays: what a user cares about is the segmentation ``distmis predict`` writes
in the scan's own geometry, and HD95 needs the real voxel spacing.

Output directory (written to a temporary sibling, renamed at the end)::

    metrics.csv        one row per case: Dice, IoU, HD95 (mm), sensitivity, specificity
    summary.json       mean / median per metric, failed cases, options, model
    cases.png          a few cases: image, truth, prediction (slice through the tumour)
    predictions/       the predicted segmentations (NIfTI, source geometry)
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmis.data import (
    MsdCase,
    geometry_difference,
    load_case_label,
    load_nifti,
    load_nifti_header,
    read_dataset_json,
)
from distmis.exceptions import DataError
from distmis.files import (
    atomic_directory,
    atomic_file,
    check_output,
    check_replaceable,
    marker_info,
    open_nofollow,
    write_json_atomic,
)
from distmis.inference._model import ModelRecord, read_model_record
from distmis.inference._predict import CaseJob, CaseOutcome, PredictOptions, model_declares, predict_cases
from distmis.inference._scores import METRICS, mask_metrics, summarise
from distmis.schema import RunFile, Tag

if TYPE_CHECKING:
    from distmis.tracking import TrackingState

_log = logging.getLogger(__name__)
MAX_PICTURED = 4


@dataclass
class EvaluationResult:
    out: Path
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    failed: list[CaseOutcome]
    mlflow_run_id: str | None = None
    outcomes: list[CaseOutcome] = field(default_factory=list)


def raw_dataset(source: Path) -> Path:
    """The raw MSD directory behind ``source`` (a prepared directory's recorded source, or itself)."""
    if (source / RunFile.PREPARED_INFO).is_file():
        from distmis.data import load_manifest

        return Path(load_manifest(source).info.source.path)
    return source


def check_model_splits(record: ModelRecord, source: Path) -> None:
    """Refuse prepared data whose test split or train+val pool is not the one the model was made on.

    Models record their training's case splits (``preprocessing.json``); fold models of a finalize
    record their fold, so only moves across the test split count (:meth:`CaseSplits.moved`). A model
    from before splits were recorded, or raw MSD data, cannot be checked.

    Raises:
        DataError: naming the cases that moved.
    """
    from distmis.data import check_same_splits, load_manifest

    recorded = record.singles[0].preprocessing.splits
    if not (source / RunFile.PREPARED_INFO).is_file():
        return
    if not recorded:  # every model of this version records them: edited out, or made by hand
        from distmis.console import notify

        notify(
            f"distmis: warning: {record.directory}: its {RunFile.PREPROCESSING} records no case splits, so whether "
            f"the cases of {source} were untouched in its training cannot be checked; scored as {source} splits them now"
        )
        return
    now = load_manifest(source).info.case_splits
    where = f"the model {record.directory} (its preprocessing.json)"
    check_same_splits(recorded, now, recorded_in=where, data=source, pooled=True)


def seen_in_training(record: ModelRecord, case_ids: list[str]) -> dict[str, list[str]]:
    """Which of ``case_ids`` the model (any member of an ensemble) trained on, and which it chose its
    best epoch on: a score on them is not a test score."""
    trained: set[str] = set()
    validated: set[str] = set()
    for single in record.singles:
        splits = single.preprocessing.splits
        if splits is not None:
            trained |= set(splits.train)
            validated |= set(splits.val)
    return {
        "trained_on": [c for c in case_ids if c in trained],
        "validated_on": [c for c in case_ids if c in validated - trained],
    }


def evaluation_cases(source: Path, split: str) -> list[MsdCase]:
    """The labelled raw cases of ``split``: from a prepared directory (``info.json``) or, for an
    MSD directory (``dataset.json``), every training case when ``split`` is ``all``."""
    if (source / RunFile.PREPARED_INFO).is_file():
        from distmis.data import load_manifest

        manifest = load_manifest(source)
        splits = manifest.info.splits
        if split not in splits:
            raise DataError(
                f"--split {split}: {source / RunFile.PREPARED_INFO} has no such split; it has {sorted(splits)}"
            )
        ids = manifest.cases(split)
        if not ids:
            raise DataError(f"{source / RunFile.PREPARED_INFO}: split {split!r} has no cases")
        raw = Path(manifest.info.source.path)
        dataset = read_dataset_json(raw, require_files=False)  # this split's files are checked per case
        by_id = {c.case_id: c for c in dataset.training}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise DataError(f"{raw / 'dataset.json'}: cases {missing[:5]} of split {split!r} are not listed any more")
        return [by_id[i] for i in ids]
    if (source / "dataset.json").is_file():
        if split != "all":
            raise DataError(
                f"--split {split}: {source} is an MSD directory, which has no splits; pass --split all, or the "
                "prepared directory"
            )
        return list(read_dataset_json(source, require_files=False).training)
    raise DataError(f"{source}: expected a prepared directory (info.json) or an MSD directory (dataset.json)")


def scored_masks(record: ModelRecord) -> list[tuple[str, list[int] | None, str]]:
    """(name, label values, kind) of every mask scored: one ``foreground`` mask for binary models
    (any label > 0); per label value and per region (when the model has regions) otherwise."""
    if record.preprocessing.label_mode == "binary":
        return [("foreground", None, "foreground")]
    from distmis.labels import metric_suffix

    labels = record.preprocessing.label_names
    values = sorted(v for v in labels if v > 0)
    masks: list[tuple[str, list[int] | None, str]] = [(metric_suffix(labels[v]), [v], "label") for v in values]
    regions = record.preprocessing.regions or record.config.data.regions or {}
    masks += [(metric_suffix(name), list(vals), "region") for name, vals in regions.items()]
    return masks


def score_case(record: ModelRecord, case: MsdCase, prediction: Path) -> dict[str, Any]:
    """Metrics of one case: per label value and per region (``dice_ET``, ``hd95_mm_WT``, ...), and
    under the plain names the mean over the label values (region models: over the regions)."""
    # the prediction carries the source image's header (write_segmentation), so its zooms are the scan's
    pred, affine, header = load_nifti(prediction, dtype=np.float32)
    spacing = [float(z) for z in header.get_zooms()[:3]]  # type: ignore[attr-defined]
    assert case.label is not None
    label_affine = load_nifti_header(case.label)[0]
    diff = geometry_difference(affine, label_affine)
    if diff:  # the prediction is written in its scan's geometry: a label elsewhere cannot be scored
        raise DataError(f"{case.label}: not aligned with the prediction {prediction}: {diff}")
    truth = load_case_label(case.label, pred.shape, record.preprocessing.label_names)
    row: dict[str, Any] = {"case_id": case.case_id, **score_labels(record, truth, pred, spacing)}
    row["spacing_mm"] = "x".join(f"{s:g}" for s in spacing)
    return row


def score_labels(
    record: ModelRecord, truth: np.ndarray, pred: np.ndarray, spacing: list[float], *, distances: bool = True
) -> dict[str, float]:
    """Metrics of a predicted label map against the truth, both in the scan's grid: per label value and
    per region (``dice_ET``, ...), and under the plain names the mean over the label values (region
    models: over the regions). ``distances=False`` skips HD95 (cross-validation needs overlaps only)."""
    row: dict[str, float] = {}
    averaged = []
    main_kind = "region" if record.preprocessing.label_mode == "regions" else "label"
    for name, values, kind in scored_masks(record):
        t = truth > 0 if values is None else np.isin(truth, values)
        p = pred > 0 if values is None else np.isin(pred, values)
        m = mask_metrics(t, p, spacing if distances else None)
        if values is None or kind == main_kind:
            averaged.append(m)
        if values is not None:
            row.update({f"{k}_{name}": v for k, v in m.items()})
    for metric in averaged[0] if averaged else []:
        vals = [m[metric] for m in averaged]
        row[metric] = vals[0] if len(vals) == 1 else float(np.mean(vals))
    return row


def _metric_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The plain metrics first, then the per-label and per-region ones (``dice_ET``, ...)."""
    columns = list(METRICS)
    for r in rows:
        columns += [
            k
            for k in r
            if k not in columns and k.split("_")[0] in ("dice", "iou", "hd95", "sensitivity", "specificity")
        ]
    return columns


def plot_cases(record: ModelRecord, cases: list[tuple[MsdCase, Path]], out: Path) -> Path:
    """Image (first modality), truth and prediction on the slice with the most tumour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap([(0, 0, 0, 0), (1, 0.85, 0, 0.55), (1, 0.1, 0.1, 0.55), (0.1, 0.6, 1, 0.55)])
    fig, axes = plt.subplots(len(cases), 3, figsize=(8, 2.7 * len(cases)), squeeze=False)
    labels = record.preprocessing.label_names
    for row, (case, pred_path) in zip(axes, cases, strict=True):
        image = load_nifti(case.image)[0]
        image = image[..., 0] if image.ndim == 4 else image
        assert case.label is not None
        truth = load_case_label(case.label, image.shape, labels)
        if record.preprocessing.label_mode == "binary":
            truth = (truth > 0).astype(np.uint8)  # what the model was trained to find
        pred = load_nifti(pred_path)[0].astype(np.uint8)
        area = (truth > 0).reshape(-1, truth.shape[2]).sum(0)
        z = int(np.argmax(area)) if area.max() > 0 else truth.shape[2] // 2
        for ax, overlay, title in zip(row, (None, truth, pred), ("image", "truth", "prediction"), strict=True):
            ax.imshow(image[:, :, z].T, cmap="gray", origin="lower")
            if overlay is not None:
                ax.imshow(
                    np.clip(overlay[:, :, z], 0, 3).T,
                    cmap=cmap,
                    vmin=0,
                    vmax=3,
                    origin="lower",
                    interpolation="nearest",
                )
            ax.set_title(f"{case.case_id} {title} (z={z})", fontsize=8)
            ax.axis("off")
    fig.tight_layout()
    from distmis import __version__

    with atomic_file(out) as tmp:
        fig.savefig(tmp, dpi=90, format="png", metadata={"Software": f"distmis evaluate {__version__}"})
    plt.close(fig)
    return out


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    with open_nofollow(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _score_all(
    record: ModelRecord, cases: list[MsdCase], jobs: list[CaseJob], outcomes: list[CaseOutcome]
) -> tuple[list[dict[str, Any]], list[tuple[MsdCase, Path]], list[CaseOutcome]]:
    """Score every predicted case: (rows, the cases scored with their predictions, the failed cases)."""
    rows: list[dict[str, Any]] = []
    failed = [o for o in outcomes if not o.ok]
    scored: list[tuple[MsdCase, Path]] = []
    for case, job, outcome in zip(cases, jobs, outcomes, strict=True):
        if not outcome.ok:
            continue
        try:
            row = score_case(record, case, job.out)
        except DataError as exc:  # e.g. a corrupt label file: this case fails, the others count
            outcome.error = str(exc)
            failed.append(outcome)
            job.out.unlink(missing_ok=True)
            continue
        row["seconds"] = round(outcome.seconds, 3)
        rows.append(row)
        scored.append((case, job.out))
    return rows, scored, failed


def check_cases(cases: list[MsdCase], record: ModelRecord | None, listed_in: Path) -> None:
    """Before anything is predicted: every case of the split can be read, and its label lies on its
    scan's grid, with the same rule as ``distmis prepare`` (shape, spacing, origin, axis direction).
    A label flipped against its scan was scored as if it matched.

    Raises:
        DataError: naming the file and the difference.
    """
    from distmis.data import check_case_files, check_case_headers

    for case in cases:
        check_case_files(case, listed_in)
        if record is not None:
            check_case_headers(case, record.channels, expected_by=model_declares(record))
        else:
            check_case_headers(case, _channels(case))


def _channels(case: MsdCase) -> int:
    """The channel count of the case's own image (when no model says how many there must be)."""
    from distmis.data import load_nifti_header

    shape = load_nifti_header(case.image)[1]
    return shape[3] if len(shape) == 4 else 1


def _summary(
    model_dir: Path,
    source: Path,
    split: str,
    cases: int,
    rows: list[dict[str, Any]],
    failed: list[CaseOutcome],
    outcomes: list[CaseOutcome],
    patch: tuple[int, int, int],
) -> dict[str, Any]:
    return {
        "model": str(model_dir.resolve()),
        "source": str(source.resolve()),
        "split": split,
        "cases": cases,
        "scored": len(rows),
        "failed": [{"case_id": o.case_id, "error": o.error} for o in failed],
        "options": {"patch": list(patch)},
        "timing": {
            "predict_seconds": round(sum(o.seconds for o in outcomes if o.ok), 3),
            "network_seconds": round(sum(o.network_seconds for o in outcomes if o.ok), 3),
        },
        "metrics": {m: summarise([r[m] for r in rows]) for m in _metric_columns(rows)},
    }


def evaluate(
    model_dir: str | Path,
    source: str | Path,
    *,
    split: str = "test",
    out: str | Path | None = None,
    options: PredictOptions = PredictOptions(),
    workers: int | None = None,
    address: str | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float | None = None,
    overwrite: bool = False,
    track: bool = True,
    on_done: Any = None,
) -> EvaluationResult:
    """Predict and score every labelled case of ``split``; see the module docstring for the output.

    Raises:
        InferenceError / DataError: bad model directory or source, before anything is predicted.
    """
    model_dir, source = Path(model_dir), Path(source)
    record = read_model_record(model_dir)
    check_model_splits(record, source)
    cases = evaluation_cases(source, split)
    if out is None:  # the folder's own name, not a link's target: the model is named as the user named it
        out = model_dir.parent / RunFile.evaluation_dir(model_dir.absolute().name, split)
    out = Path(out)
    check_output(out, option="--out", inputs={"model": model_dir, "data": source, "raw dataset": raw_dataset(source)})
    if track:
        send_leftovers(model_dir, out, record.config.tracking.final_flush_seconds, replacing=overwrite)
    check_replaceable(out, option="--out", overwrite=overwrite)
    options.check()
    options.resolved_patch(record)
    check_cases(cases, record, raw_dataset(source) / "dataset.json")
    with atomic_directory(out, command="evaluate", overwrite=overwrite, option="--out") as tmp:
        jobs = [CaseJob(c.case_id, c.image, tmp / "predictions" / f"{c.case_id}.nii.gz") for c in cases]
        outcomes = predict_cases(
            model_dir,
            jobs,
            options,
            workers=workers,
            address=address,
            cpus_per_worker=cpus_per_worker,
            gpus_per_worker=gpus_per_worker,
            on_done=on_done,
        )
        rows, scored, failed = _score_all(record, cases, jobs, outcomes)
        summary = _summary(model_dir, source, split, len(cases), rows, failed, outcomes, options.resolved_patch(record))
        summary["options"].update(overlap=options.overlap, blend=options.blend, batch_size=options.batch_size)
        summary["options"]["tta"] = options.mirrored(record)
        summary["seen_in_training"] = seen_in_training(record, [c.case_id for c in cases])
        if rows:
            _write_csv(tmp / RunFile.METRICS, rows)
            plot_cases(record, scored[:MAX_PICTURED], tmp / "cases.png")
        write_json_atomic(tmp / RunFile.SUMMARY, summary)
    result = EvaluationResult(out, rows, summary, failed, outcomes=outcomes)
    if track and rows:
        result.mlflow_run_id = log_evaluation(model_dir, out, summary, record.config.tracking.final_flush_seconds)
    return result


# --------------------------------------------------------------------------- MLflow
def send_leftovers(model_dir: Path, out: Path, wait_seconds: float, *, replacing: bool) -> None:
    """What an earlier evaluation in ``out`` left queued for its MLflow run (the store was down when it
    ended), sent now, before that evaluation is replaced or the command is refused for it: a later
    command in the same place delivers it, as ``tune --resume`` does a search's. Only a directory
    ``distmis evaluate`` wrote is read (its queue names files to upload)."""
    from distmis.console import notify
    from distmis.exceptions import TrackingError
    from distmis.tracking import RunWriter, read_tracking_state, reattach_uri

    if out.is_symlink() or not (out / RunFile.MLFLOW_PENDING).is_file():
        return
    if not str((marker_info(out) or {}).get("written_by", "")).endswith(" evaluate"):
        return
    try:
        state = read_tracking_state(out)
        if state is None or not state.tracking_uri:
            return
        writer = RunWriter(reattach_uri(state.tracking_uri, None, None, model_dir), out)
        queued = writer.pending()
        if writer.deliver(wait_seconds):
            notify(
                f"distmis: {out}: the earlier evaluation's MLflow run received the {queued} operation(s) it had queued"
            )
        elif replacing:
            notify(
                f"distmis: warning: {out}: MLflow at {state.tracking_uri} did not take the earlier evaluation's "
                f"{writer.pending()} queued operation(s); --overwrite replaces them with this evaluation"
            )
        writer.release()  # the directory may be replaced next: nothing of the earlier run is written there
    except TrackingError as exc:
        notify(f"distmis: warning: {out}: the earlier evaluation's queued MLflow operations are not sent ({exc})")


def search_tracking(model_dir: Path) -> tuple[TrackingState, str | None] | None:
    """The MLflow runs a model directory came from (``<search>/best`` or ``<search>/trials/<id>/best``):
    the search's tracking record and the trial's own run, if any.

    Raises:
        TrackingError: the search's record is there but is not one distmis wrote.
    """
    from distmis.exceptions import TrackingError
    from distmis.tracking import read_tracking_state

    model_dir = model_dir.resolve()
    candidates: list[tuple[Path, str | None]] = [(model_dir.parent, None)]
    if len(model_dir.parents) > 2 and model_dir.parents[1].name == "trials":
        candidates.append((model_dir.parents[2], model_dir.parent.name))
    for search_dir, trial in candidates:
        state = read_tracking_state(search_dir)
        if state is not None and state.parent_run_id:
            if not state.has_run:
                raise TrackingError(
                    f"{search_dir / RunFile.MLFLOW_STATE}: names no store or experiment id for run "
                    f"{state.parent_run_id} (not a record as distmis writes it)"
                )
            return state, state.trial_run_id(trial) if trial else None
    return None


def log_evaluation(model_dir: Path, out: Path, summary: dict[str, Any], wait_seconds: float) -> str | None:
    """A nested run under the search's parent run, named as the default output folder
    (:meth:`RunFile.evaluation_dir`), with metrics and files, written through the tracking
    package's queue in ``out`` as a search's runs are.

    A tracking failure never loses the evaluation (its files are already written): a store that
    cannot be reached at the start is one warning and ``None``; one that goes away later keeps
    what it did not receive in ``out``.
    """
    from distmis.exceptions import TrackingError
    from distmis.tracking import RunWriter, reattach_uri

    tags = {Tag.KIND: "evaluation", Tag.MODEL_DIR: str(model_dir.resolve()), Tag.SPLIT: summary["split"]}
    seen = summary.get("seen_in_training", {})
    tags[Tag.CASES_SEEN_IN_TRAINING] = str(len(seen.get("trained_on", [])))
    tags[Tag.CASES_SEEN_IN_VALIDATION] = str(len(seen.get("validated_on", [])))
    params = {f"predict.{k}": json.dumps(v) if isinstance(v, list) else v for k, v in summary["options"].items()}
    try:
        found = search_tracking(model_dir)
        if found is None:
            return None
        search, trial_run_id = found
        if trial_run_id:
            tags[Tag.TRIAL_RUN_ID] = trial_run_id
        writer = RunWriter(reattach_uri(str(search.tracking_uri), None, None, model_dir), out)
        run_id = writer.open(
            search.experiment or "",
            RunFile.evaluation_dir(model_dir.absolute().name, summary["split"]),
            tags=tags,
            params=params,
            parent_run_id=search.parent_run_id,
            experiment_id_known=search.experiment_id,
        )
    except TrackingError as exc:
        _log.warning("evaluation not logged to MLflow (%s); its files are in %s", exc, out)
        return None
    metrics = dict(summary.get("timing", {}))
    for metric, stats in summary["metrics"].items():
        metrics.update({f"{metric}_{s}": stats[s] for s in ("mean", "median") if np.isfinite(stats[s])})
    metrics.update({"cases_scored": summary["scored"], "cases_failed": len(summary["failed"])})
    writer.log_metrics(metrics)
    writer.log_files([out / name for name in (RunFile.METRICS, RunFile.SUMMARY, "cases.png") if (out / name).is_file()])
    if writer.close("FINISHED", wait_seconds):
        writer.release()  # all delivered: a later evaluation here, in this process, starts from its own files
    return run_id
