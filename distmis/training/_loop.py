"""The one training loop, for every parallelism mode.

A Keras 3 custom training loop against ``tf.distribute.Strategy``: the default strategy for a
single worker, ``MultiWorkerMirroredStrategy`` for a data-parallel trial. Keras 3's
``model.fit`` fails under ``MultiWorkerMirroredStrategy`` (see Ray's and TensorFlow's issue
trackers), and keeping one loop for both modes is what makes the parallelism comparison
measure parallelism rather than two code paths.

Per-example losses are averaged over the *global* batch (``tf.nn.compute_average_loss``) so
that summing gradients over replicas gives the gradient of the global-batch mean; metrics
are sums over examples reduced with ``strategy.reduce(SUM)`` and divided at the end, so they
are the global values, not one worker's shard.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmis.data import Manifest, eval_batches, make_dataset
from distmis.exceptions import TrainingError
from distmis.files import atomic_file
from distmis.labels import class_names, class_values
from distmis.metrics import DICE, IOU, VAL_DICE, VAL_IOU, VAL_LOSS, EpochMetrics, class_metric, class_metrics
from distmis.model import (
    build_optimizer,
    build_unet,
    class_scores,
    deep_supervision_weights,
    full_resolution,
    get_loss,
    learning_rate_schedule,
    resolve_loss,
)
from distmis.training._runtime import configured_threads

#: the cubes' overlap when validation runs the sliding window (``predict``'s default)
VALIDATION_OVERLAP = 0.5

if TYPE_CHECKING:
    import tensorflow as tf

    from distmis.config import ExperimentConfig


class Trainer:
    """Builds the model, optimiser and input pipelines of one trial inside ``strategy``'s scope.

    Args:
        config: the trial's full configuration.
        manifest: the prepared dataset.
        strategy: ``None`` for the default (single-worker) strategy.
    """

    def __init__(
        self, config: ExperimentConfig, manifest: Manifest, *, strategy: tf.distribute.Strategy | None = None
    ) -> None:
        import keras
        import tensorflow as tf

        self.config = config
        self.manifest = manifest
        self.strategy = strategy or tf.distribute.get_strategy()
        resolver = getattr(self.strategy, "cluster_resolver", None)
        self.num_workers = 1
        self.worker_index = 0
        if resolver is not None and resolver.cluster_spec().as_dict():
            self.num_workers = len(resolver.cluster_spec().as_dict().get("worker", [None]))
            self.worker_index = int(resolver.task_id or 0)
        self.replicas = self.strategy.num_replicas_in_sync
        tc = config.train
        self.global_batch = tc.batch_size_per_replica * self.replicas
        n_train = manifest.num_cases("train")
        if n_train < self.global_batch:
            raise TrainingError(
                f"the training split has {n_train} cases, fewer than one global batch of {self.global_batch} "
                f"({tc.batch_size_per_replica} per replica x {self.replicas} replicas)"
            )
        self.steps_per_epoch = tc.steps_per_epoch or max(1, n_train // self.global_batch)
        self.n_val = manifest.num_cases("val")
        if tc.patch is not None and any(p > s for p, s in zip(tc.patch, manifest.info.shape, strict=True)):
            raise TrainingError(
                f"train.patch {list(tc.patch)} is larger than the prepared volumes {list(manifest.info.shape)}"
            )

        keras.mixed_precision.set_dtype_policy(tc.precision)
        keras.utils.set_random_seed(tc.seed)
        scale = self.replicas if tc.lr_scaling == "linear" else 1
        self.peak_lr = config.optimizer.lr * scale
        lr = learning_rate_schedule(
            kind=tc.lr_schedule,
            peak=self.peak_lr,
            # Goyal et al. (2017): a scaled rate warms up from the single-worker one; otherwise from 0
            start=config.optimizer.lr if scale != 1 else 0.0,
            warmup_steps=tc.warmup_epochs * self.steps_per_epoch,
            total_steps=tc.epochs * self.steps_per_epoch,
        )
        mode = manifest.info.label_mode
        self.exclusive = mode == "multiclass"  # softmax: background channel excluded from scores
        names = class_names(manifest.info.label_names, mode, manifest.info.num_classes, manifest.info.regions)
        self.class_count = len(names)
        # a multi-class model with regions configured is also scored per region (from its labels)
        self.metric_regions: list[list[int]] = []
        if mode == "multiclass" and manifest.info.regions:
            from distmis.labels import metric_suffix

            index = {v: c for c, v in enumerate(class_values(manifest.info.label_names, manifest.info.num_classes))}
            for region, values in manifest.info.regions.items():
                if all(v in index for v in values):  # scored on the classes that stand for its values
                    self.metric_regions.append([index[v] for v in values])
                    names.append(metric_suffix(region))
        self.score_names = names
        with self.strategy.scope():
            self.model = build_unet(
                config.model,
                channels=manifest.info.channels,
                num_classes=manifest.info.num_classes,
                activation="softmax" if self.exclusive else "sigmoid",
            )
            self.eval_model = full_resolution(self.model)  # validation's: the full-resolution head
            optimizer = build_optimizer(config.optimizer, learning_rate=lr)
            if tc.precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            self.optimizer = optimizer
            self.optimizer.build(self.model.trainable_variables)
        keras.mixed_precision.set_dtype_policy("float32")  # do not leak into later trials of this process

        self._loss_fn = get_loss(resolve_loss(tc.loss, mode), mode)
        self._train_iter = iter(self.strategy.distribute_datasets_from_function(self._train_dataset_fn))
        self.val_patches = self._validation_patches()  # 0: whole cases
        self._val_steps = self._validation_steps()
        self._train_step = self._make_train_step()
        self._eval_step = self._make_eval_step()
        self.epoch = 0

    # ------------------------------------------------------------------ input
    def _train_dataset_fn(self, ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        tc = self.config.train
        return make_dataset(
            self.manifest,
            "train",
            batch_size=ctx.get_per_replica_batch_size(self.global_batch),
            training=True,
            patch=tc.patch,
            augment_config=tc.augment,
            seed=tc.seed,
            num_shards=ctx.num_input_pipelines,
            shard_index=ctx.input_pipeline_id,
            threads=configured_threads(),
            foreground_oversampling=tc.foreground_oversampling,
        )

    def _val_dataset_fn(self, ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = ctx.get_per_replica_batch_size(self.global_batch)
        replicas_per_pipeline = max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        return make_dataset(
            self.manifest,
            "val",
            batch_size=per_replica,
            training=False,
            num_shards=ctx.num_input_pipelines,
            shard_index=ctx.input_pipeline_id,
            pad_to_batches=self._val_steps * replicas_per_pipeline,
            threads=configured_threads(),
            patch=self.config.train.patch,
            seed=self.config.train.seed,
            validation_patches=self.val_patches,
        )

    def _validation_steps(self) -> int:
        """Evaluation batches per worker; one input pipeline per worker, each step consuming one
        per-replica batch per local replica."""
        if not self.n_val:
            return 0
        per_worker_batch = self.config.train.batch_size_per_replica * max(1, self.replicas // self.num_workers)
        return eval_batches(self.n_val * max(1, self.val_patches), self.num_workers, per_worker_batch)

    def _validation_patches(self) -> int:
        """Crops per validation case (0: whole cases by the sliding window)."""
        tc = self.config.train
        if tc.validation != "patch" or tc.patch is None or tuple(tc.patch) == tuple(self.manifest.info.shape):
            return 0
        return tc.validation_patches

    # ------------------------------------------------------------------ steps
    def _make_train_step(self):  # noqa: ANN202
        import tensorflow as tf

        model, optimizer, strategy, loss_fn, gb = (
            self.model,
            self.optimizer,
            self.strategy,
            self._loss_fn,
            self.global_batch,
        )
        scaled = self.config.train.precision == "mixed_float16"
        exclusive, classes = self.exclusive, self.class_count
        # nnU-Net's deep supervision: output i against the labels taken at its level's voxel step along
        # each axis (nearest neighbour, as nnU-Net down-samples them), weighted
        heads = deep_supervision_weights(len(model.outputs))
        scales = self.config.model.level_scales()

        def supervised_loss(label: tf.Tensor, outputs: Any) -> tf.Tensor:
            if len(heads) == 1:
                return loss_fn(label, outputs)
            # the lowest head's term too, at weight 0: its variables then get a (zero) gradient, as
            # Keras expects of every trainable variable
            terms = [
                w * loss_fn(label[:, :: scales[i][0], :: scales[i][1], :: scales[i][2], :], out)
                for i, (w, out) in enumerate(zip(heads, outputs, strict=True))
            ]
            return tf.add_n(terms)

        def step(image: tf.Tensor, label: tf.Tensor, weight: tf.Tensor) -> tuple[tf.Tensor, ...]:
            with tf.GradientTape() as tape:
                outputs = model(image, training=True)
                pred = outputs if len(heads) == 1 else outputs[0]
                per_example = supervised_loss(label, outputs) * weight
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=gb)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
                to_diff = optimizer.scale_loss(loss) if scaled else loss
            grads = tape.gradient(to_diff, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            dice = tf.reduce_mean(class_scores(label, pred, exclusive)[0][:, : max(classes, 1)], axis=-1)
            return tf.reduce_sum(per_example), tf.reduce_sum(dice * weight), tf.reduce_sum(weight)

        @tf.function
        def train_step(iterator):  # noqa: ANN001, ANN202
            out = strategy.run(step, args=next(iterator))
            return [strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None) for t in out]

        return train_step

    def _make_eval_step(self):  # noqa: ANN202
        import tensorflow as tf

        strategy, loss_fn = self.strategy, self._loss_fn
        exclusive, regions, classes = self.exclusive, self.metric_regions, max(self.class_count, 1)

        window = self._validation_window()

        def step(image: tf.Tensor, label: tf.Tensor, weight: tf.Tensor) -> tuple[tf.Tensor, ...]:
            pred = window(image, label)
            dice, iou = class_scores(label, pred, exclusive, regions)  # [batch, classes (+ regions)]
            w = weight[:, tf.newaxis]
            return (
                tf.reduce_sum(loss_fn(label, pred) * weight),
                tf.reduce_sum(tf.reduce_mean(dice[:, :classes], axis=-1) * weight),
                tf.reduce_sum(tf.reduce_mean(iou[:, :classes], axis=-1) * weight),
                tf.reduce_sum(weight),
                # per-class sums over examples, reduced over every replica like the rest: the
                # global value, not one worker's shard
                tf.reduce_sum(dice * w, axis=0),
                tf.reduce_sum(iou * w, axis=0),
            )

        @tf.function
        def eval_step(iterator):  # noqa: ANN001, ANN202
            out = strategy.run(step, args=next(iterator))
            return [strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None) for t in out]

        return eval_step

    def _validation_window(self) -> Any:
        """(volumes, labels) -> the model's output over each whole volume, cube by cube.

        Validation runs the sliding window of ``predict`` (same cubes, same Gaussian blend) with the
        training patch, so that its memory is bounded by one cube per volume and its Dice is the
        one ``predict`` gives. With no patch (whole-volume training) it is one cube: the volume.
        """
        import tensorflow as tf

        from distmis.model import cube_origins, gaussian_weight

        model, shape = self.eval_model, self.manifest.info.shape
        patch = tuple(self.config.train.patch or shape)
        if patch == tuple(shape) or self.val_patches:  # a whole volume, or patches: one forward pass
            return lambda image, label: model(image, training=False)
        origins = cube_origins(shape, patch, VALIDATION_OVERLAP)  # type: ignore[arg-type]
        weight = gaussian_weight(patch)  # type: ignore[arg-type]
        norm = np.zeros(shape, np.float32)
        for x, y, z in origins:
            norm[x : x + patch[0], y : y + patch[1], z : z + patch[2]] += weight
        starts = tf.constant(origins, tf.int32)
        cube_weight = tf.constant(weight)[tf.newaxis, ..., tf.newaxis]
        inverse_norm = tf.constant(1.0 / norm)[tf.newaxis, ..., tf.newaxis]
        size = tf.constant(shape, tf.int32)

        def whole(image: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
            def add_cube(i: tf.Tensor, total: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                begin = starts[i]
                cube = tf.slice(image, tf.concat([[0], begin, [0]], 0), [-1, *patch, -1])
                out = tf.cast(model(cube, training=False), tf.float32) * cube_weight
                around = tf.stack([begin, size - begin - tf.constant(patch, tf.int32)], axis=1)
                return i + 1, total + tf.pad(out, tf.concat([[[0, 0]], around, [[0, 0]]], 0))

            total = tf.zeros_like(label, tf.float32)
            _, total = tf.while_loop(
                lambda i, _: i < len(origins),
                add_cube,
                [tf.constant(0), total],
                # in a traced step the batch and channel sizes are unknown; the volume's are not
                shape_invariants=[tf.TensorShape([]), tf.TensorShape([None, *shape, None])],
            )
            return total * inverse_norm

        return whole

    # ------------------------------------------------------------------ epochs
    def current_lr(self) -> float:
        opt = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        lr = opt.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    def train_epoch(self) -> tuple[float, float, float]:
        """Run ``steps_per_epoch`` steps; returns (mean loss, mean dice, seconds)."""
        start = time.perf_counter()
        totals = np.zeros(3)
        for _ in range(self.steps_per_epoch):
            totals += [float(t) for t in self._train_step(self._train_iter)]
        seconds = time.perf_counter() - start
        n = max(totals[2], 1.0)
        return totals[0] / n, totals[1] / n, seconds

    def evaluate(self) -> tuple[dict[str, float], dict[str, float]]:
        """Global validation metrics over every validation case (each counted once), and the
        per-class / per-region ones (``val_dice_<name>``, ``val_iou_<name>``)."""
        names = self.score_names
        if not self._val_steps:
            nan = math.nan
            return {VAL_LOSS: nan, VAL_DICE: nan, VAL_IOU: nan}, dict.fromkeys(class_metrics(names), nan)
        it = iter(self.strategy.distribute_datasets_from_function(self._val_dataset_fn))
        totals = np.zeros(4)
        per_class = np.zeros((2, len(names) or 1))
        for _ in range(self._val_steps):
            out = self._eval_step(it)
            totals += [float(t) for t in out[:4]]
            per_class += np.stack([np.asarray(out[4]), np.asarray(out[5])])
        n = max(totals[3], 1.0)
        classes = {}
        for i, name in enumerate(names):
            classes[class_metric(DICE, name)] = float(per_class[0, i] / n)
            classes[class_metric(IOU, name)] = float(per_class[1, i] / n)
        return {VAL_LOSS: totals[0] / n, VAL_DICE: totals[1] / n, VAL_IOU: totals[2] / n}, classes

    def run_epoch(self) -> EpochMetrics:
        start = time.perf_counter()
        loss, dice, train_seconds = self.train_epoch()
        val_start = time.perf_counter()
        val, classes = self.evaluate()
        val_seconds = time.perf_counter() - val_start
        self.epoch += 1
        return EpochMetrics(
            epoch=self.epoch,
            loss=loss,
            dice=dice,
            lr=self.current_lr(),
            epoch_seconds=time.perf_counter() - start,
            train_seconds=train_seconds,
            samples_per_second=self.steps_per_epoch * self.global_batch / max(train_seconds, 1e-9),
            finished_at=time.time(),
            val_seconds=val_seconds,
            classes=classes,
            **val,
        )

    # ------------------------------------------------------------------ state
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Model and optimiser variables as numpy arrays, keyed by variable path.

        Must be called on *every* worker: reading a synchronised (e.g. batch-norm) variable
        under ``MultiWorkerMirroredStrategy`` is a collective, so a rank-0-only read deadlocks.
        """
        arrays = {f"model/{v.path}": np.asarray(v.numpy()) for v in self.model.weights}
        arrays.update({f"optimizer/{key}": np.asarray(v.numpy()) for key, v in optimizer_variables(self.optimizer)})
        return arrays

    def load_state_arrays(
        self, arrays: dict[str, np.ndarray], *, with_optimizer: bool = True, source: str = "checkpoint"
    ) -> None:
        """Assign saved arrays by variable path, checking every name and shape first.

        Raises:
            TrainingError: a variable is missing, extra or of another shape (naming it), e.g.
                a checkpoint written for another model configuration.
        """
        assign_by_path(self.model.weights, arrays, prefix="model/", source=source)
        if with_optimizer and any(k.startswith("optimizer/") for k in arrays):
            by_key = dict(optimizer_variables(self.optimizer))
            keyed = {k.removeprefix("optimizer/"): v for k, v in arrays.items() if k.startswith("optimizer/")}
            if set(keyed) == set(by_key) and all(by_key[k].shape == keyed[k].shape for k in keyed):
                for key, var in by_key.items():
                    var.assign(keyed[key])

    def model_weights(self) -> list[np.ndarray]:
        return [np.asarray(v.numpy()) for v in self.model.trainable_weights]


