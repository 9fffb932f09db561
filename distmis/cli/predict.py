"""Segment raw NIfTI scans with a trained model (the best/ directory of a run or search):
the preprocessing recorded with the model, sliding-window inference with Gaussian blending,
output NIfTI with the source image's shape, affine and header. A failed case is reported and
skipped (nothing written for it); the exit code is 1 if any case failed."""

from __future__ import annotations

import argparse
from pathlib import Path

from distmis.cli._inference import add_window_arguments, print_network_time, report_failures, window_options


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
    from distmis.cli._common import progress
    from distmis.inference import plan_jobs, predict_cases, read_model_record

    record = read_model_record(args.model)
    options = window_options(args)
    options.check()
    options.resolved_patch(record)
    jobs = plan_jobs(Path(args.input), Path(args.out), model_dir=Path(args.model), overwrite=args.overwrite)
    print(
        f"model: {args.model} ({record.preprocessing['label_mode']}, {record.channels} channels, "
        f"resize {record.preprocessing['resize']}); {len(jobs)} case(s)"
    )
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
    ok = sum(o.ok for o in outcomes)
    out = Path(args.out)
    if ok and out.is_dir():
        from distmis.files import marker_info, write_marker

        if marker_info(out) is None and not any(p.name.startswith(".distmis") for p in [out]):
            write_marker(out, "predict")
    print(f"{ok} of {len(outcomes)} case(s) written")
    print_network_time(outcomes, args.tta)
    return report_failures([o for o in outcomes if not o.ok], "segmentations")
