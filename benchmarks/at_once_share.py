"""How much one trial alone steps, in all, against every slot's trial at once: the figure init's rule
for fewer trials at once reads (:data:`distmis.data.AT_ONCE_KEPT_SHARE`).

Each repeat times the planned network as ``distmis init --budget`` does
(:func:`distmis.training.measure_recipe_step_seconds`), first with ``--slots`` trials stepping at once
on this machine's cores, then with ``--fewer`` of them on the same cores, and prints the steps in all
the fewer buy against the slots' (``fewer / at once``). Fewer trials at once run only where this is
at least the share; a figure near it on a machine whose fewer trials should run says the bar sits
inside the timing's noise there.

    python benchmarks/at_once_share.py [--repeats 4] [--patch 48 56 48] [--channels 2] [--classes 3] [--slots 2] [--fewer 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchlib import add_out_option, write_report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=4, help="pairs of timings, one after another")
    p.add_argument("--patch", type=int, nargs=3, default=[48, 56, 48])
    p.add_argument("--channels", type=int, default=2)
    p.add_argument("--classes", type=int, default=3, help="softmax outputs, background included")
    p.add_argument("--slots", type=int, default=2, help="trials at once (init's --workers)")
    p.add_argument("--fewer", type=int, default=1, help="the fewer trials at once init would time")
    add_out_option(p, "at_once_share")
    a = p.parse_args()
    from distmis.data import AT_ONCE_KEPT_SHARE
    from distmis.recipes import DISTMIS
    from distmis.training import measure_recipe_step_seconds

    depth = DISTMIS.depth(min(a.patch))
    common = {"depth": depth, "gpu": False, "patch": tuple(a.patch), "channels": a.channels, "classes": a.classes}
    rows = []
    for repeat in range(a.repeats):
        together = measure_recipe_step_seconds(DISTMIS, trials_at_once=a.slots, **common)
        fewer = measure_recipe_step_seconds(DISTMIS, trials_at_once=a.fewer, **common)
        share = (a.fewer / fewer) / (a.slots / together)
        rows.append({"repeat": repeat, "at once s": round(together, 3), "fewer s": round(fewer, 3),
                     "fewer / at once": round(share, 3)})  # fmt: skip
        print(f"  repeat {repeat}: {rows[-1]}", flush=True)
    shares = [r["fewer / at once"] for r in rows]
    title = (
        f"{a.fewer} trial(s) at once against {a.slots} on {os.cpu_count()} cores: steps in all, distmis's recipe, "
        f"depth {depth}, patch {a.patch}; fewer run where this is at least {AT_ONCE_KEPT_SHARE:.2f}"
    )
    write_report(a.out, "at_once_share", title=title, rows=rows, data={"share": AT_ONCE_KEPT_SHARE})
    print(f"fewer / at once: median {statistics.median(shares):.3f} [{min(shares):.3f}-{max(shares):.3f}]")


if __name__ == "__main__":  # the timing processes are spawned: they import this file again
    main()
