"""A curve table replayed on another clock: the seconds of finished searches on the hardware the simulation is for.

A table's seconds are its recording's: another machine, or the same shared machine on another
day, runs the same epochs faster or slower. What a simulation says in seconds is only as good as
that clock. A user with a table recorded elsewhere (the shipped ones were recorded on 2 CPU cores)
and a short search of their own on their cluster can replay the table on their clock.

The first epoch (which traces the steps), the later epochs and the start-ups do not slow down
together (docs/simulate.md, "The clock"), so each is retimed by its own median ratio, and each
curve table or search given as curves by its own: two recordings made on two days ran at two
speeds, and one ratio for both would leave each off by half their difference. An epoch's
cost is matched architecture by architecture (:data:`COST_PARAMS`), because a search at another
depth or batch size says nothing about this one's epochs. The seconds a trial reports between
two epochs are taken as they are from the other searches, not as a ratio: a checkpoint written
and a result sent through Ray cost what that file system and that driver cost, which an epoch's
speed says nothing about (and the shipped tables were recorded before they were kept).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from distmis.simulate._curves import COST_PARAMS, Curve, CurveError, CurveTable, architecture, architecture_medians
from distmis.simulate._engine import StartupCosts
from distmis.simulate._from_search import joined, read_curves

#: the engine's start-up costs a clock retimes (``StartupCosts``' fields)
STARTUP_FIELDS = ("slot", "cold", "warm", "search")


def later_epoch_seconds(curve: Curve) -> float | None:
    """The median epoch after the first (which traces the steps); None for a one-epoch curve."""
    return statistics.median(curve.epoch_seconds[1:]) if curve.epochs > 1 else None


def curve_ratios(
    table: list[Curve], theirs: list[Curve], seconds: Callable[[Curve], float | None]
) -> list[tuple[int, float]]:
    """(index, ratio) for each of the table's curves whose architecture ``theirs`` holds: its
    seconds over that architecture's median seconds in ``theirs``."""

    def positive(c: Curve) -> float | None:
        s = seconds(c)
        return s if s is not None and s > 0 else None

    medians = architecture_medians(theirs, positive)
    return [
        (i, s / medians[architecture(c)])
        for i, c in enumerate(table)
        if architecture(c) in medians and (s := positive(c)) is not None
    ]


def _median_ratio(table: list[Curve], theirs: list[Curve], seconds: Callable[[Curve], float | None]) -> float | None:
    ratios = [r for _, r in curve_ratios(table, theirs, seconds)]
    return statistics.median(ratios) if ratios else None


@dataclass(frozen=True)
class Clock:
    """Table / theirs: how much faster (below 1: slower) the table's recording ran than the clock's searches.

    Every second of the table is divided by its ratio to replay it on the other clock.
    """

    first_epoch: float
    later_epochs: float
    startup: dict[str, float]
    source: str
    #: seconds, not a ratio: theirs between two epochs (median); None where they did not record it
    report_seconds: float | None = None
    #: the curves this clock retimes (a table or search given as curves); empty where not named
    curves: str = ""

    @classmethod
    def between(cls, table: list[Curve], theirs: list[Curve], source: str, curves: str = "") -> Clock:
        """The ratios of ``table`` (named ``curves``) to ``theirs``.

        Raises:
            CurveError: no trial of ``theirs`` shares an architecture with the table.
        """
        first = _median_ratio(table, theirs, lambda c: c.epoch_seconds[0])
        if first is None:
            names = ", ".join(COST_PARAMS)
            raise CurveError(
                f"{source}: no trial shares an architecture ({names}) with the curves{f' of {curves}' if curves else ''}; "
                "expected searches of the same models"
            )
        later = _median_ratio(table, theirs, later_epoch_seconds)
        ours, other = StartupCosts.of_curves(table), StartupCosts.of_curves(theirs)
        startup = {
            # a cost one side did not record (a table without slot start-ups) keeps its seconds
            k: getattr(ours, k) / getattr(other, k) if getattr(ours, k) > 0 and getattr(other, k) > 0 else 1.0
            for k in STARTUP_FIELDS
        }
        report = other.report if other.report_recorded else None
        return cls(first, first if later is None else later, startup, source, report, curves)

    def retimed(self, curves: list[Curve]) -> list[Curve]:
        """Copies of ``curves`` with every second on this clock (the values are untouched)."""

        def scaled(value: float | None, field: str) -> float | None:
            return None if value is None else value / self.startup[field]

        return [
            dataclasses.replace(
                c,
                epoch_seconds=[c.epoch_seconds[0] / self.first_epoch]
                + [s / self.later_epochs for s in c.epoch_seconds[1:]],
                startup_seconds=c.startup_seconds / self.startup["warm" if c.warm else "cold"],
                slot_startup_seconds=scaled(c.slot_startup_seconds, "slot"),
                search_fixed_seconds=scaled(c.search_fixed_seconds, "search"),
                report_seconds=(
                    list(c.report_seconds)
                    if self.report_seconds is None
                    else [self.report_seconds] * (c.epochs - 1) + [None]
                ),
                values=dict(c.values),
                params=dict(c.params),
            )
            for c in curves
        ]

    def line(self) -> str:
        starts = ", ".join(f"{k} {v:.2f}" for k, v in self.startup.items())
        return (
            f"clock of {self.source}: the seconds of {self.curves or 'the curves'} / theirs: "
            f"first epoch {self.first_epoch:.2f}, "
            f"later epochs {self.later_epochs:.2f}, start-ups {starts} (each divided out)"
            + ("" if self.report_seconds is None else f"; theirs between two epochs: {self.report_seconds:.2f} s")
        )

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def on_clock(tables: list[CurveTable], clock_of: list[Path] | None) -> tuple[CurveTable, list[Clock]]:
    """``tables`` joined, each on the clock of the searches or tables ``clock_of`` (as recorded
    without it) by its own ratios, and those clocks (none without ``clock_of``).

    Raises:
        CurveError: ``clock_of`` is not curves, or shares no architecture with one of the tables.
    """
    if not clock_of:
        return joined(tables), []
    try:
        theirs = read_curves(list(clock_of))
        clocks = [Clock.between(t.curves, theirs.curves, theirs.source, t.source) for t in tables]
    except CurveError as e:
        raise CurveError(f"--clock-of {e}") from None
    retimed = [CurveTable(clock.retimed(t.curves), t.source, t.recipe) for clock, t in zip(clocks, tables, strict=True)]
    return joined(retimed), clocks


__all__ = ["Clock", "curve_ratios", "later_epoch_seconds", "on_clock"]
