"""``distmis simulate``: the event loop against sums worked out by hand, the real searcher and scheduler
driven through it, curve tables refused with one line, and a table read from a real finished search."""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from distmis.cli import main
from distmis.config import load_config
from distmis.simulate import Curve, CurveError, StartupCosts, curves_of_search, read_table, simulate_search, write_table
from distmis.simulate.study import (
    REPORT_SECONDS,
    NearestCurves,
    cold_first_epoch_seconds,
    on_clock,
    read_tables,
    typed_for,
)
from distmis.space import grid_points

EPOCHS = 6
LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]
NORMS = ["batch", "group"]


def _value(lr: float, norm: str, epoch: int, seed: int) -> float:
    """A learning curve with its peak at lr 1e-3 and group norm a little better; seeds differ slightly."""
    peak = 0.9 - 0.08 * abs(math.log10(lr) + 3) + (0.02 if norm == "group" else 0.0) + 0.005 * seed
    return peak * (1 - math.exp(-epoch / 2.0))


def _table(
    value: Callable[[float, str, int, int], float] = _value, two_seeds: int = 3, report: float | None = None
) -> list[Curve]:
    """The hand-made table: ``value`` per configuration, epoch and seed; the first ``two_seeds``
    configurations recorded with seeds 0 and 1, the rest with seed 0; ``report`` seconds between
    two epochs where given (else not recorded, as in a table from before that column)."""
    curves = []
    for i, (lr, norm) in enumerate((lr, norm) for lr in LRS for norm in NORMS):
        for seed in (0, 1) if i < two_seeds else (0,):
            curves.append(
                Curve(
                    trial=f"t{i}-{seed}",
                    training_seed=seed,
                    params={"lr": lr, "norm": norm},
                    warm=i > 1,
                    startup_seconds=0.25 if i > 1 else 0.5,
                    slot_startup_seconds=None if i > 1 else 2.0,
                    epoch_seconds=[1.0] * EPOCHS,
                    report_seconds=[report] * (EPOCHS - 1) + [None],
                    values={"val_dice": [value(lr, norm, e, seed) for e in range(1, EPOCHS + 1)]},
                )
            )
    return curves


