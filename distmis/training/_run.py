"""Train one configuration: the unit both ``distmis train`` and every Tune trial run.

It knows nothing about the CLI or Ray: it writes a run directory and calls ``on_epoch`` after
every epoch (the Tune trial's callback reports to Tune there; returning ``True`` stops).

Run directory::

    config.yaml        the exact configuration trained
    metrics.csv        one row per epoch
    checkpoint/        last epoch: state.npz (model + optimiser) and state.json
    best/              best epoch: weights.npz, config.yaml, preprocessing.json, metrics.json
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distmis._fsutil import write_json_atomic
from distmis.config import ExperimentConfig, dump_config
from distmis.data import load_manifest
from distmis.exceptions import TrainingError
from distmis.training._loop import EpochMetrics, Trainer, load_arrays, save_arrays

if TYPE_CHECKING:
    import tensorflow as tf

CHECKPOINT_DIR = "checkpoint"
BEST_DIR = "best"
METRICS_CSV = "metrics.csv"

EpochCallback = Callable[[EpochMetrics, Path | None], bool | None]


@dataclass
class FitResult:
    run_dir: Path
    history: list[dict[str, float]] = field(default_factory=list)
    best: dict[str, float] | None = None
    stopped_early: bool = False


def _better(metric: str, mode: str, new: float, old: float | None) -> bool:
    if new is None or math.isnan(new):
        return False
    if old is None or math.isnan(old):
        return True
    return new > old if mode == "max" else new < old


def _preprocessing_record(manifest_info: dict[str, Any]) -> dict[str, Any]:
    """What inference must redo to feed raw NIfTI to this model."""
    return {
        "modalities": manifest_info["modalities"],
        "channels": manifest_info["channels"],
        "labels": manifest_info["labels"],
        "label_mode": manifest_info["label_mode"],
        "num_classes": manifest_info["num_classes"],
        **manifest_info["preprocessing"],
    }


def _write_checkpoint(directory: Path, arrays: dict, state: dict) -> None:
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_arrays(tmp / "state.npz", arrays)
    write_json_atomic(tmp / "state.json", state)
    old = directory.with_name(f".{directory.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.replace(old)
    tmp.replace(directory)
    shutil.rmtree(old, ignore_errors=True)


def read_checkpoint_state(directory: Path) -> dict[str, Any]:
    return json.loads((Path(directory) / "state.json").read_text())


def fit(
    config: ExperimentConfig,
    prepared: str | Path,
    run_dir: str | Path,
    *,
    strategy: "tf.distribute.Strategy | None" = None,
    resume_from: str | Path | None = None,
    on_epoch: EpochCallback | None = None,
    metric: str = "val_dice",
    mode: str = "max",
    is_chief: bool = True,
    log: Callable[[str], None] | None = None,
) -> FitResult:
    """Train ``config`` on the prepared data for ``config.train.epochs`` epochs.

    Args:
        prepared: prepared data directory (``info.json``).
        run_dir: where the run directory is written (rank 0 only writes).
        strategy: ``None`` for one worker; a ``MultiWorkerMirroredStrategy`` for data parallelism.
        resume_from: a ``checkpoint/`` directory to continue from (optimiser state and epoch included).
        on_epoch: called after every epoch with the metrics and the checkpoint directory (rank 0)
            or ``None`` (other ranks); returning ``True`` stops training.
        metric, mode: what "best" means for ``best/``.
        is_chief: whether this process writes files.
    """
    run_dir = Path(run_dir)
    manifest = load_manifest(prepared)
    trainer = Trainer(config, manifest, strategy=strategy)
    result = FitResult(run_dir=run_dir)
    best_value: float | None = None
    if resume_from is not None:
        resume_from = Path(resume_from)
        if not (resume_from / "state.npz").is_file():
            raise TrainingError(f"{resume_from}: no checkpoint to resume from (state.npz missing)")
        trainer.load_state_arrays(load_arrays(resume_from / "state.npz"))
        state = read_checkpoint_state(resume_from)
        trainer.epoch = int(state["epoch"])
        result.history = list(state.get("history", []))
        best_value = state.get("best_value")
        result.best = state.get("best")

    if is_chief:
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(config, run_dir / "config.yaml")
    csv_path = run_dir / METRICS_CSV
    fields = list(EpochMetrics.__dataclass_fields__)
    if is_chief:
        # rewrite from the checkpoint's history: a crash after the CSV row but before the
        # checkpoint must not leave a duplicated epoch
        with open(csv_path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(result.history)

    while trainer.epoch < config.train.epochs:
        metrics = trainer.run_epoch()
        row = metrics.as_dict()
        result.history.append(row)
        value = row.get(metric)
        improved = _better(metric, mode, value, best_value)
        arrays = trainer.state_arrays()  # every rank: may be a collective
        if improved:
            best_value = value
            result.best = row
        if is_chief:
            with open(csv_path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=fields).writerow(row)
            if improved:
                best = run_dir / BEST_DIR
                tmp = run_dir / f".{BEST_DIR}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                save_arrays(tmp / "weights.npz", {k: v for k, v in arrays.items() if k.startswith("model/")})
                dump_config(config, tmp / "config.yaml")
                write_json_atomic(tmp / "preprocessing.json", _preprocessing_record(manifest.info))
                write_json_atomic(tmp / "metrics.json", row)
                shutil.rmtree(best, ignore_errors=True)
                tmp.replace(best)
            state = {
                "epoch": trainer.epoch,
                "history": result.history,
                "best_value": best_value,
                "best": result.best,
                "metric": metric,
                "mode": mode,
            }
            _write_checkpoint(run_dir / CHECKPOINT_DIR, arrays, state)
        if log:
            log(
                f"epoch {metrics.epoch:3d}/{config.train.epochs}  loss {metrics.loss:.4f}  dice {metrics.dice:.4f}  "
                f"val_loss {metrics.val_loss:.4f}  val_dice {metrics.val_dice:.4f}  "
                f"{metrics.epoch_seconds:.1f}s  {metrics.samples_per_second:.1f} samples/s"
            )
        stop = on_epoch(metrics, run_dir / CHECKPOINT_DIR if is_chief else None) if on_epoch else None
        if stop:
            result.stopped_early = True
            break
    return result
