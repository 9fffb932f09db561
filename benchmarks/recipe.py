"""What each change of the training recipe does to test Dice on real anatomy, over seeds.

Each variant is a whole quickstart-sized search (the task file's budget: 8 trials of at most 12
epochs, 2 at a time on 2 CPUs) followed by ``distmis evaluate`` of its best model on the held-out
test subjects, from their raw NIfTI, without and with test-time mirroring (``--tta``). The
variants are cumulative, so each row shows one change on top of the rows above it:

  before         Dice loss, constant learning rate, uniformly placed patches (the old recipe)
  +dice_ce       Dice + cross-entropy
  +poly          ... and the poly learning-rate schedule
  +oversampling  ... and 33 % of patches centred on foreground (nnU-Net's share)
  default        what the task file trains with today (distmis's defaults)
  +augment       the default with nnU-Net's augmentation for a 3D patch (rotation 30, scale
                 [0.7, 1.4], its intensity transforms at strength 1): not cumulative, run beside default

Per variant and class: the test Dice, median and interquartile range over seeds (a seed sets the
sampler and the training seed), with and without TTA, and the search's wall time. Writes
``OUT/recipe.{json,md,png}``; finished runs are kept, so a second call only runs what is
missing.

    python benchmarks/recipe.py --task mni152 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from benchlib import NNUNET_AUGMENT, REPO, TASK_FILES, fmt_stat, prepare_task, quartiles, run_tune, write_report

OLD = {"loss": "dice", "lr_schedule": "constant", "foreground_oversampling": 0.0}
VARIANTS: dict[str, dict[str, Any]] = {
    "before": OLD,
    "+dice_ce": {**OLD, "loss": "dice_ce"},
    "+poly": {**OLD, "loss": "dice_ce", "lr_schedule": "poly"},
    "+oversampling": {**OLD, "loss": "dice_ce", "lr_schedule": "poly", "foreground_oversampling": 0.33},
    "default": {},
    "+augment": {"augment": NNUNET_AUGMENT},
}


def _with_variant(train: dict[str, Any], variant: dict[str, Any]) -> dict[str, Any]:
    """``train`` with the variant's keys, ``augment``'s merged key by key (the task's flips kept)."""
    merged = {**train, **variant}
    if "augment" in variant:
        merged["augment"] = {**train.get("augment", {}), **variant["augment"]}
    return merged


def evaluate(model: Path, out: Path, tta: bool) -> dict[str, Any]:
    if not (out / "summary.json").is_file():
        cmd = [sys.executable, "-m", "distmis", "evaluate", str(model), "--split", "test", "--out", str(out)]
        cmd += ["--no-track", "--overwrite"] + (["--tta"] if tta else [])
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="mni152", choices=sorted(TASK_FILES))
    p.add_argument("--space", default=None, help="base search-space file (default: the task's)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--patch", default=None, help="train.patch override, e.g. 48 (default: the file's)")
    p.add_argument("--out", default=None, help="for recipe.json, .md and .png (default runs/bench-recipe-<task>)")
    a = p.parse_args()

    space_file = Path(a.space) if a.space else TASK_FILES[a.task]
    base = yaml.safe_load(space_file.read_text())
    root = Path(a.out or REPO / "runs" / f"bench-recipe-{a.task}").resolve()
    root.mkdir(parents=True, exist_ok=True)
    prepared = prepare_task(a.task, base, space_file.parent, root)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    results: dict[str, dict[int, dict[str, Any]]] = {v: {} for v in variants}
    for seed in range(a.seeds):
        for variant in variants:
            name = f"{variant.replace('+', 'with_')}-s{seed}"
            out = root / "runs" / name
            doc = dict(base)
            doc["name"] = f"recipe-{name}"
            doc["data"] = {**base.get("data", {}), "source": str(prepared)}
            doc["train"] = {**_with_variant(base.get("train", {}), VARIANTS[variant]), "seed": seed}
            if a.patch:
                doc["train"]["patch"] = [int(a.patch)] * 3
            doc["search"] = {**base["search"], "seed": seed}
            wall = None
            if not (out / "results.csv").is_file():
                wall = run_tune(doc, root, out)
            summary = json.loads((out / "summary.json").read_text())
            plain = evaluate(out / "best", root / "eval" / name, tta=False)
            mirrored = evaluate(out / "best", root / "eval" / f"{name}-tta", tta=True)
            results[variant][seed] = {
                "search_wall_seconds": wall if wall is not None else summary["wall_seconds"],
                "best_val": summary.get("best_value"),
                "test": {k: v["mean"] for k, v in plain["metrics"].items() if k.startswith("dice")},
                "test_tta": {k: v["mean"] for k, v in mirrored["metrics"].items() if k.startswith("dice")},
                "tta_network_seconds": mirrored.get("timing", {}).get("network_seconds"),
                "network_seconds": plain.get("timing", {}).get("network_seconds"),
            }
            print(f"    {variant} seed {seed}: test {results[variant][seed]['test']}", flush=True)
    classes = sorted(next(iter(next(iter(results.values())).values()))["test"])
    rows = []
    for variant, seeds in results.items():
        row: dict[str, Any] = {"variant": variant}
        for c in classes:
            row[c] = fmt_stat(*quartiles([s["test"][c] for s in seeds.values()]), 4)
            row[f"{c} (TTA)"] = fmt_stat(*quartiles([s["test_tta"][c] for s in seeds.values()]), 4)
        row["search wall (s)"] = fmt_stat(*quartiles([s["search_wall_seconds"] for s in seeds.values()]), 0)
        rows.append(row)
    title = f"test Dice on {a.task}, median [IQR] over {a.seeds} seed(s); each row adds one change to the rows above"

    def draw(fig: Any) -> None:
        axes = fig.add_subplot()
        for i, c in enumerate(classes):
            for j, seeds in enumerate(results.values()):
                values = [s["test"][c] for s in seeds.values()]
                axes.scatter([j + 0.1 * i] * len(values), values, label=c if j == 0 else None, color=f"C{i}")
        axes.set_xticks(range(len(results)), list(results))
        axes.set_ylabel("test Dice (each seed)")
        axes.legend()

    write_report(root, "recipe", title=title, rows=rows, data={"task": a.task, "results": results}, figure=draw)


if __name__ == "__main__":
    main()