def _search(tmp: Path, name: str, algorithm: str, *, scheduler: dict | None = None, samples: int = 10) -> Path:
    space: dict = {"lr": {"loguniform": [1e-4, 1e-2]}, "norm": {"choice": NORMS}}
    if algorithm == "grid":
        space["lr"] = {"choice": LRS}
    doc = {
        "name": name,
        "data": {"source": "synthetic"},
        "train": {"epochs": EPOCHS},
        "search": {
            "algorithm": algorithm,
            "metric": "val_dice",
            "num_samples": samples,
            "seed": 0,
            "scheduler": scheduler or {"type": "none"},
        },
        "space": space,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def table_file(tmp_path: Path) -> Path:
    return write_table(_table(), tmp_path / "curves.csv.gz")


def _prepared(search: Path, table: Path):
    config = load_config(search, require_space=True)
    typed = typed_for(read_table(table), config.space, metric="val_dice", epochs=EPOCHS)
    return (
        config,
        NearestCurves(typed, config.space, metric="val_dice", mode="max"),
        StartupCosts.of_curves(typed.curves),
    )


def test_a_table_round_trips_and_startup_costs_are_the_recorded_medians(table_file: Path) -> None:
    table = read_table(table_file)
    assert len(table.curves) == len(_table())
    assert table.curves[0].values["val_dice"] == pytest.approx(_table()[0].values["val_dice"], rel=1e-4)
    costs = StartupCosts.of_curves(table.curves)
    assert (costs.slot, costs.cold, costs.warm) == (2.0, 0.5, 0.25)
    # the table recorded no seconds between epochs: distmis's measured ones stand for them, said so
    assert (costs.report, costs.report_recorded) == (REPORT_SECONDS, False)


def test_a_grid_on_one_worker_takes_the_sum_of_its_trials(tmp_path: Path, table_file: Path) -> None:
    config, surrogate, costs = _prepared(_search(tmp_path, "grid", "grid"), table_file)
    run = simulate_search(config, surrogate, workers=1, costs=costs, seed=0)
    n = len(grid_points(config.space))
    assert run.trials == n and run.epochs == n * EPOCHS and run.stopped_early == 0
    # from the first trial's start: its cold start to epoch 1, then per trial its epochs with the
    # measured seconds between two of them (the table recorded none), warm start-ups between trials
    expected = 0.5 + n * EPOCHS * 1.0 + n * (EPOCHS - 1) * REPORT_SECONDS + (n - 1) * 0.25
    assert expected <= run.wall <= expected + run.decision_seconds + 1e-6
    best = max(_value(lr, norm, EPOCHS, 0) for lr in LRS for norm in NORMS)
    assert max(v for _, v in run.events) in (pytest.approx(best, rel=1e-4), pytest.approx(best + 0.005, rel=1e-4))


def test_four_trials_on_two_workers_follow_the_schedule_and_best_so_far_worked_out_by_hand(tmp_path: Path) -> None:
    """Four listed configurations of 2 epochs, of 1, 1.5, 2.5 and 0.5 s each, on 2 workers; 0.5 s
    from a fresh slot's trial's start to its first epoch, 0.25 s on a reused slot, nothing else.
    Worker 0: A's epochs end at 1.5 and 2.5, then C starts (2.5) and ends 2.5 + 0.25 + 2.5 = 5.25
    and 7.75. Worker 1: B's end at 2.0 and 3.5, then D at 3.5 + 0.25 + 0.5 = 4.25 and 4.75."""
    import dataclasses

    seconds = {"A": 1.0, "B": 1.5, "C": 2.5, "D": 0.5}
    values = {"A": [0.5, 0.6], "B": [0.4, 0.7], "C": [0.3, 0.9], "D": [0.8, 0.85]}
    lr = {"A": 1e-4, "B": 3e-4, "C": 1e-3, "D": 3e-3}
    curves = [
        Curve(k, 0, {"lr": lr[k], "norm": "batch"}, k in "CD", 0.25 if k in "CD" else 0.5,
              epoch_seconds=[seconds[k]] * 2, values={"val_dice": values[k]})
        for k in "ABCD"
    ]  # fmt: skip
    doc = {
        "name": "by-hand",
        "data": {"source": "synthetic"},
        "train": {"epochs": 2},
        "search": {
            "algorithm": "points",
            "metric": "val_dice",
            "points": [{"lr": lr[k]} for k in "ABCD"],
            "scheduler": {"type": "none"},
        },
        "space": {"lr": {"choice": list(lr.values())}, "norm": {"choice": ["batch"]}},
    }
    search = tmp_path / "by-hand.yaml"
    search.write_text(yaml.safe_dump(doc, sort_keys=False))
    config = load_config(search, require_space=True)
    typed = typed_for(
        read_table(write_table(curves, tmp_path / "by-hand.csv")), config.space, metric="val_dice", epochs=2
    )
    costs = StartupCosts.of_curves(typed.curves, driver_per_result=0.0, driver_per_trial=0.0)
    assert (costs.slot, costs.cold, costs.warm, costs.cold_first_epoch) == (0.0, 0.5, 0.25, 0.0)
    costs = dataclasses.replace(costs, report=0.0)
    run = simulate_search(
        config, NearestCurves(typed, config.space, metric="val_dice", mode="max"), workers=2, costs=costs, seed=0
    )
    slack = run.decision_seconds + 1e-6
    assert (run.trials, run.epochs, run.stopped_early) == (4, 8, 0)
    assert sorted(run.intervals) == [
        pytest.approx(interval, abs=slack) for interval in [(0.0, 2.5), (0.0, 3.5), (2.5, 7.75), (3.5, 4.75)]
    ]
    assert run.events == [
        (pytest.approx(t, abs=slack), pytest.approx(v))
        for t, v in [
            (1.5, 0.5),
            (2.0, 0.4),
            (2.5, 0.6),
            (3.5, 0.7),
            (4.25, 0.8),
            (4.75, 0.85),
            (5.25, 0.3),
            (7.75, 0.9),
        ]
    ]
    best_so_far, best = [], -1.0
    for t, v in run.events:
        if v > best:
            best_so_far.append((t, v))
            best = v
    assert best_so_far == [
        (pytest.approx(t, abs=slack), pytest.approx(v))
        for t, v in [(1.5, 0.5), (2.5, 0.6), (3.5, 0.7), (4.25, 0.8), (4.75, 0.85), (7.75, 0.9)]
    ]
    assert run.wall == pytest.approx(7.75, abs=slack) and run.best_params == {"lr": lr["C"]}


def test_a_fresh_slots_first_epoch_costs_what_the_recording_measured_whichever_curve_it_replays(
    tmp_path: Path,
) -> None:
    """The two trials recorded on fresh slots took 1.5 s for their first epoch, the warm ones 1.0 s:
    a fresh slot's first epoch costs 0.5 s more. Replayed one at a time, the first trial replays a
    curve recorded cold (1.5 s, as recorded) and the second one recorded cold runs warm (1.0 s); on
    ten workers every trial's slot is fresh and every first epoch takes 1.5 s."""
    import dataclasses

    curves = _table(report=0.0)
    for c in curves:
        c.epoch_seconds[0] = 1.0 if c.warm else 1.5
    table = write_table(curves, tmp_path / "cold.csv.gz")
    config, surrogate, costs = _prepared(_search(tmp_path, "grid", "grid"), table)
    assert costs.cold_first_epoch == pytest.approx(0.5)
    costs = dataclasses.replace(costs, driver_per_result=0.0, driver_per_trial=0.0)
    n = len(grid_points(config.space))

    one = simulate_search(config, surrogate, workers=1, costs=costs, seed=0)
    # the cold start to epoch 1, every epoch 1 s, the first trial's first epoch 0.5 s more, warm start-ups
    expected = 0.5 + n * EPOCHS * 1.0 + 0.5 + (n - 1) * 0.25
    assert one.wall == pytest.approx(expected, abs=one.decision_seconds + 1e-6)

    every = simulate_search(config, surrogate, workers=n, costs=costs, seed=0)
    assert every.trials == n
    ends = [b - a for a, b in every.intervals]
    assert ends == pytest.approx([0.5 + 1.5 + (EPOCHS - 1) * 1.0] * n, abs=every.decision_seconds + 1e-6)


def test_the_cold_first_epoch_is_compared_architecture_by_architecture_and_never_below_zero() -> None:
    def curve(filters: int, warm: bool, first: float) -> Curve:
        return Curve(f"{filters}-{warm}-{first}", 0, {"filters": filters}, warm, 0.1, epoch_seconds=[first, 1.0])

    # 16 filters cost twice 8: a cold 8-filter trial compared with all warm trials would look fast
    mixed = [curve(8, False, 1.4), curve(8, True, 1.0), curve(16, True, 2.0), curve(16, True, 2.2)]
    assert cold_first_epoch_seconds(mixed) == pytest.approx(0.4)
    assert cold_first_epoch_seconds([curve(8, False, 0.9), curve(8, True, 1.0)]) == 0.0
    # no warm trial of the cold one's architecture: nothing to compare with
    assert cold_first_epoch_seconds([curve(8, False, 3.0), curve(16, True, 1.0)]) == 0.0


def test_the_seconds_a_trial_reports_between_epochs_are_added_to_each_of_its_epochs_but_the_last(
    tmp_path: Path,
) -> None:
    table = read_table(write_table(_table(report=0.3), tmp_path / "reporting.csv.gz"))
    assert table.curves[0].report_seconds == [0.3] * (EPOCHS - 1) + [None]  # the last epoch's cell is empty
    config, surrogate, costs = _prepared(_search(tmp_path, "grid", "grid"), tmp_path / "reporting.csv.gz")
    assert costs.report == pytest.approx(0.3) and costs.report_recorded
    run = simulate_search(config, surrogate, workers=1, costs=costs, seed=0)
    n = len(grid_points(config.space))
    expected = 0.5 + n * EPOCHS * 1.0 + n * (EPOCHS - 1) * 0.3 + (n - 1) * 0.25
    assert expected <= run.wall <= expected + run.decision_seconds + 1e-6
    # an epoch's value is dated at its end: the first trial's are 0.5 + e + (e - 1) * 0.3
    first = sorted(t for t, _ in run.events)[:EPOCHS]
    assert first == pytest.approx(
        [0.5 + e + (e - 1) * 0.3 for e in range(1, EPOCHS + 1)], abs=run.decision_seconds + 1e-6
    )


def test_the_drivers_own_work_queues_the_results_of_many_trials_and_not_those_of_one(
    tmp_path: Path, table_file: Path
) -> None:
    """Four trials of 1 s epochs, and a driver that works 0.5 s after each result: it serves one
    result every 0.5 s from the first epoch's end at 1 s, so trial j's epoch e waits until
    1 + 0.5 * (4 * (e - 1) + j) and its last epoch ends at 1 + 0.5 * (16 + j) + 1. Its own 0.5 s
    never holds the trial that reported (its recorded seconds hold that), so one trial alone is as fast."""
    import dataclasses

    config, surrogate, costs = _prepared(_search(tmp_path, "grid", "grid"), table_file)
    config = config.model_copy(
        update={"space": {**config.space, "lr": config.space["lr"].model_copy(update={"choice": LRS[:2]})}}
    )
    flat = dataclasses.replace(costs, slot=0.0, cold=0.0, warm=0.0, report=0.0, driver_per_trial=0.0)
    queued = simulate_search(
        config, surrogate, workers=4, costs=dataclasses.replace(flat, driver_per_result=0.5), seed=0
    )
    assert queued.trials == 4 and queued.epochs == 4 * EPOCHS
    slack = queued.decision_seconds + 1e-6
    ends = sorted(b for _, b in queued.intervals)
    assert ends == pytest.approx([1 + 0.5 * (16 + j) + 1 for j in range(4)], abs=slack)
    free = simulate_search(config, surrogate, workers=4, costs=dataclasses.replace(flat, driver_per_result=0.0), seed=0)
    assert free.wall == pytest.approx(EPOCHS * 1.0, abs=free.decision_seconds + 1e-6)

    one = simulate_search(config, surrogate, workers=1, costs=dataclasses.replace(flat, driver_per_result=0.5), seed=0)
    alone = simulate_search(
        config, surrogate, workers=1, costs=dataclasses.replace(flat, driver_per_result=0.0), seed=0
    )
    assert one.wall == pytest.approx(alone.wall, abs=one.decision_seconds + alone.decision_seconds + 1e-6)

    # a trial's start keeps the driver 0.25 s from the next start: four trials start 0.25 s apart
    staggered = simulate_search(
        config, surrogate, workers=4, costs=dataclasses.replace(flat, driver_per_trial=0.25), seed=0
    )
    starts, ends = zip(*sorted(staggered.intervals), strict=True)
    slack = staggered.decision_seconds + 1e-6
    assert starts == pytest.approx([0.25 * j for j in range(4)], abs=slack)
    assert ends == pytest.approx([0.25 * j + EPOCHS for j in range(4)], abs=slack)


def test_report_seconds_are_the_gaps_between_one_epochs_end_and_the_next_ones_start() -> None:
    from distmis.simulate.study import report_seconds

    # epochs of 1, 2 and 3 s ending at 10, 12.5 and 16: the second began at 10.5, the third at 13
    assert report_seconds([1.0, 2.0, 3.0], [10.0, 12.5, 16.0]) == [pytest.approx(0.5), pytest.approx(0.5), None]
    assert report_seconds([1.0], [4.0]) == [None] and report_seconds([], []) == []


def test_more_workers_shorten_the_search_and_asha_stops_trials_early(tmp_path: Path, table_file: Path) -> None:
    config, surrogate, costs = _prepared(_search(tmp_path, "random", "random", samples=16), table_file)
    one = simulate_search(config, surrogate, workers=1, costs=costs, seed=0)
    four = simulate_search(config, surrogate, workers=4, costs=costs, seed=0)
    assert one.trials == four.trials == 16
    assert 3.0 < one.wall / four.wall <= 4.2  # four slots, each paying its own cold start

    asha = _search(tmp_path, "asha", "random", samples=16, scheduler={"type": "asha", "grace_period": 1})
    config, surrogate, costs = _prepared(asha, table_file)
    stopped = simulate_search(config, surrogate, workers=4, costs=costs, seed=0)
    assert stopped.stopped_early > 0 and stopped.epochs < 16 * EPOCHS


@pytest.mark.parametrize(("algorithm", "brackets"), [("random", 1), ("optuna", 3)])
def test_the_schedulers_stops_are_those_rays_scheduler_makes_on_the_same_results(
    tmp_path: Path, table_file: Path, algorithm: str, brackets: int
) -> None:
    """Every result the simulation gave its scheduler, in its order, given to a fresh ASHA built from
    Ray as its docs say, on Ray's own trial objects and in Tune's protocol (a trial added before
    its results; on a stop, or at the last epoch, the result again as the trial's completion): the
    same decision for each, and no result of a trial after its stop."""
    import numpy as np
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    scheduler = {"type": "asha", "grace_period": 1, "reduction_factor": 2, "brackets": brackets}
    config, surrogate, costs = _prepared(
        _search(tmp_path, f"asha{brackets}", algorithm, samples=24, scheduler=scheduler), table_file
    )
    seed = 5
    run = simulate_search(config, surrogate, workers=4, costs=costs, seed=seed)
    assert run.trials == 24 and len(run.reports) == run.epochs
    assert 0 < run.stopped_early < run.trials  # the decisions compared include stops and full runs

    asha = ASHAScheduler(
        time_attr="epoch",
        metric="val_dice",
        mode="max",
        max_t=EPOCHS,
        grace_period=1,
        reduction_factor=2,
        brackets=brackets,
    )
    np.random.seed(seed)  # ASHA draws the bracket of each trial it is given from NumPy's global generator
    trials = {tid: Trial("simulated", trial_id=tid, stub=True) for tid in sorted({r.trial_id for r in run.reports})}
    for trial in trials.values():  # in the order the simulation added them: one draw each, whenever
        asha.on_trial_add(None, trial)
    decisions, ended = [], set()
    for r in run.reports:
        assert r.trial_id not in ended, f"trial {r.trial_id} reported after its stop"
        result = {"epoch": r.epoch, "val_dice": r.value, "trial_id": r.trial_id, "done": False}
        decisions.append(asha.on_trial_result(None, trials[r.trial_id], result))
        if decisions[-1] == TrialScheduler.STOP or r.epoch == EPOCHS:
            asha.on_trial_complete(None, trials[r.trial_id], result)
            ended.add(r.trial_id)
    assert [r.decision for r in run.reports] == decisions
    assert ended == set(trials)


def test_tpe_is_driven_through_the_searcher_distmis_tune_builds(tmp_path: Path, table_file: Path) -> None:
    config, surrogate, costs = _prepared(_search(tmp_path, "tpe", "optuna", samples=12), table_file)
    run = simulate_search(config, surrogate, workers=2, costs=costs, seed=1)
    assert run.trials == 12 and run.decision_seconds > 0
    assert set(run.best_params) == {"lr", "norm"}
    again = simulate_search(config, surrogate, workers=2, costs=costs, seed=1)
    assert [v for _, v in again.events] == [v for _, v in run.events]  # a seed fixes what the search does


def test_a_simulated_study_kept_in_a_folder_can_start_the_next_with_its_trials(
    tmp_path: Path, table_file: Path
) -> None:
    """``work`` keeps the searcher's journal; a study copied into the next search's folder is loaded
    by the searcher distmis tune builds, so its trials count before the first proposal."""
    import optuna
    from _support.studies import journal_storage, journal_study

    from distmis.schema import RunFile

    config, surrogate, costs = _prepared(_search(tmp_path, "tpe", "optuna", samples=12), table_file)
    earlier, later = tmp_path / "earlier", tmp_path / "later"
    earlier.mkdir()
    later.mkdir()

    simulate_search(config, surrogate, workers=2, costs=costs, seed=1, work=earlier)
    kept = journal_study(earlier / RunFile.JOURNAL, config.name)
    assert len(kept.trials) == 12 and all(t.state.is_finished() for t in kept.trials)

    optuna.copy_study(
        from_study_name=config.name,
        from_storage=journal_storage(earlier / RunFile.JOURNAL),
        to_storage=journal_storage(later / RunFile.JOURNAL),
        to_study_name=config.name,
    )
    run = simulate_search(config, surrogate, workers=2, costs=costs, seed=1, work=later)
    assert run.trials == 12  # the budget is the new search's own trials
    assert len(journal_study(later / RunFile.JOURNAL, config.name).trials) == 24


def test_cmaes_is_driven_through_the_searcher_distmis_tune_builds(tmp_path: Path, table_file: Path) -> None:
    """CMA-ES proposes lr itself once its two start-up trials are done; norm, categorical, is drawn."""
    pytest.importorskip("cmaes")
    search = _search(tmp_path, "cmaes", "cmaes", samples=12)
    doc = yaml.safe_load(search.read_text())
    doc["search"]["startup_trials"] = 2
    search.write_text(yaml.safe_dump(doc))
    config, surrogate, costs = _prepared(search, table_file)
    run = simulate_search(config, surrogate, workers=2, costs=costs, seed=1)
    again = simulate_search(config, surrogate, workers=2, costs=costs, seed=1)
    assert run.trials == 12 and set(run.best_params) == {"lr", "norm"}
    assert [v for _, v in again.events] == [v for _, v in run.events]
    random = _search(tmp_path, "random", "random", samples=12)
    config, surrogate, costs = _prepared(random, table_file)
    assert [v for _, v in simulate_search(config, surrogate, workers=2, costs=costs, seed=1).events] != [
        v for _, v in run.events
    ]  # not random search under another name


@pytest.mark.parametrize(("algorithm", "module", "named"), [("gp", "torch", "PyTorch"), ("cmaes", "cmaes", "cmaes")])
def test_a_sampler_whose_package_is_missing_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm: str, module: str, named: str
) -> None:
    """The sampler runs in the driver: a missing package is found by validate, not at the first proposal."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    search = _search(tmp_path, algorithm, algorithm)
    before = _sha(search)
    assert main(["validate", str(search), "--no-data"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distmis: error:")
    assert "search.algorithm" in err[0] and named in err[0] and str(search) in err[0]
    assert _sha(search) == before


def test_validate_says_that_gp_and_cmaes_learn_only_from_complete_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("cmaes")
    search = _search(tmp_path, "cmaes", "cmaes", samples=64, scheduler={"type": "asha"})
    assert main(["validate", str(search), "--no-data"]) == 0
    out = capsys.readouterr().out
    assert "CMA-ES models only the trials it lets train every epoch" in out
    assert "1 at once: CMA-ES after 10 random start-up trials" in out


def test_the_surrogate_answers_a_recorded_configuration_with_its_own_curve(table_file: Path, tmp_path: Path) -> None:
    _, surrogate, _ = _prepared(_search(tmp_path, "random", "random"), table_file)
    import numpy as np

    rng = np.random.default_rng(0)
    seeds = {surrogate.curve({"lr": 1e-4, "norm": "batch"}, rng).training_seed for _ in range(20)}
    assert seeds == {0, 1}  # both recorded seeds are drawn
    same = {surrogate.curve({"lr": 1e-4, "norm": "batch"}, rng, training_seed=1).training_seed for _ in range(5)}
    assert same == {1}  # the seed a real trial would train with, where recorded
    other = {surrogate.curve({"lr": 1e-4, "norm": "batch"}, rng, training_seed=7).training_seed for _ in range(5)}
    assert len(other) == 1  # a seed not recorded: the same recorded one every time, as a search shares its seed
    near = surrogate.curve({"lr": 2.9e-3, "norm": "group"}, rng)
    assert near.params == {"lr": 3e-3, "norm": "group"}
    loo = surrogate.leave_one_out()
    assert loo.configs == 10 and loo.seed_pairs == 3 and 0 < loo.mean_absolute_error < 0.2


def _two_seed_table() -> list[Curve]:
    """Every configuration with two training seeds whose curves cannot be confused: seed 0's values
    lie below 0.45 and seed 1's above 0.5 (even moved to a neighbour's level), so each reported
    value says which seed it came from."""
    return _table(lambda lr, norm, e, seed: _value(lr, norm, e, 0) * 0.4 + 0.5 * seed, two_seeds=len(LRS) * len(NORMS))


def test_every_trial_of_one_simulated_search_replays_one_training_seed(tmp_path: Path) -> None:
    table = write_table(_two_seed_table(), tmp_path / "two-seeds.csv.gz")
    config, surrogate, costs = _prepared(_search(tmp_path, "random", "random", samples=12), table)
    seen = set()
    for seed in range(8):
        run = simulate_search(config, surrogate, workers=3, costs=costs, seed=seed)
        from_seed = {v >= 0.5 for _, v in run.events}
        assert len(from_seed) == 1, f"search {seed} mixed the training seeds of its trials"
        seen |= from_seed
    assert seen == {False, True}  # the seed is drawn per search, and both are drawn

    # with --match-training-seed the file's seed, where held, is every trial's
    matched = simulate_search(
        config.model_copy(update={"train": config.train.model_copy(update={"seed": 1})}),
        surrogate,
        workers=3,
        costs=costs,
        seed=0,
        match_training_seed=True,
    )
    assert min(v for _, v in matched.events) >= 0.5


def test_an_unrecorded_configuration_replays_its_nearest_curve_moved_to_its_neighbours_level(
    table_file: Path, tmp_path: Path
) -> None:
    _, surrogate, _ = _prepared(_search(tmp_path, "random", "random"), table_file)
    import numpy as np

    surrogate.neighbours = 2
    rng = np.random.default_rng(0)
    own = surrogate.curve({"lr": 3e-3, "norm": "group"}, rng)
    assert own.values["val_dice"] == pytest.approx(
        [_value(3e-3, "group", e, 0) for e in range(1, EPOCHS + 1)], rel=1e-4
    )
    near = surrogate.curve({"lr": 2.9e-3, "norm": "group"}, rng)
    assert near.params == {"lr": 3e-3, "norm": "group"} and near.epoch_seconds == own.epoch_seconds
    # the two nearest: lr 3e-3 and 1e-3 with group norm; the curve keeps its shape and moves to their mean best
    level = (_value(3e-3, "group", EPOCHS, 0) + _value(1e-3, "group", EPOCHS, 0)) / 2
    moved = [n - o for n, o in zip(near.values["val_dice"], own.values["val_dice"], strict=True)]
    assert moved == pytest.approx([level - _value(3e-3, "group", EPOCHS, 0)] * EPOCHS, abs=1e-3)
    assert max(near.values["val_dice"]) == pytest.approx(level, abs=1e-3)
    assert surrogate.leave_one_out().neighbours == 2


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("case", "edit", "message"),
    [
        ("keys", lambda t: t.replace("param.norm", "param.depth"), "the space has no depth"),
        ("gap", lambda t: t.replace("\nt0-0,0,0,2.000,0.500,2,", "\nt0-0,0,0,2.000,0.500,3,", 1), "from epoch 1 to 3"),
        ("nan", lambda t: t.replace(",1.000,,", ",nan,,", 1), "epoch_seconds is 'nan'"),
        ("negative", lambda t: t.replace(",1.000,,", ",-1.000,,", 1), "epoch_seconds is '-1.000'; expected seconds"),
        ("report", lambda t: t.replace(",1.000,,", ",1.000,-0.5,", 1), "report_seconds is '-0.5'; expected seconds"),
        ("epoch", lambda t: t.replace("\nt0-0,0,0,2.000,0.500,1,", "\nt0-0,0,0,2.000,0.500,one,", 1), "epoch is 'one'"),
        ("empty", lambda t: "", "no column 'trial'"),
        (
            "twice",
            lambda t: t.replace("search_fixed_seconds", "val_dice", 1),
            "column 'val_dice' appears more than once",
        ),
        (
            "two-in-one",
            lambda t: t.replace(",2,1.000,,,,0.0001,", ",2,1.000,,,,0.0003,", 1),
            "row 3: trial t0-0 has param.lr '0.0003', its first row '0.0001'",
        ),
        (
            "text",
            lambda t: t.replace(",0.0001,batch,", ",abc,batch,"),
            "trial t0-0: param.lr is 'abc'; the space draws",
        ),
        (
            "zero",
            lambda t: t.replace(",0.0001,batch,", ",0,batch,"),
            "param.lr is '0'; the space draws it from loguniform",
        ),
        ("missing", lambda t: t.replace(",0.0001,batch,", ",,batch,"), "param.lr is empty; only a parameter with a"),
    ],
)
def test_a_bad_curve_table_is_one_error_line_and_nothing_written(
    tmp_path: Path, table_file: Path, case: str, edit, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    bad = tmp_path / f"{case}.csv"
    bad.write_text(edit(gzip.decompress(table_file.read_bytes()).decode()))
    search = _search(tmp_path, "random", "random")
    before = {p: _sha(p) for p in (bad, search)}
    out = tmp_path / "out"
    rc = main(["simulate", str(search), "--curves", str(bad), "--workers", "2", "--seeds", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("distmis: error: ") and message in err[0], err
    assert str(bad) in err[0] or case == "keys"
    assert not out.exists()
    assert {p: _sha(p) for p in before} == before


def test_a_table_saved_by_a_spreadsheet_with_a_byte_order_mark_reads_as_without(
    tmp_path: Path, table_file: Path
) -> None:
    import gzip

    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + gzip.decompress(table_file.read_bytes()))
    assert read_table(marked).curves == read_table(table_file).curves


def test_a_truncated_curve_is_not_asked_to_go_on(tmp_path: Path, table_file: Path, capsys) -> None:
    search = _search(tmp_path, "random", "random")
    text = search.read_text().replace(f"epochs: {EPOCHS}", f"epochs: {EPOCHS + 2}")
    search.write_text(text)
    rc = main(["simulate", str(search), "--curves", str(table_file), "--workers", "2", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "a truncated curve cannot go on" in err and "has 6 epoch(s)" in err


def test_the_command_writes_table_png_and_json(tmp_path: Path, table_file: Path) -> None:
    files = [_search(tmp_path, "random", "random", samples=8), _search(tmp_path, "grid", "grid")]
    out = tmp_path / "sim"
    rc = main(
        ["simulate", *map(str, files), "--curves", str(table_file), "--workers", "3", "--seeds", "3", "--out", str(out)]
    )
    assert rc == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"random", "grid"} and summary["workers"] == 3
    assert len(summary["methods"]["random"]["seeds"]) == 3
    assert (out / "best_so_far.png").read_bytes()[:4] == b"\x89PNG"
    assert "| random |" in (out / "summary.md").read_text()
    from distmis.simulate.study import DRIVER_SECONDS_PER_RESULT, DRIVER_SECONDS_PER_TRIAL

    costs = summary["methods_detail"]["random"]["startup_costs"]
    assert (costs["driver_per_result"], costs["driver_per_trial"]) == (
        DRIVER_SECONDS_PER_RESULT,
        DRIVER_SECONDS_PER_TRIAL,
    )  # charged unless told otherwise
    assert "the Tune driver's own work" in (out / "summary.md").read_text()
    # the table recorded no seconds between epochs: the measured figure is charged, and said to be
    assert (costs["report"], costs["report_recorded"]) == (REPORT_SECONDS, False)
    said = f"between two epochs of a trial {REPORT_SECONDS:.2f} s (the curves did not record it"
    assert said in (out / "summary.md").read_text()


@pytest.mark.parametrize("given", [["-0.01", "0.08"], ["0.02", "nan"]])
def test_driver_seconds_below_zero_or_not_a_number_are_one_error_line(
    tmp_path: Path, table_file: Path, capsys: pytest.CaptureFixture[str], given: list[str]
) -> None:
    search = _search(tmp_path, "random", "random")
    out = tmp_path / "o"
    rc = main(
        ["simulate", str(search), "--curves", str(table_file), "--workers", "2", "--driver-seconds", *given]
        + ["--out", str(out)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("distmis: error: --driver-seconds")
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--workers", "0"), ("--seeds", "-1"), ("--samples", "0"), ("--target", "nan"), ("--target", "inf")],
)
def test_a_count_below_one_or_a_target_that_is_not_finite_is_one_error_line_naming_the_option(
    tmp_path: Path, table_file: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    search = _search(tmp_path, "random", "random")
    before = {p: _sha(p) for p in (search, table_file)}
    out = tmp_path / "o"
    argv = ["simulate", str(search), "--curves", str(table_file), "--workers", "2", "--out", str(out)]
    rc = main([*argv, option, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"distmis: error: {option}: expected "), err
    assert err[0].endswith(f"got {value}") and not out.exists()
    assert {p: _sha(p) for p in before} == before


def test_driver_seconds_given_are_those_charged(tmp_path: Path, table_file: Path) -> None:
    import json

    search = _search(tmp_path, "random", "random", samples=4)
    out = tmp_path / "o"
    argv = ["simulate", str(search), "--curves", str(table_file), "--workers", "2", "--seeds", "1"]
    assert main([*argv, "--driver-seconds", "0", "0.5", "--out", str(out)]) == 0
    costs = json.loads((out / "summary.json").read_text())["methods_detail"]["random"]["startup_costs"]
    assert (costs["driver_per_result"], costs["driver_per_trial"]) == (0.0, 0.5)


def _slower(curves: list[Curve], *, first: float, later: float, startup: float, report: float) -> list[Curve]:
    """The same curves recorded on a slower clock: first epochs, later epochs and start-ups each by
    its own factor, and ``report`` seconds between two epochs."""
    import dataclasses

    return [
        dataclasses.replace(
            c,
            epoch_seconds=[c.epoch_seconds[0] * first] + [s * later for s in c.epoch_seconds[1:]],
            startup_seconds=c.startup_seconds * startup,
            slot_startup_seconds=None if c.slot_startup_seconds is None else c.slot_startup_seconds * startup,
            report_seconds=[report] * (c.epochs - 1) + [None],
        )
        for c in curves
    ]


def test_curves_replayed_on_another_clock_take_its_seconds(tmp_path: Path, table_file: Path) -> None:
    """A grid on one worker, by hand: each of first epoch, later epochs and start-ups takes the clock's
    own factor; the seconds between two epochs, which the table did not record, are theirs."""
    theirs = write_table(_slower(_table(), first=3.0, later=2.0, startup=4.0, report=0.3), tmp_path / "theirs.csv")
    search = _search(tmp_path, "grid", "grid")
    out = tmp_path / "sim"
    argv = ["simulate", str(search), "--curves", str(table_file), "--workers", "1", "--seeds", "1"]
    assert main([*argv, "--clock-of", str(theirs), "--out", str(out)]) == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    (clock,) = summary["clock"]
    assert (clock["first_epoch"], clock["later_epochs"]) == (pytest.approx(1 / 3), pytest.approx(1 / 2))
    assert clock["startup"] == {
        "slot": pytest.approx(0.25),
        "cold": pytest.approx(0.25),
        "warm": pytest.approx(0.25),
        "search": 1.0,
    }  # the table records no search fixed cost: its seconds are kept
    assert clock["report_seconds"] == pytest.approx(0.3)
    n = len(grid_points(load_config(search, require_space=True).space))
    expected = 4 * 0.5 + n * (3.0 + 2.0 * (EPOCHS - 1)) + n * (EPOCHS - 1) * 0.3 + (n - 1) * 4 * 0.25
    wall = summary["methods"]["grid"]["seeds"]["0"]["wall"]
    decided = sum(summary["methods_detail"]["grid"]["decision_seconds"])
    assert expected <= wall <= expected + decided + 1e-6
    assert "clock of" in (out / "summary.md").read_text()

    # its own clock changes nothing
    same = tmp_path / "same"
    assert main([*argv, "--clock-of", str(table_file), "--out", str(same)]) == 0
    same_summary = json.loads((same / "summary.json").read_text())
    (same_clock,) = same_summary["clock"]
    assert same_clock["later_epochs"] == 1.0 and same_clock["first_epoch"] == 1.0
    # neither side recorded the seconds between epochs: distmis's measured ones stand for them
    assert same_clock["report_seconds"] is None
    assert same_summary["methods_detail"]["grid"]["startup_costs"]["report"] == REPORT_SECONDS
    plain = 0.5 + n * EPOCHS + n * (EPOCHS - 1) * REPORT_SECONDS + (n - 1) * 0.25
    assert plain <= same_summary["methods"]["grid"]["seeds"]["0"]["wall"] <= plain + decided + 1.0


def test_each_table_of_curves_takes_the_clock_by_its_own_ratios(tmp_path: Path, table_file: Path) -> None:
    """Two recordings of one design on two days (the second 2x slower in later epochs): on the
    first's clock each is retimed by its own ratios, so both replay the same seconds; one ratio for
    both would leave each half-way off."""
    slow = write_table(_slower(_table(), first=3.0, later=2.0, startup=4.0, report=0.3), tmp_path / "slow.csv")
    joined_table, clocks = on_clock(read_tables([table_file, slow]), [table_file])
    assert [c.curves for c in clocks] == [str(table_file), str(slow)]
    assert [(c.first_epoch, c.later_epochs) for c in clocks] == [(1.0, 1.0), (pytest.approx(3.0), pytest.approx(2.0))]
    n = len(_table())
    assert len(joined_table.curves) == 2 * n and joined_table.curves[n].trial.startswith("1:")
    for fast, slowed in zip(joined_table.curves[:n], joined_table.curves[n:], strict=True):
        assert slowed.epoch_seconds == pytest.approx(fast.epoch_seconds)
        assert slowed.startup_seconds == pytest.approx(fast.startup_seconds)


def test_a_clock_of_other_models_is_one_error_line_and_nothing_written(
    tmp_path: Path, table_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import dataclasses

    other = [dataclasses.replace(c, params={**c.params, "norm": "layer"}) for c in _table()]
    theirs = write_table(other, tmp_path / "theirs.csv")
    search = _search(tmp_path, "random", "random")
    before = {p: _sha(p) for p in (theirs, search, table_file)}
    out = tmp_path / "out"
    argv = ["simulate", str(search), "--curves", str(table_file), "--workers", "2", "--seeds", "1"]
    rc = main([*argv, "--clock-of", str(theirs), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("distmis: error: --clock-of "), err
    assert str(theirs) in err[0] and "no trial shares an architecture" in err[0]
    assert main([*argv, "--clock-of", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "missing" in capsys.readouterr().err
    assert not out.exists()
    assert {p: _sha(p) for p in before} == before


@pytest.mark.slow
def test_curves_come_straight_from_a_finished_search(prepared16: Path, tmp_path: Path) -> None:
    """A real pilot search (points, no scheduler): its curves, start-ups and seeds are read back and replayed."""
    doc = {
        "name": "pilot",
        "data": {"source": str(prepared16)},
        "train": {"epochs": 2, "batch_size_per_replica": 2},
        "model": {"depth": 2, "filters": 4, "groups": 2},
        "search": {
            "algorithm": "points",
            "metric": "val_dice",
            "scheduler": {"type": "none"},
            "max_concurrent_trials": 2,
            "points": [{"lr": 1e-3, "seed": 0}, {"lr": 3e-3, "seed": 0}, {"lr": 1e-3, "seed": 1}],
        },
        "space": {"lr": {"loguniform": [1e-4, 1e-2]}, "seed": {"choice": [0, 1]}},
        "parallelism": {"mode": "experiment", "workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }
    cfg = tmp_path / "pilot.yaml"
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'ml.db'}", "DISTMIS_DATA_HOME": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    search = tmp_path / "pilot"
    done = subprocess.run(
        [sys.executable, "-m", "distmis", "tune", str(cfg), "--out", str(search)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    table, left_out = curves_of_search(search)
    assert left_out == 0 and len(table.curves) == 3
    assert sorted(c.training_seed for c in table.curves) == [0, 0, 1]
    assert all(c.epochs == 2 and set(c.params) == {"lr"} for c in table.curves)
    cold = [c for c in table.curves if not c.warm]
    assert cold and all(c.slot_startup_seconds and c.slot_startup_seconds > 0 for c in cold)
    assert all(0 <= c.startup_seconds < 60 for c in table.curves)
    assert all(c.search_fixed_seconds and c.search_fixed_seconds > 0 for c in table.curves)  # its timings.json
    # between its two epochs each trial reported (checkpoint, Tune's round trip): a measured gap, none after the last
    assert all(c.report_seconds[-1] is None and 0 < (c.report_seconds[0] or 0) < 60 for c in table.curves)
    assert StartupCosts.of_curves(table.curves).report > 0
    written = read_table(write_table(table.curves, tmp_path / "pilot.csv"))
    assert [c.values for c in written.curves] == [
        {k: [float(f"{x:.5g}") for x in v] for k, v in c.values.items()} for c in table.curves
    ]
    assert [c.report_seconds[0] for c in written.curves] == [
        pytest.approx(c.report_seconds[0], abs=5e-4) for c in table.curves
    ]

    sim = {**doc, "name": "replay", "search": {"algorithm": "random", "metric": "val_dice", "num_samples": 6}}
    sim["space"] = {"lr": doc["space"]["lr"]}
    replay = tmp_path / "replay.yaml"
    replay.write_text(yaml.safe_dump(sim, sort_keys=False))
    out = tmp_path / "sim"
    rc = main(["simulate", str(replay), "--curves", str(search), "--workers", "2", "--seeds", "2", "--out", str(out)])
    assert rc == 0 and (out / "summary.json").is_file()
    _damaged_copies_name_what_is_wrong(search, tmp_path)


def _damaged_copies_name_what_is_wrong(search: Path, tmp_path: Path) -> None:
    """A finished trial's metrics.csv deleted, results.csv cut short, trials stopped early by a
    scheduler: each is named as what it is, not as a divergence, a 0 s cold start or a truncated curve."""
    import json
    import shutil

    def copy(name: str) -> Path:
        return Path(shutil.copytree(search, tmp_path / name, symlinks=True))

    gone = copy("gone")
    victim = sorted((gone / "trials").glob("*/metrics.csv"))[0]
    victim.unlink()
    with pytest.raises(CurveError, match="missing, though trial"):
        curves_of_search(gone)
    cut = copy("cut")
    lines = (cut / "results.csv").read_text().splitlines(keepends=True)
    (cut / "results.csv").write_text("".join(lines[:-1]))
    with pytest.raises(CurveError, match="truncated file"):
        curves_of_search(cut)
    stopped = copy("stopped")
    summary = json.loads((stopped / "summary.json").read_text())
    summary["trials_detail"][0]["stopped_early"] = True
    (stopped / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(CurveError, match="stopped early by its scheduler"):
        curves_of_search(stopped)


def test_validate_shows_what_the_sampler_does_at_each_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without max_concurrent_trials the cluster decides the concurrency: validate shows each scale."""
    search = _search(tmp_path, "tpe", "optuna", samples=64)
    assert main(["validate", str(search), "--no-data"]) == 0
    out = capsys.readouterr().out
    assert "1 at once: TPE after 10 random start-up trials" in out
    assert "8 at once: TPE after 16 random start-up trials" in out
    assert "32 at once: all 64 trials random (random search)" in out
    doc = yaml.safe_load(search.read_text())
    doc["search"]["max_concurrent_trials"] = 4
    search.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(search), "--no-data"]) == 0
    assert "optuna (TPE after 10 random start-up trials)" in capsys.readouterr().out
    doc["search"]["max_concurrent_trials"], doc["search"]["num_samples"] = 16, 128
    search.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(search), "--no-data"]) == 0
    assert "optuna (all 128 trials random (random search))" in capsys.readouterr().out  # 8 rounds at 16
    doc["search"]["num_samples"] = 144
    search.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(search), "--no-data"]) == 0
    assert "optuna (TPE after 32 random start-up trials)" in capsys.readouterr().out  # 9 rounds: TPE models


