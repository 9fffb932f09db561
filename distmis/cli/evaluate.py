"""Score a trained model on held-out cases: each case of the split is predicted from its raw
NIfTI (as distmis predict does) and compared with its label in the scan's geometry: Dice, IoU,
HD95 in mm, sensitivity, specificity per case (metrics.csv), mean/median (summary.json), a
picture of a few cases (cases.png). Logged to MLflow as a nested run when the model came
from a tracked search. Exit code 1 if any case failed."""

from __future__ import annotations

import argparse
import math

from distmis.cli._inference import add_window_arguments, print_network_time, report_failures, window_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model directory (e.g. runs/x/best)")
    p.add_argument(
        "data",
        nargs="?",
        default=None,
        help="prepared directory (info.json: its raw source and split) or an MSD directory "
        "(default: the data the model was trained on, from its config.yaml)",
    )
    p.add_argument(
        "--split", default="test", help="split of the prepared directory (default test); 'all' for an MSD directory"
    )
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default beside the model: evaluate-<split> for a search's best/, "
        "evaluate-<model>-<split> for another model such as final/)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument("--no-track", action="store_true", help="do not log the evaluation to MLflow")
    add_window_arguments(p)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from distmis.console import progress_bar as progress
    from distmis.inference import METRICS, evaluate

    data = args.data
    if data is None:
        from pathlib import Path

        from distmis.data import resolve_prepared
        from distmis.inference import read_model_record

        data = resolve_prepared(read_model_record(args.model).config.data, base_dir=Path.cwd())
        print(f"data: {data} (from the model's config.yaml)")
    with progress("predicting") as update:
        result = evaluate(
            args.model,
            data,
            split=args.split,
            out=args.out,
            options=window_options(args),
            workers=args.workers,
            address=args.address,
            cpus_per_worker=args.cpus_per_worker,
            gpus_per_worker=args.gpus_per_worker,
            overwrite=args.overwrite,
            track=not args.no_track,
            on_done=lambda outcome, n, total: update(n, total),
        )
    table = Table(title=f"{args.split}: {result.summary['scored']} of {result.summary['cases']} case(s) scored")
    table.add_column("metric")
    table.add_column("mean", justify="right")
    table.add_column("median", justify="right")
    table.add_column("undefined", justify="right")
    per_mask = [m for m in result.summary["metrics"] if m.startswith(("dice_", "hd95_mm_"))]  # per class / region
    for metric in [*METRICS, *per_mask]:
        s = result.summary["metrics"][metric]
        fmt = lambda v: "-" if math.isnan(v) else f"{v:.4f}"
        table.add_row(metric, fmt(s["mean"]), fmt(s["median"]), str(s["undefined"]))
    Console().print(table)
    seen = result.summary.get("seen_in_training", {})
    for key, how in (("trained_on", "trained on"), ("validated_on", "chose its best epoch on")):
        if seen.get(key):
            print(
                f"distmis: note: the model {how} {len(seen[key])} of these {result.summary['cases']} case(s) "
                f"({', '.join(seen[key][:5])}{', ...' if len(seen[key]) > 5 else ''}): their scores are not test scores"
            )
    print_network_time(result.outcomes, args.tta)
    print(f"results: {result.out} (metrics.csv, summary.json, cases.png, predictions/)")
    if result.mlflow_run_id:
        print(f"MLflow: run {result.mlflow_run_id} (nested under the search's parent run)")
    return report_failures(result.failed, "cases were scored")
