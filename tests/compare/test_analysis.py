"""The comparison's arithmetic on hand-made records (speed-up, efficiency, time to target)."""

from __future__ import annotations

import pytest

from distmis.compare import EpochPoint, ModeRecord, TrialRecord, analyse, best_so_far, same_configurations


def _mode(
    name: str, start: float, wall: float, trials: list[TrialRecord], workers: int = 1, at_once: int = 1
) -> ModeRecord:
    return ModeRecord(
        name=name,
        workers_per_trial=workers,
        concurrent_trials=at_once,
        cpus_per_worker=1,
        gpus_per_worker=0,
        started_at=start,
        wall_seconds=wall,
        metric="val_dice",
        batch_size_per_replica=2,
        lr_scaling="none",
        steps_per_epoch=None,
        trials=trials,
    )


def _trial(
    tid: str, lr: float, start: float, end: float, epochs: list[tuple[float, float]], stopped: bool = False
) -> TrialRecord:
    return TrialRecord(tid, {"lr": lr}, "TERMINATED", stopped, start, end, [EpochPoint(t, v, 10.0) for t, v in epochs])


def test_speedup_efficiency_and_time_to_target_by_hand() -> None:
    # baseline: fixed cost 4 s, trial phase 6 s for 20 samples -> 0.3 s per sample
    baseline = _mode("baseline", 0.0, 10.0, [_trial("b0", 0.1, 4.0, 10.0, [(6.0, 0.5), (10.0, 0.7)])])
    # experiment: 2 trials at once, 40 samples -> sequential estimate 4 + 0.3 * 40 = 16 s, wall 8 s
    experiment = _mode(
        "experiment",
        100.0,
        8.0,
        [
            _trial("e0", 0.1, 103.0, 107.0, [(105.0, 0.5), (107.0, 0.72)]),
            _trial("e1", 0.2, 103.0, 108.0, [(106.0, 0.71), (108.0, 0.6)]),
        ],
        at_once=2,
    )
    # data: 1 trial x 2 workers, the other configuration stopped after one epoch; wall 20 s
    data = _mode(
        "data",
        200.0,
        20.0,
        [
            _trial("d0", 0.1, 205.0, 212.0, [(210.0, 0.4), (212.0, 0.65)]),
            _trial("d1", 0.2, 213.0, 218.0, [(218.0, 0.3)], stopped=True),
        ],
        workers=2,
    )
    target, stats = analyse({"baseline": baseline, "experiment": experiment, "data": data}, slots=2)
    by = {s.mode: s for s in stats}
    assert target == pytest.approx(0.7)  # the baseline's best
    assert by["baseline"].speedup == pytest.approx(1.0)
    assert by["experiment"].sequential_estimate_seconds == pytest.approx(16.0)
    assert by["experiment"].speedup == pytest.approx(2.0) and by["experiment"].efficiency == pytest.approx(1.0)
    assert by["experiment"].trial_phase_speedup == pytest.approx(12.0 / 5.0)
    assert by["experiment"].time_to_target_seconds == pytest.approx(6.0)  # e1 reached 0.71 at t=106
    assert by["experiment"].best_value == pytest.approx(0.72)
    assert by["data"].speedup == pytest.approx((4 + 0.3 * 30) / 20.0)
    assert by["data"].time_to_target_seconds is None  # never reached 0.7
    assert (by["data"].finished, by["data"].stopped_early, by["data"].global_batch) == (1, 1, 4)
    assert by["experiment"].samples_per_second == pytest.approx(40 / 5.0)
    assert best_so_far(experiment) == [(5.0, 0.5), (6.0, 0.71), (7.0, 0.72), (8.0, 0.72)]
    assert same_configurations({"experiment": experiment, "data": data})
    data.trials[1].params = {"lr": 0.3}
    assert not same_configurations({"experiment": experiment, "data": data})
    assert analyse({"experiment": experiment}, slots=2, target=0.9)[1][0].time_to_target_seconds is None
