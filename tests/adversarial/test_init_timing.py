"""How `init` spends its timings of a step on a short budget: which patches it times, with how many
trials at once, and which it keeps. The step here is a stated function of the patch (what
``--step-seconds`` or the timer hands the plan), so that each rule is checked at the figures that
trigger it; tests/adversarial/test_init.py times real steps."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_msd

from distmis.data import MIN_TRIAL_STEPS, PlanOptions, fingerprint, plan_search, read_dataset_json

Step = Callable[[int, tuple[int, int, int], int, int], float]


def _plan(raw: Path, step: Step, budget_seconds: float) -> tuple[dict, list[tuple[tuple[int, int, int], int]]]:
    """The plan's file as data, and every (patch, trials at once) the plan asked the step of, in order."""
    asked: list[tuple[tuple[int, int, int], int]] = []

    def timed(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        asked.append((tuple(patch), at_once))  # type: ignore[arg-type]
        return step(filters, patch, batch, at_once)

    options = PlanOptions(budget_seconds=budget_seconds, budget_text="5m", step_seconds=timed, step_timed=True)
    modalities = list(read_dataset_json(raw).modalities)
    text = plan_search(fingerprint(raw, workers=1), source="raw", name="t", modalities=modalities, options=options)
    return {"data": yaml.safe_load(text), "text": text}, asked


def _steps(plan: dict) -> int:
    train = plan["data"]["train"]
    return int(train["epochs"] * train["steps_per_epoch"])


def _seconds(plan: dict) -> float:
    return float(re.search(r"at ([0-9.]+) s a step", plan["text"]).group(1))  # type: ignore[union-attr]


def test_the_memorys_patch_is_timed_alone_only_where_its_trial_could_get_its_steps(tmp_path: Path) -> None:
    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        return 1e-5 * math.prod(patch) * at_once  # a linear speed-up: the halved estimate is right

    # 300 s buy 2 x 240 / 2.95 s = 163 steps at 2 at once: under 250 even at a linear speed-up
    plan, asked = _plan(raw, step, 300)
    assert asked[0] == ((48, 64, 48), 2) and ((48, 64, 48), 1) not in asked, asked
    assert all(at_once == 1 for _, at_once in asked[1:]) and len(asked) == 2, asked
    assert plan["data"]["train"]["patch"] != [48, 64, 48] and _steps(plan) >= MIN_TRIAL_STEPS
    # 600 s buy 326 steps at 2 at once: one trial may get 250, so the whole volume is timed alone, as it will step
    plan, asked = _plan(raw, step, 600)
    assert asked == [((48, 64, 48), 2), ((48, 64, 48), 1)], asked
    assert plan["data"]["train"]["patch"] == [48, 64, 48] and plan["data"]["search"]["max_concurrent_trials"] == 1


def test_a_smaller_patch_still_short_of_its_steps_shrinks_once_more(tmp_path: Path) -> None:
    """A step's fixed cost makes a small patch slower than its work says: the first smaller patch,
    timed, leaves the trial short, so the patch shrinks again from that timing and is timed again."""
    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        return (0.3 + 1e-5 * math.prod(patch)) * (1.6 if at_once > 1 else 1.0)

    plan, asked = _plan(raw, step, 300)
    assert [at_once for _, at_once in asked] == [2, 1, 1], asked
    first, second = asked[1][0], asked[2][0]
    assert math.prod(second) < math.prod(first) < 48 * 64 * 48, asked
    assert plan["data"]["train"]["patch"] == list(second) and _seconds(plan) == round(step(8, second, 2, 1), 2)


def test_a_smaller_patch_that_times_slower_is_not_kept(tmp_path: Path) -> None:
    """A 5-second timing varies by a fifth: where the second smaller patch times slower than the first,
    it would buy fewer steps, so the first stays."""
    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))
    first: list[tuple[int, int, int]] = []

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        if at_once > 1:
            return 1.6e-5 * math.prod(patch)
        if patch != (48, 64, 48) and not first:
            first.append(patch)
            return 1.2  # too slow for 250 steps in 240 s
        return 1.5 if first and patch != first[0] else 1.2

    plan, asked = _plan(raw, step, 300)
    assert len(asked) == 3 and first, asked
    assert plan["data"]["train"]["patch"] == list(first[0]) and _seconds(plan) == 1.2, plan["text"]


def test_trials_share_a_cpus_cores_only_when_each_keeps_four_nnunet_epochs(tmp_path: Path) -> None:
    """On a CPU, two trials at once that would each get under 1,000 steps give way to one on every core,
    timed again that way, and the file says why; from 1,000 steps each they share the cores. With
    ``--finalize`` (whose folds run at the search's parallelism), one nnU-Net epoch each is enough, as
    before."""
    from distmis.data import AT_ONCE_TRIAL_STEPS

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))
    fp, modalities = fingerprint(raw, workers=1), list(read_dataset_json(raw).modalities)

    def plan(budget_seconds: float, **options: Any) -> tuple[dict, list[int], str]:
        asked: list[int] = []

        def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
            asked.append(at_once)
            return 0.38 if at_once > 1 else 0.21  # two at once step no more in all than one on both cores

        o = PlanOptions(budget_seconds=budget_seconds, budget_text="B", step_seconds=step, step_timed=True, **options)
        text = plan_search(fp, source="raw", name="t", modalities=modalities, options=o)
        return yaml.safe_load(text), asked, text

    # 5 minutes buy 2 x 240 s / 0.38 s = 1,263 steps at 2 at once: 630 each, so one trial on both cores
    for budget in (120, 300):
        data, asked, text = plan(budget)
        assert asked == [2, 1] and data["search"]["max_concurrent_trials"] == 1, (asked, text)
        assert data["search"]["num_samples"] == 1 and data["parallelism"]["cpus_per_worker"] == 2
        steps = data["train"]["epochs"] * data["train"]["steps_per_epoch"]
        assert steps == pytest.approx(budget * 0.8 / 0.21, rel=0.03) and "at 0.21 s a step" in text, text
        assert f"2 at once would leave each trial under {AT_ONCE_TRIAL_STEPS} steps" in text
    # 10 minutes buy 1,260 each at 2 at once: they share the cores
    data, asked, text = plan(600)
    assert asked == [2] and data["search"]["max_concurrent_trials"] == 2, (asked, text)
    assert data["parallelism"]["cpus_per_worker"] == 1 and "at once would leave" not in text
    # with --finalize, 250 steps each are enough to run at once
    data, asked, text = plan(240, finalize=True)
    assert data["search"]["max_concurrent_trials"] == 2 and asked == [2], (asked, text)
    assert data["train"]["epochs"] * data["train"]["steps_per_epoch"] < AT_ONCE_TRIAL_STEPS, text


