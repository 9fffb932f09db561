"""Gradient checkpointing (``model.remat``): peak memory and step time with and without it.

Memory: each row is a fresh process that builds the 3D U-Net, runs a warm-up training step
(tracing) and a few more steps on random data, and reports:

  * the tensor memory peak: TensorFlow's allocator peak (weights, optimiser state, activations
    kept for the backward pass, gradients, workspaces), which is the figure a GPU reports. On
    the CPU the row runs with TensorFlow's BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC``) so that
    the same accounting exists there;
  * on the CPU, the host peak RSS, from a second fresh process with the default allocator, as a
    trial runs: RSS adds the Python and TensorFlow runtime and what malloc keeps after a free,
    so its relative drop is smaller;
  * the layer outputs the backward pass keeps (computed from the model's shapes, not measured):
    every layer's output without remat, only the rematerialised blocks' inputs and outputs with
    it. This is the most remat can remove; the rest of a step's memory (weight and activation
    gradients, convolution workspaces) it cannot touch, so the measured drop is read against it.

Step time: both models in one more process, their steps alternated, so that load on the host
slows both alike; the change printed is the median of the per-pair ratios, each pair's figure
beside it.

    python benchmarks/remat.py [--sizes 64,96] [--depth 3] [--filters 16] [--batch 1] [--pairs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchlib import add_out_option, write_report

# What both measuring scripts start with: TensorFlow set up as a trial sets it up, and the memory
# in use and its peak: TensorFlow's allocator on a GPU, or on the CPU when it runs the BFC
# allocator; host RSS otherwise.
PRELUDE = r"""
import os, resource, sys
from distmis.tensorflow_env import onednn_enabled
from distmis.training import configure_tensorflow
configure_tensorflow(2)  # threads as a trial sets them
import tensorflow as tf
gpu = bool(tf.config.list_physical_devices("GPU"))
allocator = "GPU:0" if gpu else "CPU:0" if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") == "true" else None

def used():
    if allocator:
        return tf.config.experimental.get_memory_info(allocator)["current"]
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def peak_used():
    if allocator:
        return tf.config.experimental.get_memory_info(allocator)["peak"]
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

# A model and its compiled training step, as a trial's custom loop runs it.
BUILD = r"""
import json, math, time
import keras, numpy as np
from distmis.config import ModelConfig, OptimizerConfig
from distmis.model import build_optimizer, build_unet, get_loss

def build(size, depth, filters, batch, remat):
    model = build_unet(ModelConfig(depth=depth, filters=filters, norm="group", groups=4, remat=bool(remat)),
                       channels=4, num_classes=1)
    opt = build_optimizer(OptimizerConfig(lr=1e-3))
    opt.build(model.trainable_variables)
    loss_fn = get_loss("dice", "binary")
    x = tf.random.normal((batch, size, size, size, 4), seed=1)
    y = tf.cast(tf.random.uniform((batch, size, size, size, 1), seed=2) > 0.7, tf.float32)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return model, step
"""

STEP = (
    BUILD
    + r"""
size, depth, filters, batch, steps, remat = (int(a) for a in sys.argv[1:7])
model, step = build(size, depth, filters, batch, remat)
probe = keras.Model(model.input, [layer.output for layer in model.layers[1:]])
specs = probe.compute_output_spec(keras.KerasTensor((batch, size, size, size, 4)))
kept = 4 * (batch * size**3 * 4 + sum(math.prod(s.shape) for s in specs))  # float32 input + layer outputs

if allocator:  # the model and optimiser are built; no step has run
    tf.config.experimental.reset_memory_stats(allocator)
step()  # trace and first step
for _ in range(steps):  # a few more: the peak of a steady step, not only the first (timed in PAIRED)
    step().numpy()
peak = peak_used()
print(json.dumps({"size": size, "remat": bool(remat),
                  "peak_bytes": peak, "kept_bytes": kept, "device": "GPU" if gpu else "CPU",
                  "onednn": onednn_enabled()}))
"""
)

# Step time, side by side: both models in one process, their steps alternated (plain, remat,
# plain, ...) so that a busy host or a clock change slows both alike; the figure is the median
# of the per-pair ratios. Each step's own time is its median over the pairs.
PAIRED = (
    BUILD
    + r"""
size, depth, filters, batch, steps = (int(a) for a in sys.argv[1:6])
plain, remat = build(size, depth, filters, batch, 0)[1], build(size, depth, filters, batch, 1)[1]
plain(); remat()  # trace and first steps
pairs = []
for _ in range(steps):
    t0 = time.perf_counter(); plain().numpy(); t1 = time.perf_counter(); remat().numpy(); t2 = time.perf_counter()
    pairs.append((t1 - t0, t2 - t1))
p, r = np.array(pairs).T
print(json.dumps({"plain_seconds": float(np.median(p)), "remat_seconds": float(np.median(r)),
                  "ratio": float(np.median(r / p)), "ratios": (r / p).round(3).tolist()}))
"""
)

# One full-resolution Conv3D's weight gradient on its own: a workspace no rematerialisation can
# remove. TensorFlow's generic CPU kernel (oneDNN off) builds an im2col buffer, 27 copies of the
# input for a 3x3x3 kernel; oneDNN's needs a few.
WORKSPACE = r"""
size, filters = int(sys.argv[1]), int(sys.argv[2])
x = tf.random.normal((1, size, size, size, filters))
w = tf.Variable(tf.random.normal((3, 3, 3, filters, filters)))

@tf.function
def grad():
    with tf.GradientTape() as tape:
        y = tf.nn.conv3d(x, w, [1] * 5, "SAME")
        loss = tf.reduce_sum(y * y)
    return tape.gradient(loss, w)

before = used()
grad()
print(peak_used() - before)
"""


