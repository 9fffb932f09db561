"""A training step's seconds for distmis's recipe with one part of nnU-Net's changed at a time.

Only a part that changes the step's cost changes what a time budget buys, so this says which of
nnU-Net's parts an ablation at equal wall time must give fewer steps. Each network is timed as
``distmis init --budget`` times one (:func:`distmis.training.measure_recipe_step_seconds`): as many
processes stepping at once as trials will (``--processes``), each with its share of the cores.

    python benchmarks/step_parts.py [--patch 48 56 48] [--channels 1] [--classes 3] [--processes 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from benchlib import add_out_option, write_report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: one part each (nnU-Net's, or the group norm distmis's recipe had before instance), as the keys of
#: distmis's ``model`` section they set
PARTS: dict[str, dict[str, Any]] = {
    "nothing changed": {},
    "group norm (4 groups)": {"norm": "group", "groups": 4},
    "leaky ReLU": {"activation": "leaky_relu"},
    "strided down-sampling": {"downsample": "strided"},
    "deep supervision": {"deep_supervision": True},
    "one level deeper": {"depth_delta": 1},
    "16 filters": {"filters": 16},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--patch", type=int, nargs=3, default=[48, 56, 48])
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=3, help="softmax outputs, background included")
    p.add_argument("--processes", type=int, default=2, help="trials stepping at once")
    add_out_option(p, "step_parts")
    a = p.parse_args()
    from distmis.recipes import DISTMIS
    from distmis.training import measure_recipe_step_seconds

    cores = os.cpu_count() or 1
    depth = DISTMIS.depth(min(a.patch))
    title = f"distmis's recipe, depth {depth}, patch {a.patch}, {a.processes} process(es) at once on {cores} cores"
    rows = []
    for name, part in PARTS.items():
        change = dict(part)
        seconds = measure_recipe_step_seconds(
            DISTMIS,
            depth=depth + change.pop("depth_delta", 0),
            trials_at_once=a.processes,
            gpu=False,
            patch=tuple(a.patch),  # type: ignore[arg-type]
            channels=a.channels,
            classes=a.classes,
            changes=change,
        )
        print(f"  {name}: {seconds:.3f} s a step", flush=True)
        rows.append({"distmis's recipe with": name, "step s": round(seconds, 3)})
    write_report(a.out, "step_parts", title=title, rows=rows)


if __name__ == "__main__":  # the timing processes are spawned: they import this file again
    main()