def test_fewer_trials_at_once_are_kept_only_where_the_cores_speed_them_up(tmp_path: Path) -> None:
    """Fewer trials at once buy longer trials only where the cores the others leave speed them up: timed
    at under two thirds of the steps in all that every slot steps at once (a trial's threads scale
    worse than linearly on many cores), all of them run after all, and the file says why; at two
    thirds or more, fewer run. Where each trial at once would be short of an nnU-Net epoch, fewer run
    whatever the speed-up."""
    from distmis.data import AT_ONCE_KEPT_SHARE, AT_ONCE_TRIAL_STEPS

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))
    fp, modalities = fingerprint(raw, workers=1), list(read_dataset_json(raw).modalities)

    def plan(budget_seconds: float, steps: dict[int, float], slots: int) -> tuple[dict, list[int], str]:
        asked: list[int] = []

        def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
            asked.append(at_once)
            return steps[at_once]

        o = PlanOptions(
            budget_seconds=budget_seconds, budget_text="B", step_seconds=step, step_timed=True, concurrency=slots
        )
        text = plan_search(fp, source="raw", name="t", modalities=modalities, options=o)
        return yaml.safe_load(text), asked, text

    # 5 minutes at 0.38 s a step with 2 at once: 630 steps each; alone at 0.30 s, 800 (63 % as much in all)
    data, asked, text = plan(300, {2: 0.38, 1: 0.30}, 2)
    assert asked == [2, 1] and data["search"]["max_concurrent_trials"] == 2, (asked, text)
    assert data["search"]["num_samples"] == 2 and data["parallelism"]["cpus_per_worker"] == 1
    assert _steps({"data": data}) == pytest.approx(2 * 240 / 0.38 / 2, rel=0.03) and "at 0.38 s a step" in text, text
    assert "1 at once on all the cores would step 63% as much in all" in text, text
    assert f"under {AT_ONCE_KEPT_SHARE:.0%}" in text and f"under {AT_ONCE_TRIAL_STEPS} steps" in text, text
    # alone at 0.25 s it steps 76 % as much in all: one trial of 960 steps
    data, asked, text = plan(300, {2: 0.38, 1: 0.25}, 2)
    assert data["search"]["max_concurrent_trials"] == 1 and data["parallelism"]["cpus_per_worker"] == 2, text
    assert _steps({"data": data}) == pytest.approx(240 / 0.25, rel=0.03) and "would step" not in text, text
    # 8 slots whose 3 trials at once (3 x 480 s / 0.8 s = 1,800 steps) step 47 % of what 8 do (3,840)
    data, asked, text = plan(600, {8: 1.0, 3: 0.8}, 8)
    assert asked == [8, 3] and data["search"]["max_concurrent_trials"] == 8, (asked, text)
    assert "3 at once on all the cores would step 47% as much in all" in text, text
    # each of 2 at once short of 250 steps (80 s at 0.38 s): one trial, however little faster alone
    data, asked, text = plan(100, {2: 0.38, 1: 0.30}, 2)
    assert data["search"]["max_concurrent_trials"] == 1 and "would step" not in text, (asked, text)


def test_a_short_budget_on_gpus_keeps_every_gpu_and_each_trial_in_its_time(tmp_path: Path) -> None:
    """A trial steps on its own GPU however many others run, so fewer at once would lengthen none: 8
    GPUs whose trials each buy under 250 steps of the whole volume all run, each on a smaller patch,
    and no trial is planned longer than the budget's training share."""
    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        return 0.05 + 4e-6 * math.prod(patch)  # 0.64 s for the whole volume: 150 steps in 96 s

    options = PlanOptions(
        budget_seconds=120, budget_text="2m", step_seconds=step, step_timed=True, gpu_memory_gb=80.0, concurrency=8
    )
    modalities = list(read_dataset_json(raw).modalities)
    text = plan_search(fingerprint(raw, workers=1), source="raw", name="t", modalities=modalities, options=options)
    data = yaml.safe_load(text)
    assert data["search"]["max_concurrent_trials"] == 8 and data["search"]["num_samples"] == 8, text
    patch = tuple(data["train"]["patch"])
    assert math.prod(patch) < 48 * 64 * 48, text
    steps = data["train"]["epochs"] * data["train"]["steps_per_epoch"]
    assert steps * step(8, patch, 2, 8) <= 120 * 0.8 * 1.01, (steps, patch, text)  # type: ignore[arg-type]
    assert steps >= MIN_TRIAL_STEPS * 0.99, (steps, patch, text)