def fresh_process(script: str, *args: int, tensor_peak: bool = False) -> str:
    """Run ``PRELUDE + script`` in a new Python, so each figure starts from an empty peak; its last line.

    ``tensor_peak`` runs it with TensorFlow's BFC allocator on the CPU, whose peak counts tensors only.
    """
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"} if tensor_peak else None
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + script, *map(str, args)], capture_output=True, text=True, check=True, env=env
    )
    return out.stdout.strip().splitlines()[-1]


def conv_workspace(size: int, filters: int) -> int:
    """Bytes one CPU Conv3D weight gradient at ``size``^3 x ``filters`` adds."""
    return int(fresh_process(WORKSPACE, size, filters))


def run(size: int, depth: int, filters: int, batch: int, steps: int, remat: bool) -> dict:
    """One row's memory: the allocator's tensor peak; on the CPU also host RSS with the default allocator."""
    args = (size, depth, filters, batch, steps, int(remat))
    row = json.loads(fresh_process(STEP, *args, tensor_peak=True))
    row["tensor_peak_bytes"] = row.pop("peak_bytes")
    row["rss_peak_bytes"] = None
    if row["device"] == "CPU":
        row["rss_peak_bytes"] = json.loads(fresh_process(STEP, *args))["peak_bytes"]
    return row


def paired_step_time(size: int, depth: int, filters: int, batch: int, steps: int) -> dict:
    """Plain and remat step times measured alternately in one process; ``ratio`` = median remat/plain."""
    return json.loads(fresh_process(PAIRED, size, depth, filters, batch, steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,96")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--filters", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="steps after the warm-up in each memory row")
    ap.add_argument("--pairs", type=int, default=7, help="alternated plain/remat step pairs for the step time")
    add_out_option(ap, "remat")
    args = ap.parse_args()
    report = []
    print(
        f"3D U-Net depth {args.depth}, {args.filters} filters, batch {args.batch}, group norm, 4 channels; "
        f"memory: a fresh process per row; step time: {args.pairs} alternated plain/remat step pairs in one "
        "process after traced warm-ups, medians"
    )
    print(
        f"{'size':>6} {'remat':>6} {'step s':>8} {'tensor peak GiB':>16} {'host RSS peak GiB':>18} {'kept outputs GiB':>17}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        rows = [run(size, args.depth, args.filters, args.batch, args.steps, remat) for remat in (False, True)]
        timing = paired_step_time(size, args.depth, args.filters, args.batch, args.pairs)
        rows[0]["step_seconds"], rows[1]["step_seconds"] = timing["plain_seconds"], timing["remat_seconds"]
        for r in rows:
            rss = "-" if r["rss_peak_bytes"] is None else f"{r['rss_peak_bytes'] / 2**30:.2f}"
            print(
                f"{size:>5}^3 {str(r['remat']):>6} {r['step_seconds']:8.2f} {r['tensor_peak_bytes'] / 2**30:16.2f} "
                f"{rss:>18} {r['kept_bytes'] / 2**30:17.2f}"
            )
        plain, remat = rows
        report += [{"size": size, **r} for r in rows]
        change = f"tensor peak {100 * (remat['tensor_peak_bytes'] / plain['tensor_peak_bytes'] - 1):+.0f}%"
        if plain["rss_peak_bytes"]:
            change += f", host RSS peak {100 * (remat['rss_peak_bytes'] / plain['rss_peak_bytes'] - 1):+.0f}%"
        ratios = ", ".join(f"{100 * (r - 1):+.0f}" for r in timing["ratios"])
        print(f"       remat: {change}, step time {100 * (timing['ratio'] - 1):+.0f}% (median of the pairs: {ratios})")
        removable = plain["kept_bytes"] - remat["kept_bytes"]
        saved = plain["tensor_peak_bytes"] - remat["tensor_peak_bytes"]
        print(
            f"       remat can drop {removable / 2**30:.2f} GiB of kept layer outputs "
            f"({100 * removable / plain['tensor_peak_bytes']:.0f}% of the plain tensor peak); "
            f"measured drop {saved / 2**30:.2f} GiB"
        )
        if plain["device"] == "CPU":
            tensor = size**3 * args.filters * 4
            ws = conv_workspace(size, args.filters)
            print(
                f"       one full-resolution Conv3D weight gradient alone adds {ws / 2**30:.2f} GiB of host memory "
                f"({ws / tensor:.1f}x its {tensor / 2**20:.0f} MiB input), which remat cannot remove"
            )
    kernels = {True: "oneDNN", False: "generic (oneDNN off)", None: "unknown"}[plain["onednn"]]
    print(f"device {plain['device']}; CPU kernels {kernels} (distmis sets TF_ENABLE_ONEDNN_OPTS=1 unless it is set)")
    title = f"3D U-Net depth {args.depth}, {args.filters} filters, batch {args.batch}: memory and step time with remat"
    write_report(args.out, "remat", title=title, rows=report, echo=False)


if __name__ == "__main__":
    main()
