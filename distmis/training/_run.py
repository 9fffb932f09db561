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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmis.config import ExperimentConfig, dump_config
from distmis.data import ModelPreprocessing, fold_view, load_manifest, pipeline_errors
from distmis.exceptions import TrainingError
from distmis.files import (
    atomic_directory,
    atomic_file,
    ensure_directory,
    open_nofollow,
    write_json_atomic,
    write_text_atomic,
)
from distmis.metrics import (
    DICE,
    LOSS,
    VAL_DICE,
    VAL_LOSS,
    EpochMetrics,
    base_fields,
    class_metric,
    class_metrics,
)
from distmis.schema import RunFile
from distmis.training._loop import Trainer, load_arrays, save_arrays

if TYPE_CHECKING:
    import tensorflow as tf

CHECKPOINT_DIR = "checkpoint"

EpochCallback = Callable[[EpochMetrics, Path | None], bool | None]


@dataclass
class FitResult:
    run_dir: Path
    history: list[dict[str, float]] = field(default_factory=list)
    best: dict[str, float] | None = None
    stopped_early: bool = False


def _better(metric: str, mode: str, new: float | None, old: float | None) -> bool:
    if new is None or math.isnan(new):
        return False
    if old is None or math.isnan(old):
        return True
    return new > old if mode == "max" else new < old


def _nonfinite_weights(arrays: dict[str, Any]) -> int:
    """How many of the model's weight arrays hold a NaN or an infinity (optimizer state left out)."""
    return sum(
        1
        for name, value in arrays.items()
        if name.startswith("model/")
        and np.issubdtype(np.asarray(value).dtype, np.floating)
        and not np.isfinite(value).all()
    )


def _write_checkpoint(directory: Path, arrays: dict, state: dict) -> None:
    with atomic_directory(directory, command="train (checkpoint)", inside_own_output=True) as tmp:
        save_arrays(tmp / "state.npz", arrays)
        write_json_atomic(tmp / "state.json", state)


