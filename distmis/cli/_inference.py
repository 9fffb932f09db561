"""Options shared by ``distmis predict`` and ``distmis evaluate``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distmis.inference import PredictOptions

from distmis.cli._common import nonnegative_float, overlap_fraction, positive_float, positive_int, shape3
from distmis.exitcodes import FAILED


def add_window_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sliding window")
    g.add_argument(
        "--patch",
        type=shape3,
        default=None,
        help="cube size X,Y,Z or one int (default: the patch the model was trained on)",
    )
    g.add_argument(
        "--overlap", type=overlap_fraction, default=0.5, help="overlap of neighbouring cubes, in [0, 1) (default 0.5)"
    )
    g.add_argument(
        "--blend",
        choices=("gaussian", "average"),
        default="gaussian",
        help="how overlapping cubes are combined (default gaussian: centre voxels weigh most)",
    )
    g.add_argument(
        "--batch", type=positive_int, default=2, help="cubes per forward pass; bounds accelerator memory (default 2)"
    )
    g.add_argument(
        "--tta",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="test-time augmentation: predict every cube under the 8 mirrorings of its axes and average "
        "(nnU-Net's mirroring); about 8x the network time, which is printed (default: the model's choice: "
        "on for a finalize's final/, off for best/)",
    )
    r = p.add_argument_group("parallel cases (Ray)")
    r.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="cases predicted at once, one Ray actor each (default: 1 without a cluster, "
        "every GPU / CPU of the cluster with --address or RAY_ADDRESS)",
    )
    r.add_argument("--cpus-per-worker", type=positive_float, default=1.0, help="CPUs per Ray actor (default 1)")
    r.add_argument(
        "--gpus-per-worker",
        type=nonnegative_float,
        default=None,
        help="GPUs per Ray actor (default: 1 when the cluster has GPUs, else 0)",
    )
    r.add_argument("--address", default=None, help="Ray cluster address (default: $RAY_ADDRESS, else no Ray)")


def window_options(args: argparse.Namespace) -> PredictOptions:
    from distmis.inference import PredictOptions

    return PredictOptions(patch=args.patch, overlap=args.overlap, blend=args.blend, batch_size=args.batch, tta=args.tta)


def print_network_time(outcomes: list, tta: bool | None) -> None:
    """What the network took of the prediction time, and what its passes per cube (test-time
    mirroring, ensemble members) cost in it."""
    done = [o for o in outcomes if o.ok]
    if not done:
        return
    network = sum(o.network_seconds for o in done)
    total = sum(o.seconds for o in done)
    passes = max(o.passes for o in done)
    if passes > 1:
        one = network / passes
        print(
            f"{passes} network passes per cube (mirroring x ensemble members); network {network:.1f} s of "
            f"{total:.1f} s predicting (one pass: about {one:.1f} s of {total - network + one:.1f} s)"
        )
    else:
        print(f"network {network:.1f} s of {total:.1f} s predicting (--tta: about 8x the network time)")


def report_failures(failed: list, what: str, total: int | None = None) -> int:
    """Print the failed cases (one line each) and return the exit code: 1 when any failed."""
    if not failed:
        return 0
    print(f"distmis: error: {len(failed)} case(s) failed; nothing was written for them:", file=sys.stderr)
    for outcome in failed:
        first = (outcome.error or "").splitlines()[0] if outcome.error else "unknown error"
        print(f"  {outcome.case_id}: {first}", file=sys.stderr)
    if total is None or total > len(failed):
        print(f"the other {what} were written.", file=sys.stderr)
    return FAILED
