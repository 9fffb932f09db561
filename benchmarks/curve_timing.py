"""Are a curve table's epoch seconds those of real searches on the same machine?

A table's clock is the recording's: its epochs' seconds, replayed by ``distmis simulate``. This
compares them with the epochs of finished real searches (``search_efficiency.py``'s run
directories), architecture by architecture (the parameters that set an epoch's cost: filters,
depth, batch size, normalisation), and prints the median ratio table / real overall and by the
table's trial order, which shows a recording whose epochs slowed as it went.

``--write OUT`` writes a copy of the table with every epoch's seconds divided by that median
ratio: a diagnostic (what would the simulation say on this machine's clock?), not a recording.

    python benchmarks/curve_timing.py --table benchmarks/curves/anatomy32.csv.gz \\
        --real runs/bench-search-anatomy32/runs/random-s* runs/bench-search-anatomy32/runs/default-s*
    # a recording's own search directory stands for its table (an unfinished one cannot)
    python benchmarks/curve_timing.py --table runs/drift-now/search --real runs/bench-search-anatomy32/runs/random-s*
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from distmis.simulate import Curve, curves_of_search, read_curves, write_table

#: the parameters that set what an epoch costs (the others change what it learns)
COST = ("filters", "depth", "batch_size_per_replica", "norm")


def architecture(curve: Curve) -> tuple[str, ...]:
    return tuple(str(curve.params.get(name)) for name in COST)


def epoch_seconds(curve: Curve) -> float | None:
    """The median epoch after the first (which traces the steps)."""
    return statistics.median(curve.epoch_seconds[1:]) if curve.epochs > 1 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", required=True, help="a curve table, or a finished search directory")
    p.add_argument("--real", nargs="+", required=True, help="finished search directories")
    p.add_argument("--block", type=int, default=32, help="curves per row of the trial-order table")
    p.add_argument("--write", default=None, help="a retimed copy of the table")
    a = p.parse_args()

    real: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for run in a.real:
        for curve in curves_of_search(run)[0].curves:
            if (s := epoch_seconds(curve)) is not None:
                real[architecture(curve)].append(s)
    real_median = {k: statistics.median(v) for k, v in real.items()}
    table = read_curves([a.table])
    ratios: list[tuple[int, float]] = []
    for i, curve in enumerate(table.curves):
        s = epoch_seconds(curve)
        if s is not None and architecture(curve) in real_median:
            ratios.append((i, s / real_median[architecture(curve)]))
    if not ratios:
        raise SystemExit("no architecture of the table is among the real searches' trials")
    overall = statistics.median(r for _, r in ratios)
    print(
        f"{a.table}: {len(ratios)} of {len(table.curves)} curves share an architecture ({', '.join(COST)}) "
        f"with {sum(map(len, real.values()))} real trials in {len(a.real)} searches"
    )
    print(f"epoch seconds, table / real: median {overall:.3f}\n\n| table's curves | curves | median table / real |")
    print("|---|---|---|")
    for start in range(0, len(table.curves), a.block):
        block = [r for i, r in ratios if start <= i < start + a.block]
        if block:
            print(
                f"| {start + 1}-{min(start + a.block, len(table.curves))} | {len(block)} | {statistics.median(block):.3f} |"
            )
    if a.write:
        for curve in table.curves:
            curve.epoch_seconds = [s / overall for s in curve.epoch_seconds]
        print(f"\n{write_table(table.curves, Path(a.write))}: every epoch's seconds / {overall:.3f}")


if __name__ == "__main__":
    main()
