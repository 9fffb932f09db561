"""Augmentation throughput per core at real size: distmis's TensorFlow graph ops against nnU-Net's own.

The same patch (128^3 x 4 channels, float32, with a 3-class label) is augmented over and over on one
core, side by side in one run:

- ``distmis nnU-Net-like``: ``train.augment`` with rotation 30 (nnU-Net's for a 3D patch), scale
  [0.7, 1.4] and ``nnunet_intensity`` 1 (:func:`distmis.data.augment_spatial`,
  :func:`distmis.data.augment_intensity`), then the flips, as the training pipeline applies them;
- the same inside ``tf.data`` with 2 threads (``num_parallel_calls`` 2), as the loader runs it;
- ``distmis default``: flips and the intensity scale/shift only (today's default);
- ``none``: the patch as read (the ceiling of the augmentation stage);
- ``nnU-Net v2 (batchgeneratorsv2)``: ``nnUNetTrainer.get_training_transforms`` for the same patch,
  with nnU-Net's rotation for a 3D patch (+-30 degrees), no deep supervision, run in the Python that
  has nnunetv2 (``--peer-python``, the ``peers`` extra), torch on one thread.

Each transform applies to a patch only with its chance, so a patch's time varies: each figure is
``--repeats`` patches (each its own seed) over their total time, after one warm-up (which includes
XLA's compilation). Writes ``OUT/augmentation.json`` and ``OUT/augmentation.md``.

    python benchmarks/augmentation.py --out runs/augmentation --peer-python /path/to/peer/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchlib import add_out_option, write_report

PATCH = (128, 128, 128)
CHANNELS = 4

PEER_SNIPPET = r"""
import json, sys, time, statistics
import numpy as np, torch
torch.set_num_threads(1)
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
patch, channels, repeats = tuple(json.loads(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
image = torch.from_numpy(rng.normal(size=(channels, *patch)).astype(np.float32))
seg = torch.from_numpy(rng.integers(0, 3, size=(1, *patch)).astype(np.int16))
transforms = nnUNetTrainer.get_training_transforms(
    patch, (-np.pi / 6, np.pi / 6), None, (0, 1, 2), False, foreground_labels=[1, 2]
)
transforms(image=image.clone(), segmentation=seg.clone())  # warm-up
start = time.perf_counter()
for _ in range(repeats):
    transforms(image=image.clone(), segmentation=seg.clone())
print(json.dumps({"seconds": (time.perf_counter() - start) / repeats}))
"""


def _distmis_seconds(kind: str, repeats: int) -> float:
    """Mean seconds to augment one patch on one core with distmis's TensorFlow ops."""
    import numpy as np
    import tensorflow as tf

    from distmis.data import augment, augment_intensity, augment_spatial

    rng = np.random.default_rng(0)
    image = tf.constant(rng.normal(size=(*PATCH, CHANNELS)).astype(np.float32))
    label = tf.constant(rng.integers(0, 3, size=PATCH).astype(np.uint8))

    @tf.function
    def step(seed: tf.Tensor) -> tf.Tensor:
        x, y = image, label
        if kind == "nnunet":
            x, y = augment_spatial(x, y, seed, rotation_degrees=30.0, scale=(0.7, 1.4))
        channels = tf.one_hot(tf.cast(y, tf.int32), 3)
        if kind != "none":
            x, channels = augment(x, channels, seed + 1, flip=True, intensity=0.1, noise=0.0)
        if kind == "nnunet":
            x = augment_intensity(x, seed + 3, strength=1.0)
        return tf.reduce_sum(x) + tf.reduce_sum(channels)

    for i in range(8):  # trace, and compile each XLA kernel (most draws apply some of them)
        step(tf.constant([-1 - i, 0])).numpy()
    start = time.perf_counter()
    for i in range(repeats):
        step(tf.constant([i + 1, 0])).numpy()
    return (time.perf_counter() - start) / repeats


def _pipeline_seconds(repeats: int, threads: int) -> float:
    """Mean seconds per patch of the nnU-Net-like augmentation in ``tf.data`` with ``threads``
    parallel calls on its own thread pool, the patch already in memory."""
    import numpy as np
    import tensorflow as tf

    from distmis.data import augment, augment_intensity, augment_spatial

    rng = np.random.default_rng(0)
    image = tf.constant(rng.normal(size=(*PATCH, CHANNELS)).astype(np.float32))
    label = tf.constant(rng.integers(0, 3, size=PATCH).astype(np.uint8))

    def one(i: tf.Tensor) -> tf.Tensor:
        seed = tf.stack([tf.cast(i, tf.int32), 0])
        x, y = augment_spatial(image, label, seed, rotation_degrees=30.0, scale=(0.7, 1.4))
        x, channels = augment(x, tf.one_hot(tf.cast(y, tf.int32), 3), seed + 1, flip=True, intensity=0.1, noise=0.0)
        return tf.reduce_sum(augment_intensity(x, seed + 3, strength=1.0)) + tf.reduce_sum(channels)

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    warm = tf.data.Dataset.range(8).map(one, num_parallel_calls=threads).with_options(options)
    for _ in warm:  # compile the XLA kernels
        pass
    timed = tf.data.Dataset.range(8, 8 + repeats).map(one, num_parallel_calls=threads).with_options(options)
    start = time.perf_counter()
    for _ in timed:
        pass
    return (time.perf_counter() - start) / repeats


def _peer_seconds(python: str, repeats: int) -> float | None:
    """Median seconds per patch of nnU-Net's own transforms, or None where nnunetv2 is not installed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "nnUNet_n_proc_DA": "1"}
    argv = [python, "-c", PEER_SNIPPET, json.dumps(PATCH), str(CHANNELS), str(repeats)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        print(f"nnU-Net's transforms not run: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=60, help="patches timed per row (each its own seed)")
    parser.add_argument("--peer-python", default=sys.executable, help="the Python that has nnunetv2 (peers extra)")
    add_out_option(parser, "augmentation")
    args = parser.parse_args()

    from distmis.training import configure_tensorflow

    configure_tensorflow(1)  # one core: the figures are per core
    seconds_of = {
        "distmis nnU-Net-like (rotation, scaling, nnU-Net intensity, flips)": _distmis_seconds("nnunet", args.repeats),
        "distmis nnU-Net-like in tf.data, 2 threads (per patch, both cores)": _pipeline_seconds(args.repeats, 2),
        "distmis default (flips, intensity scale/shift)": _distmis_seconds("default", args.repeats),
        "none (the patch as read)": _distmis_seconds("none", args.repeats),
        "nnU-Net v2 (batchgeneratorsv2, its default transforms)": _peer_seconds(args.peer_python, args.repeats),
    }
    rows = [
        {
            "augmentation": name,
            "patches/s": None if not seconds else 1 / seconds,
            "seconds": seconds,
        }
        for name, seconds in seconds_of.items()
    ]
    title = f"augmentation of one {'x'.join(map(str, PATCH))} x {CHANNELS} patch, one core unless said"
    write_report(args.out, "augmentation", title=title, rows=rows, data={"patch": PATCH, "channels": CHANNELS})


if __name__ == "__main__":
    main()