def optimizer_variables(optimizer: Any) -> list[tuple[str, Any]]:
    """``(key, variable)`` of an optimiser, with keys independent of Keras' auto-numbered names
    (``adam``, ``adam_1``, ...): the outer optimiser's prefix becomes ``opt``, a wrapped one's ``inner``."""
    prefixes = {optimizer.name: "opt"}
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        prefixes[inner.name] = "inner"
    out = []
    for var in optimizer.variables:
        head, _, rest = var.path.partition("/")
        out.append((f"{prefixes.get(head, head)}/{rest}" if rest else var.path, var))
    return out


def assign_by_path(variables: list[Any], arrays: dict[str, np.ndarray], *, prefix: str, source: str) -> None:
    """Assign ``arrays[prefix + variable.path]`` to every variable after checking names and shapes.

    Positional keys (``model/0000``, written before version 0.2) are still read, in order.
    """
    saved = {k.removeprefix(prefix): v for k, v in arrays.items() if k.startswith(prefix)}
    if saved and all(k.isdigit() for k in saved):  # the old positional format
        ordered = [saved[k] for k in sorted(saved)]
        if len(ordered) != len(variables):
            raise TrainingError(
                f"{source}: holds {len(ordered)} variables, the configured model has "
                f"{len(variables)}: was it written for another model configuration?"
            )
        saved = {v.path: a for v, a in zip(variables, ordered, strict=True)}
    wanted = {v.path: v for v in variables}
    missing = sorted(set(wanted) - set(saved))
    extra = sorted(set(saved) - set(wanted))
    if missing or extra:
        raise TrainingError(
            f"{source}: its variables do not match the configured model (missing {missing[:3]}"
            f"{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]}{'...' if len(extra) > 3 else ''}): "
            "was it written for another model configuration?"
        )
    for path, var in wanted.items():
        if tuple(var.shape) != saved[path].shape:
            raise TrainingError(
                f"{source}: variable {path} has shape {saved[path].shape}, the configured model "
                f"expects {tuple(var.shape)}"
            )
    for path, var in wanted.items():
        var.assign(saved[path])


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write arrays to ``path`` (``.npz``) atomically."""
    with atomic_file(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy types the keyword arrays as allow_pickle


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Read an ``.npz`` written by :func:`save_arrays`.

    Raises:
        TrainingError: the file is missing, truncated or not an array archive (naming it).
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as exc:  # noqa: BLE001 - numpy raises BadZipFile, ValueError, EOFError, OSError... for a damaged file
        raise TrainingError(f"{path}: cannot read the saved arrays ({type(exc).__name__}: {exc})") from None