def read_checkpoint_state(directory: Path) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint (epoch, history, best).

    Raises:
        TrainingError: missing or unreadable, naming the file.
    """
    path = Path(directory) / "state.json"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainingError(f"{path}: cannot read the checkpoint state ({exc})") from None
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("epoch"), int)
        or not isinstance(state.get("history", []), list)
    ):
        raise TrainingError(f"{path}: not a distmis checkpoint state (expected an object with an integer 'epoch')")
    return state


class RunSession:
    """A training run advanced one epoch at a time, writing its run directory as it goes.

    ``fit`` loops over it; the Tune trainable calls :meth:`step` once per Tune iteration and
    reuses its process for the next trial (a new ``RunSession`` per trial, same TensorFlow).

    Args:
        prepared: prepared data directory (``info.json``).
        run_dir: where the run directory is written (by the chief only).
        strategy: ``None`` for one worker; a ``MultiWorkerMirroredStrategy`` for data parallelism.
        resume_from: a ``checkpoint/`` directory to continue from (optimiser state and epoch included).
        metric, mode: what "best" means for ``best/``.
        is_chief: whether this process writes files.
        keep_until: Unix time after which the chief keeps no epoch but the first (a search's time
            budget): an epoch that ends later is not written, the last kept one is returned again,
            and the run is done. Only the chief decides, on its own clock: the group's answer is
            the chief's, so its workers never disagree on whether to take another step.
    """

    def __init__(
        self,
        config: ExperimentConfig,
        prepared: str | Path,
        run_dir: str | Path,
        *,
        strategy: tf.distribute.Strategy | None = None,
        resume_from: str | Path | None = None,
        metric: str = VAL_DICE,
        mode: str = "max",
        is_chief: bool = True,
        keep_until: float | None = None,
    ) -> None:
        self.config = config
        self.keep_until = keep_until
        self._closed = False  # an epoch ended after keep_until: nothing more is kept
        self.run_dir = Path(run_dir)
        self.metric, self.mode, self.is_chief = metric, mode, is_chief
        self.manifest = load_manifest(prepared)
        fold = config.data.fold
        if fold is not None:  # a finalize trial: the fold's train and validation cases
            self.manifest = fold_view(self.manifest, fold.index, fold.folds, fold.seed)
        self.trainer = Trainer(config, self.manifest, strategy=strategy)
        self.history: list[dict[str, float]] = []
        self.best: dict[str, float] | None = None
        self.best_value: float | None = None
        self._single_worker = strategy is None
        self._fields = base_fields() + class_metrics(self.trainer.score_names)
        self._unreported: list[dict[str, float]] = []
        self._csv_matches_history = False
        if resume_from is not None:
            self.restore(resume_from)  # first: a checkpoint that does not fit changes nothing on disk
        if is_chief:
            ensure_directory(self.run_dir, what="run directory")
            dump_config(config, self.run_dir / RunFile.CONFIG)

    def write_history(self) -> None:
        """Write metrics.csv from the history (restored, or empty): after a restore the CSV
        matches the checkpoint exactly (a crash after a row but before its checkpoint leaves no
        duplicated epoch).

        Done by the first :meth:`step`, not when the session is set up. Why: Tune may set a
        trial up on a new actor and then hand it to an actor of its own that came free (actor
        reuse); the first actor's set-up still runs, and must not rewrite the CSV the other
        one is appending to (seen: a finalize fold's metrics.csv left with its header only).
        Only the actor Tune steps writes. ``fit`` and ``distmis train`` call it first. A search's
        summary reads the file as "this trial's set-up ended" (``began_training``).
        """
        if self._csv_matches_history or not self.is_chief:
            return
        with atomic_file(self.run_dir / RunFile.METRICS) as tmp, open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=self._fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.history)
        self._csv_matches_history = True

    @property
    def epoch(self) -> int:
        return self.trainer.epoch

    @property
    def done(self) -> bool:
        """Every epoch trained *and* reported, or the time to keep one is over."""
        return (self._closed or self.trainer.epoch >= self.config.train.epochs) and not self._unreported

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINT_DIR

    def restore(
        self, checkpoint: str | Path, *, reported_epochs: int | None = None, prefer_own: bool | None = None
    ) -> None:
        """Continue from ``checkpoint`` — or from this run directory's own checkpoint when that
        one is newer (``prefer_own``; by default for a single worker, whose run directory is
        its own; every worker of a group passes it, reading the chief's shared directory). Tune may hand back a checkpoint one epoch older than
        the run directory's when its driver died (or the search was interrupted) between the
        two: nothing is then trained twice.

        Epochs that were trained but never reported (those after ``reported_epochs``, by
        default the epoch of ``checkpoint``) are handed out again by the next :meth:`step`
        calls, without training, so Tune and MLflow see every epoch exactly once.
        """
        checkpoint = Path(checkpoint)
        if not (checkpoint / "state.npz").is_file():
            raise TrainingError(f"{checkpoint}: no checkpoint to resume from (state.npz missing)")
        given_epoch = int(read_checkpoint_state(checkpoint)["epoch"])
        own = self.checkpoint_dir
        if (
            (self._single_worker if prefer_own is None else prefer_own)
            and own != checkpoint
            and (own / "state.npz").is_file()
            and read_checkpoint_state(own)["epoch"] > given_epoch
        ):
            checkpoint = own
        state = read_checkpoint_state(checkpoint)
        self.trainer.load_state_arrays(load_arrays(checkpoint / "state.npz"), source=str(checkpoint / "state.npz"))
        self.trainer.epoch = int(state["epoch"])
        self.history = list(state.get("history", []))
        self.best_value = state.get("best_value")
        self.best = state.get("best")
        reported = given_epoch if reported_epochs is None else reported_epochs
        self._unreported = [row for row in self.history if int(row["epoch"]) > reported]
        self._csv_matches_history = False  # rewritten by the next step (see write_history)

    def step(self) -> EpochMetrics:
        """Train one epoch, validate, and write the CSV row, best weights and checkpoint.

        Epochs restored but never reported come first, one per call, without training; on a
        finished run it trains nothing and returns the last epoch's metrics again.
        """
        self.write_history()
        if self._unreported:
            return EpochMetrics.from_dict(self._unreported.pop(0))
        if self.done and self.history:
            return EpochMetrics.from_dict(self.history[-1])
        with pipeline_errors():  # a case that cannot be read: distmis's one line, not TensorFlow's traceback
            metrics = self.trainer.run_epoch()
        arrays = self.trainer.state_arrays()  # every rank: may be a collective
        if self.is_chief and self.keep_until is not None and time.time() > self.keep_until and self.history:
            # too late to reach the search's records: kept, these weights would be a best/ no record names
            # (a first epoch is kept all the same: a trial Tune heard from then always has weights)
            self._closed = True
            return EpochMetrics.from_dict(self.history[-1])
        metrics.nonfinite_weights = float(_nonfinite_weights(arrays))
        row = metrics.as_dict()
        self.history.append(row)
        value = row.get(self.metric)
        # diverged weights are never the best, whatever their (constant-prediction) score says
        improved = not metrics.nonfinite_weights and _better(self.metric, self.mode, value, self.best_value)
        if improved:
            self.best_value, self.best = value, row
        if self.is_chief:
            with open_nofollow(self.run_dir / RunFile.METRICS, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self._fields, extrasaction="ignore").writerow(row)
            if improved:
                self._write_best(arrays, row)
            state = {
                "epoch": self.trainer.epoch,
                "history": self.history,
                "best_value": self.best_value,
                "best": self.best,
                "metric": self.metric,
                "mode": self.mode,
            }
            _write_checkpoint(self.checkpoint_dir, arrays, state)
        return metrics

    def _write_best(self, arrays: dict, row: dict[str, float]) -> None:
        with atomic_directory(
            self.run_dir / RunFile.BEST_MODEL_DIR, command="train (best model)", inside_own_output=True
        ) as tmp:
            save_arrays(tmp / RunFile.WEIGHTS, {k: v for k, v in arrays.items() if k.startswith("model/")})
            dump_config(self.config, tmp / RunFile.CONFIG)
            record = ModelPreprocessing.of_prepared(self.manifest.info)
            write_text_atomic(tmp / RunFile.PREPROCESSING, record.model_dump_json(indent=1, exclude_none=True) + "\n")
            write_json_atomic(tmp / "metrics.json", row)


def format_epoch(m: EpochMetrics, epochs: int) -> str:
    values = m.as_dict()
    shown = [LOSS, DICE, VAL_LOSS, VAL_DICE]
    return (
        f"epoch {m.epoch:3d}/{epochs}  "
        + "  ".join(f"{k} {values[k]:.4f}" for k in shown)
        + f"  {m.epoch_seconds:.1f}s  {m.samples_per_second:.1f} samples/s"
        + "".join(f"  {k} {v:.4f}" for k, v in m.classes.items() if k.startswith(class_metric(DICE, "")))
    )


def fit(
    config: ExperimentConfig,
    prepared: str | Path,
    run_dir: str | Path,
    *,
    strategy: tf.distribute.Strategy | None = None,
    resume_from: str | Path | None = None,
    on_epoch: EpochCallback | None = None,
    metric: str = VAL_DICE,
    mode: str = "max",
    is_chief: bool = True,
    log: Callable[[str], None] | None = None,
) -> FitResult:
    """Train ``config`` for ``config.train.epochs`` epochs (see :class:`RunSession` for the arguments).

    ``on_epoch`` is called after every epoch with the metrics and the checkpoint directory
    (``None`` on non-chief workers); returning ``True`` stops training.
    """
    session = RunSession(
        config,
        prepared,
        run_dir,
        strategy=strategy,
        resume_from=resume_from,
        metric=metric,
        mode=mode,
        is_chief=is_chief,
    )
    result = FitResult(run_dir=session.run_dir)
    session.write_history()
    while not session.done:
        metrics = session.step()
        if log:
            log(format_epoch(metrics, config.train.epochs))
        if on_epoch and on_epoch(metrics, session.checkpoint_dir if is_chief else None):
            result.stopped_early = True
            break
    result.history, result.best = session.history, session.best
    return result