def test_an_earlier_simulation_is_replaced_only_with_overwrite(
    tmp_path: Path, table_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = _search(tmp_path, "random", "random", samples=4)
    out = tmp_path / "o"
    argv = ["simulate", str(search), "--curves", str(table_file), "--workers", "2", "--seeds", "1", "--out", str(out)]
    assert main(argv) == 0
    before = {p: _sha(p) for p in out.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0] and str(out) in err[0], err
    assert {p: _sha(p) for p in out.iterdir() if p.is_file()} == before
    assert main([*argv, "--overwrite"]) == 0


def test_a_simulation_estimated_past_the_bound_is_refused_before_any_work(
    tmp_path: Path, table_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = _search(tmp_path, "random", "random")
    out = tmp_path / "o"
    argv = ["simulate", str(search), "--curves", str(table_file), "--workers", "2", "--out", str(out)]
    assert main([*argv, "--samples", "1000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hours to simulate" in err[0] and "--max-hours" in err[0], err
    assert not out.exists()
    assert main([*argv, "--samples", "4", "--seeds", "1", "--max-hours", "0"]) == 2
    assert "--max-hours" in capsys.readouterr().err


def test_a_best_not_yet_reported_and_a_target_never_reached_read_as_words() -> None:
    """Nothing reported by 25 % of the horizon is "not yet", not ``inf`` (or ``-inf``)."""
    from distmis.simulate import analyse
    from distmis.simulate.study import table_text

    runs = {
        "m": {
            0: {
                "events": [(50.0, 0.4), (90.0, 0.6)],
                "intervals": [(0.0, 100.0)],
                "epochs": 2,
                "trials": 1,
                "wall": 100.0,
            }
        }
    }
    table = analyse(runs, 0.9, 1.0, horizon=(100.0, "given"))
    row = next(line for line in table_text(table, "val_dice").splitlines() if line.startswith("| m |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2].startswith("never") and cells[4].startswith("not yet"), cells
    assert cells[5].startswith("0.4000") and "inf" not in row, cells


def test_a_table_names_the_recipe_it_was_recorded_with_and_a_search_of_another_is_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first line of a table names its recipe; simulating a search that trains another recipe's
    network says so beside the figures; an unknown recipe is one error line."""
    table = write_table(_table(), tmp_path / "curves.csv.gz", recipe="distmis")
    assert read_table(table).recipe == "distmis"
    shipped = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "curves").glob("*.csv.gz"))
    assert shipped and {read_table(p).recipe for p in shipped} == {"distmis"}

    search = _search(tmp_path, "random", "random", samples=4)
    doc = yaml.safe_load(search.read_text())
    doc["model"] = {"activation": "leaky_relu", "downsample": "strided", "norm": "instance"}
    nnunet_like = tmp_path / "nnunet_like.yaml"
    nnunet_like.write_text(yaml.safe_dump(doc, sort_keys=False))
    for path, warned in ((search, False), (nnunet_like, True)):
        out = tmp_path / f"sim-{path.stem}"
        rc = main(["simulate", str(path), "--curves", str(table), "--workers", "2", "--seeds", "1", "--out", str(out)])
        assert rc == 0
        said = (out / "summary.md").read_text()
        assert "recorded with the distmis recipe" in said
        assert ("warning: the curves were recorded with the distmis recipe" in said) is warned, said

    bad = tmp_path / "other.csv"
    bad.write_text("# recipe: resnet\n" + gzip.decompress(table.read_bytes()).decode().split("\n", 1)[1])
    capsys.readouterr()
    out = tmp_path / "sim-bad"
    rc = main(["simulate", str(search), "--curves", str(bad), "--workers", "2", "--seeds", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "recipe 'resnet'" in err and "Traceback" not in err and not out.exists()
