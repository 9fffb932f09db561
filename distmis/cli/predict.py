"""Segment raw NIfTI scans with a trained model (the best/ directory of a run or search):
the preprocessing recorded with the model, sliding-window inference with Gaussian blending,
output NIfTI with the source image's shape, affine and header. A failed case is reported and
skipped (nothing written for it); the exit code is 1 if any case failed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from distmis.cli._inference import add_window_arguments, print_network_time, report_failures, window_options

if TYPE_CHECKING:
    from distmis.inference import CaseJob, PredictOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model directory: config.yaml, weights.npz, preprocessing.json (e.g. runs/x/best)")
    p.add_argument("input", help="a .nii/.nii.gz image, or a directory of them (e.g. imagesTs/)")
    p.add_argument(
        "--out", required=True, help="output .nii.gz for one image, or a directory (one <case>.nii.gz per input)"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace segmentations distmis wrote earlier (never any other file)"
    )
    add_window_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Predict under an exclusive lock of ``--out`` (:func:`distmis.locks.sibling_lock`): two
    predicts into one directory would leave it holding the cases of two models."""
    from distmis.files import make_parents, remove_if_empty
    from distmis.inference import plan_jobs, read_model_record
    from distmis.locks import sibling_lock

    record = read_model_record(args.model)
    options = window_options(args)
    options.check()
    options.resolved_patch(record)
    jobs = plan_jobs(Path(args.input), Path(args.out), model_dir=Path(args.model), overwrite=args.overwrite)
    print(
        f"model: {args.model} ({record.preprocessing.label_mode}, {record.channels} channels, "
        f"resize {record.preprocessing.resize}); {len(jobs)} case(s)"
    )
    out = Path(args.out)
    parents = make_parents(out.parent if str(out.parent) else Path())  # the lock file lives beside --out
    try:
        with sibling_lock(out, command="predict", option="--out"):
            # checked again now that it is ours: a predict that held it may have written meanwhile
            jobs = plan_jobs(Path(args.input), out, model_dir=Path(args.model), overwrite=args.overwrite)
            return _write_segmentations(args, options, out, jobs)
    finally:
        remove_if_empty(parents)  # only directories made for nothing: one holding segmentations stays


def _write_segmentations(args: argparse.Namespace, options: PredictOptions, out: Path, jobs: list[CaseJob]) -> int:
    """Predict every job into ``out`` (marked as distmis's first); the exit code (1 if a case failed)."""
    from distmis.console import progress_bar as progress
    from distmis.inference import predict_cases

    created = _claim(out, jobs)
    try:
        with progress("predicting") as update:
            update(0, len(jobs))

            def done(outcome, n: int, total: int) -> None:  # noqa: ANN001
                update(n, total)
                if outcome.ok:
                    print(
                        f"  {outcome.case_id}: {'x'.join(map(str, outcome.shape[:3]))}, {outcome.cubes} cubes, "
                        f"{outcome.seconds:.1f} s -> {outcome.out}  [{outcome.worker}]"
                    )

            outcomes = predict_cases(
                args.model,
                jobs,
                options,
                workers=args.workers,
                address=args.address,
                cpus_per_worker=args.cpus_per_worker,
                gpus_per_worker=args.gpus_per_worker,
                on_done=done,
            )
    except BaseException:
        _release(out, created)
        raise
    if not any(o.ok for o in outcomes):
        _release(out, created)
    ok = sum(o.ok for o in outcomes)
    print(f"{ok} of {len(outcomes)} case(s) written")
    print_network_time(outcomes, args.tta)
    return report_failures([o for o in outcomes if not o.ok], "segmentations", total=len(outcomes))


def _claim(out: Path, jobs: list[CaseJob]) -> list[Path] | None:
    """Mark a directory of segmentations as distmis' before the first case is written (a disk
    that fills mid-way leaves a directory ``--overwrite`` may replace); returns what to undo
    when nothing gets written: the directories this run created (``out`` and missing parents)."""
    from distmis.files import make_parents, marker_info, remove_if_empty, write_marker

    if not any(job.out.parent == out for job in jobs) or marker_info(out) is not None:
        return None
    created = make_parents(out)
    try:
        write_marker(out, "predict")
    except BaseException:
        remove_if_empty(created)
        raise
    return created


def _release(out: Path, created: list[Path] | None) -> None:
    """Undo :func:`_claim` when no segmentation was written: no marker, and no directory made for
    nothing. A directory holding segmentations (a disk that filled after some) keeps its marker."""
    if created is None:
        return
    from distmis.files import MARKER, remove_if_empty

    if not out.is_dir() or any(p.name != MARKER for p in out.iterdir()):
        return
    (out / MARKER).unlink(missing_ok=True)
    remove_if_empty(created)
