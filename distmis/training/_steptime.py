"""A training step's seconds for a planned model on this machine, measured over a few seconds of steps.

``distmis init --budget`` sizes a search (trials, epochs, steps per epoch) from the seconds one
step takes. Estimating them from a FLOP count would need a per-device throughput that nobody
knows for their CPU or GPU; real steps of the planned network on random data of the planned
patch and batch cost seconds and are right for the machine they run on. ``--step-seconds`` gives
the figure for another machine (the cluster the search will run on).

Trials that share a host's cores slow each other down beyond their thread counts (memory bandwidth,
caches, tf.data's and Python's own threads): two 1-thread trials on 2 cores stepped at 0.62 s
each where one alone stepped at 0.39 s. :func:`measure_concurrent_step_seconds` therefore times the
steps in as many processes at once as the search will run trials at once.

A machine's speed drifts for seconds at a time (other tenants of a virtual machine, the kernel's
own work): on an idle 2-core machine, the median of 3 steps ranged 0.42-0.65 s over windows of one
run whose steps were 0.47 s over a minute. A disturbance only ever slows a step, so the steps are
timed for :data:`TIMED_SECONDS` and the figure is their lower quartile (:func:`steady_step_seconds`),
which a slow spell over up to three quarters of the window does not move.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distmis.config import ModelConfig, OptimizerConfig
    from distmis.recipes import Recipe


def measure_step_samples(
    model_config: ModelConfig,
    optimizer_config: OptimizerConfig,
    *,
    patch: tuple[int, int, int],
    channels: int,
    classes: int,
    batch: int,
    seconds: float | None = None,
    ready: Any = None,
) -> list[float]:
    """The seconds of each training step timed after one warm-up step (the trace): steps for
    ``seconds`` (:data:`TIMED_SECONDS` by default), and at least :data:`MIN_TIMED_STEPS` of them.
    With ``ready`` (a barrier), the timed steps start when every process sharing it has warmed up."""
    import numpy as np
    import tensorflow as tf

    from distmis.model import build_optimizer, build_unet, deep_supervision_weights, get_loss

    model = build_unet(model_config, channels=channels, num_classes=classes)
    optimizer = build_optimizer(optimizer_config)
    mode = "binary" if classes == 1 else "multiclass"
    loss_fn = get_loss("dice_ce" if classes > 1 else "dice", mode)
    weights = deep_supervision_weights(len(model.outputs))
    scales = model_config.level_scales()
    rng = np.random.default_rng(0)
    image = tf.constant(rng.normal(size=(batch, *patch, channels)).astype(np.float32))
    label = tf.one_hot(rng.integers(0, max(classes, 2), size=(batch, *patch)), max(classes, 2))[..., -classes:]

    @tf.function
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            outputs = model(image, training=True)
            outputs = outputs if isinstance(outputs, list) else [outputs]
            loss = tf.add_n(
                [w * tf.reduce_mean(loss_fn(label[:, :: scales[i][0], :: scales[i][1], :: scales[i][2]], o))
                 for i, (w, o) in enumerate(zip(weights, outputs, strict=True))]
            )  # fmt: skip
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    step()  # the trace and the first allocation
    if ready is not None:
        ready.wait(timeout=BARRIER_SECONDS)
    window = TIMED_SECONDS if seconds is None else seconds
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < MIN_TIMED_STEPS or time.perf_counter() - began < window:
        start = time.perf_counter()
        step().numpy()
        samples.append(time.perf_counter() - start)
    return samples


def steady_step_seconds(samples: list[float]) -> float:
    """The lower quartile of a window's step seconds: the machine's own speed, which a slow spell
    over up to three quarters of the window does not move (a disturbance only ever slows a step),
    and not the minimum, so that one lucky step does not set a plan."""
    import numpy as np

    if not samples:
        raise ValueError("no step was timed")
    return float(np.quantile(samples, 0.25))


#: how long each timing process steps (a step of a few seconds still gets MIN_TIMED_STEPS)
TIMED_SECONDS = 5.0
#: the fewest steps timed, however slow a step is
MIN_TIMED_STEPS = 3

#: how long a timing process waits for the others to warm up (a trace of a large network on a CPU)
BARRIER_SECONDS = 900.0


def _timing_process(threads: int | None, kwargs: dict[str, Any], ready: Any, results: Any) -> None:
    """One of :func:`measure_concurrent_step_seconds`'s processes (spawned: TensorFlow fresh in each)."""
    from distmis.training._runtime import configure_tensorflow

    configure_tensorflow(threads)
    try:
        results.put(steady_step_seconds(measure_step_samples(**kwargs, ready=ready)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which names it
        ready.abort()
        results.put(f"{type(exc).__name__}: {exc}")


def measure_concurrent_step_seconds(
    model_config: ModelConfig,
    optimizer_config: OptimizerConfig,
    *,
    processes: int,
    threads: int | None,
    patch: tuple[int, int, int],
    channels: int,
    classes: int,
    batch: int,
) -> float:
    """A step's seconds while ``processes`` trials of ``threads`` threads each step at once: the
    median over the processes of each one's :func:`steady_step_seconds`.

    Raises:
        RuntimeError: a timing process failed or did not answer in time (naming why).
    """
    import multiprocessing
    import statistics

    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(processes), ctx.Queue()
    kwargs = {
        "model_config": model_config,
        "optimizer_config": optimizer_config,
        "patch": patch,
        "channels": channels,
        "classes": classes,
        "batch": batch,
    }
    children = [ctx.Process(target=_timing_process, args=(threads, kwargs, ready, results)) for _ in range(processes)]
    for child in children:
        child.start()
    try:
        answers = [results.get(timeout=2 * BARRIER_SECONDS) for _ in children]
    except Exception:  # noqa: BLE001 - queue.Empty: a process died or hung
        raise RuntimeError(f"timing a training step: no answer from {processes} processes in time") from None
    finally:
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
    failed = [a for a in answers if isinstance(a, str)]
    if failed:
        raise RuntimeError(f"timing a training step failed: {failed[0]}")
    return float(statistics.median(answers))


def measure_recipe_step_seconds(
    recipe: Recipe,
    *,
    depth: int,
    trials_at_once: int,
    gpu: bool,
    patch: tuple[int, int, int],
    channels: int,
    classes: int,
    changes: dict[str, Any] | None = None,
    batch: int = 2,
) -> float:
    """A step of ``recipe``'s network at ``depth`` (with ``changes`` to its ``model`` section), timed as
    a search of ``trials_at_once`` trials will step it: on a CPU, that many processes at once, each
    with its share of the cores; on a GPU, one process, since each trial has its own GPU.

    One function, so that ``distmis init``'s plan and the benchmarks that explain it time the same
    thing. ``batch`` defaults to the 2 patches init plans.

    Raises:
        RuntimeError: a timing process failed or did not answer in time (naming why).
    """
    import os

    from distmis.config import ModelConfig, OptimizerConfig

    cores = os.cpu_count() or 1
    return measure_concurrent_step_seconds(
        ModelConfig(**{**recipe.model, "depth": depth, **(changes or {})}),
        OptimizerConfig(**recipe.optimizer),
        processes=1 if gpu else min(trials_at_once, cores),
        threads=None if gpu else max(1, cores // trials_at_once),
        patch=patch,
        channels=channels,
        classes=classes,
        batch=batch,
    )


__all__ = [
    "MIN_TIMED_STEPS",
    "TIMED_SECONDS",
    "measure_concurrent_step_seconds",
    "measure_recipe_step_seconds",
    "measure_step_samples",
    "steady_step_seconds",
]
