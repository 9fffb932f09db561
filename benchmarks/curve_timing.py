"""Are a curve table's epoch seconds those of real searches on the same machine?

A table's clock is the recording's: its epochs' seconds, replayed by ``distmis simulate``. This
compares them with the epochs of finished real searches (``search_efficiency.py``'s run
directories), architecture by architecture (the parameters that set an epoch's cost: filters,
depth, batch size, normalisation), and prints the median ratio table / real overall and by the
table's trial order, which shows a recording whose epochs slowed as it went.

``--again DIR`` compares instead with the same design recorded again (``record_curves.py``'s
``--out``, finished or interrupted): configuration by configuration in the design's order, the
first epoch and the others apart, and how far the search metric moved. Two machines of one kind
differ; this says by how much, when the values are the same.

With ``--real`` it also prints the seconds the real trials spent between two epochs (checkpoint,
report), architecture by architecture: what ``distmis.simulate.study.REPORT_SECONDS`` (the engine's
figure for tables that did not record them) was measured by.

``--write OUT`` writes a copy of the table on the real searches' clock: the first epoch (which
traces the steps), the other epochs and the start-ups (a slot's, a cold and a warm trial's), each
divided by its own median ratio table / real. A diagnostic (what would the simulation say on this
machine's clock that day?), not a recording.

    python benchmarks/curve_timing.py --table benchmarks/curves/anatomy32.csv.gz \\
        --real runs/bench-search-anatomy32/runs/random-s* runs/bench-search-anatomy32/runs/default-s*
    # a recording's own search directory stands for its table (an unfinished one cannot)
    python benchmarks/curve_timing.py --table runs/drift-now/search --real runs/bench-search-anatomy32/runs/random-s*
    python benchmarks/curve_timing.py --table benchmarks/curves/anatomy32.csv.gz --again runs/curves-anatomy32-now
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from benchlib import add_out_option, write_report

from distmis.schema import RunFile
from distmis.simulate import Curve, curves_of_search, read_curves, write_table
from distmis.simulate.study import COST_PARAMS, REPORT_SECONDS, Clock, architecture, curve_ratios
from distmis.simulate.study import later_epoch_seconds as epoch_seconds


def again(table_path: str, recording: Path, metric: str, out: Path) -> None:
    """The same design recorded again against the table, configuration by configuration."""
    table = [c for c in read_curves([table_path]).curves if c.training_seed == 0]  # the design, in order
    trials = sorted((recording / "search" / RunFile.TRIALS_DIR).glob(f"*/{RunFile.METRICS}"))
    first, rest, moved = [], [], []
    for path in trials:
        with path.open() as f:
            rows = list(csv.DictReader(f))
        index = int(path.parent.name.rsplit("_", 1)[1])  # Tune numbers a points search's trials in order
        if index >= len(table) or len(rows) != table[index].epochs:
            continue  # a trial still running, or a repeat with another seed
        old, seconds = table[index], [float(r["epoch_seconds"]) for r in rows]
        first.append(seconds[0] / old.epoch_seconds[0])
        rest.append(sum(seconds[1:]) / sum(old.epoch_seconds[1:]))
        moved.append(abs(max(float(r[metric]) for r in rows) - max(old.values[metric])))
    if not first:
        raise SystemExit(f"{recording}: no finished trial of the table's design")

    def spread(x: list[float]) -> str:
        q = statistics.quantiles(x, n=4)
        return f"median {statistics.median(x):.2f} (IQR {q[0]:.2f}-{q[2]:.2f})"

    print(f"{recording} against {table_path}: {len(first)} configurations recorded again")
    print(f"- first epoch (tracing), again / table: {spread(first)}")
    print(f"- epochs 2-{table[0].epochs}, again / table: {spread(rest)}")
    print(f"- best {metric}, |again - table|: median {statistics.median(moved):.4f}, largest {max(moved):.4f}")
    rows = [
        {"measure": "first epoch (tracing), again / table", "median": statistics.median(first)},
        {"measure": f"epochs 2-{table[0].epochs}, again / table", "median": statistics.median(rest)},
        {"measure": f"best {metric}, |again - table|", "median": statistics.median(moved), "largest": max(moved)},
    ]
    title = f"{recording} against {table_path}: {len(first)} configurations recorded again"
    write_report(out, "curve_timing", title=title, rows=rows, echo=False)


def gaps_by_architecture(curves: list[Curve]) -> None:
    """The real trials' seconds between two epochs, median [p10-p90] by architecture and overall."""
    by_arch: dict[tuple[str, ...], list[float]] = {}
    for c in curves:
        by_arch.setdefault(architecture(c), []).extend(r for r in c.report_seconds if r is not None)

    def cells(gaps: list[float]) -> str:
        if len(gaps) < 2:
            return f"{len(gaps)} | {gaps[0]:.3f} |" if gaps else "0 | - |"
        deciles = statistics.quantiles(gaps, n=10)
        return f"{len(gaps)} | {statistics.median(gaps):.3f} [{deciles[0]:.3f}-{deciles[-1]:.3f}] |"

    every = [g for gaps in by_arch.values() for g in gaps]
    print(f"\nseconds between two epochs in the real searches (the engine's default: {REPORT_SECONDS} s)")
    print(f"| {' | '.join(COST_PARAMS)} | gaps | median [p10-p90] (s) |")
    print("|" + "---|" * (len(COST_PARAMS) + 2))

    def numeric_first(item: tuple[tuple[str, ...], list[float]]) -> list[tuple[int, float, str]]:
        return [(0, float(v), "") if v.replace(".", "", 1).isdigit() else (1, 0.0, v) for v in item[0]]

    for arch, gaps in sorted(by_arch.items(), key=numeric_first):
        print(f"| {' | '.join(arch)} | {cells(gaps)}")
    print(f"| all |{' |' * (len(COST_PARAMS) - 1)} {cells(every)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", required=True, help="a curve table, or a finished search directory")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--real", nargs="+", help="finished search directories")
    which.add_argument("--again", type=Path, help="record_curves.py's --out of the same design, recorded again")
    p.add_argument("--metric", default="val_dice", help="the search metric (--again)")
    p.add_argument("--block", type=int, default=32, help="curves per row of the trial-order table")
    p.add_argument("--write", default=None, help="a retimed copy of the table")
    add_out_option(p, "curve_timing")
    a = p.parse_args()
    if a.again:
        again(a.table, a.again, a.metric, a.out)
        return

    real_curves = [curve for run in a.real for curve in curves_of_search(run)[0].curves]
    table = read_curves([a.table])
    ratios = curve_ratios(table.curves, real_curves, epoch_seconds)
    if not ratios:
        raise SystemExit("no architecture of the table is among the real searches' trials")
    clock = Clock.between(table.curves, real_curves, f"{len(a.real)} searches")
    overall = clock.later_epochs
    print(
        f"{a.table}: {len(ratios)} of {len(table.curves)} curves share an architecture ({', '.join(COST_PARAMS)}) "
        f"with {sum(epoch_seconds(c) is not None for c in real_curves)} real trials in {len(a.real)} searches"
    )
    print(f"epoch seconds, table / real: median {overall:.3f}\n\n| table's curves | curves | median table / real |")
    print("|---|---|---|")
    rows = []
    for start in range(0, len(table.curves), a.block):
        block = [r for i, r in ratios if start <= i < start + a.block]
        if block:
            span = f"{start + 1}-{min(start + a.block, len(table.curves))}"
            print(f"| {span} | {len(block)} | {statistics.median(block):.3f} |")
            rows.append({"table's curves": span, "curves": len(block), "median table / real": statistics.median(block)})
    print(clock.line())
    title = f"{a.table}: epoch seconds, table / real, median {overall:.3f} ({clock.line()})"
    write_report(a.out, "curve_timing", title=title, rows=rows, echo=False)
    gaps_by_architecture(real_curves)
    if a.write:
        print(f"\n{write_table(clock.retimed(table.curves), Path(a.write), recipe=table.recipe)}: {clock.line()}")


if __name__ == "__main__":
    main()
