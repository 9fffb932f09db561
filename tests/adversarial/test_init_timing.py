"""How `init` spends its timings of a step on a short budget: which patches it times, with how many
trials at once, and which it keeps. The step here is a stated function of the patch (what
``--step-seconds`` or the timer hands the plan), so that each rule is checked at the figures that
trigger it; tests/adversarial/test_init.py times real steps."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_msd

from distmis.data import MIN_TRIAL_STEPS, PlanOptions, fingerprint, plan_search, read_dataset_json

Step = Callable[[int, tuple[int, int, int], int, int], float]


@dataclass(frozen=True)
class Planned:
    """init's file for a stated step: as data, as text, and every (patch, trials at once) it timed, in order."""

    data: dict
    text: str
    asked: list[tuple[tuple[int, int, int], int]]

    @property
    def at_once(self) -> list[int]:
        return [at_once for _, at_once in self.asked]

    @property
    def steps(self) -> int:
        return int(self.data["train"]["epochs"] * self.data["train"]["steps_per_epoch"])

    @property
    def seconds(self) -> float:
        return float(re.search(r"at ([0-9.]+) s a step", self.text).group(1))  # type: ignore[union-attr]


@cache
def _dataset(raw: Path) -> tuple[dict[str, Any], list[str]]:
    """The dataset's fingerprint and modalities, taken once for the several plans a test makes of it."""
    return fingerprint(raw, workers=1), list(read_dataset_json(raw).modalities)


def _plan(raw: Path, step: Step, budget_seconds: float, **options: Any) -> Planned:
    """Plans `raw` for `budget_seconds` with `step` as the timer, as init does with its own timings."""
    asked: list[tuple[tuple[int, int, int], int]] = []

    def timed(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        asked.append((tuple(patch), at_once))  # type: ignore[arg-type]
        return step(filters, patch, batch, at_once)

    options.setdefault("budget_text", "B")
    chosen = PlanOptions(budget_seconds=budget_seconds, step_seconds=timed, step_timed=True, **options)
    fp, modalities = _dataset(raw)
    text = plan_search(fp, source="raw", name="t", modalities=modalities, options=chosen)
    return Planned(yaml.safe_load(text), text, asked)


def test_the_memorys_patch_is_timed_alone_only_where_its_trial_could_get_its_steps(tmp_path: Path) -> None:
    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        return 1e-5 * math.prod(patch) * at_once  # a linear speed-up: the halved estimate is right

    # 300 s buy 2 x 240 / 2.95 s = 163 steps at 2 at once: under 250 even at a linear speed-up
    plan = _plan(raw, step, 300)
    assert plan.asked[0] == ((48, 64, 48), 2) and ((48, 64, 48), 1) not in plan.asked, plan.asked
    assert plan.at_once == [2, 1], plan.asked
    assert plan.data["train"]["patch"] != [48, 64, 48] and plan.steps >= MIN_TRIAL_STEPS
    # 600 s buy 326 steps at 2 at once: one trial may get 250, so the whole volume is timed alone, as it will step
    plan = _plan(raw, step, 600)
    assert plan.asked == [((48, 64, 48), 2), ((48, 64, 48), 1)], plan.asked
    assert plan.data["train"]["patch"] == [48, 64, 48] and plan.data["search"]["max_concurrent_trials"] == 1


def test_a_smaller_patch_still_short_of_its_steps_shrinks_once_more(tmp_path: Path) -> None:
    """A step's fixed cost makes a small patch slower than its work says: the first smaller patch,
    timed, leaves the trial short, so the patch shrinks again from that timing and is timed again."""
    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        return (0.3 + 1e-5 * math.prod(patch)) * (1.6 if at_once > 1 else 1.0)

    plan = _plan(raw, step, 300)
    assert plan.at_once == [2, 1, 1], plan.asked
    first, second = plan.asked[1][0], plan.asked[2][0]
    assert math.prod(second) < math.prod(first) < 48 * 64 * 48, plan.asked
    assert plan.data["train"]["patch"] == list(second) and plan.seconds == round(step(8, second, 2, 1), 2)


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

    plan = _plan(raw, step, 300)
    assert len(plan.asked) == 3 and first, plan.asked
    assert plan.data["train"]["patch"] == list(first[0]) and plan.seconds == 1.2, plan.text


def test_trials_share_a_cpus_cores_only_when_each_keeps_four_nnunet_epochs(tmp_path: Path) -> None:
    """On a CPU, two trials at once that would each get under 1,000 steps give way to one on every core,
    timed again that way, and the file says why; from 1,000 steps each they share the cores. With
    ``--finalize`` (whose folds run at the search's parallelism), one nnU-Net epoch each is enough, as
    before."""
    from distmis.data import AT_ONCE_TRIAL_STEPS

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        return 0.38 if at_once > 1 else 0.21  # two at once step no more in all than one on both cores

    # 5 minutes buy 2 x 240 s / 0.38 s = 1,263 steps at 2 at once: 630 each, so one trial on both cores
    for budget in (120, 300):
        plan = _plan(raw, step, budget)
        assert plan.at_once == [2, 1] and plan.data["search"]["max_concurrent_trials"] == 1, plan.text
        assert plan.data["search"]["num_samples"] == 1 and plan.data["parallelism"]["cpus_per_worker"] == 2
        assert plan.steps == pytest.approx(budget * 0.8 / 0.21, rel=0.03) and "at 0.21 s a step" in plan.text, plan.text
        assert f"2 at once would leave each trial under {AT_ONCE_TRIAL_STEPS} steps" in plan.text
    # 10 minutes buy 1,260 each at 2 at once: they share the cores
    plan = _plan(raw, step, 600)
    assert plan.at_once == [2] and plan.data["search"]["max_concurrent_trials"] == 2, plan.text
    assert plan.data["parallelism"]["cpus_per_worker"] == 1 and "at once would leave" not in plan.text
    # with --finalize, 250 steps each are enough to run at once
    plan = _plan(raw, step, 240, finalize=True)
    assert plan.data["search"]["max_concurrent_trials"] == 2 and plan.at_once == [2], plan.text
    assert plan.steps < AT_ONCE_TRIAL_STEPS, plan.text


def test_fewer_trials_at_once_are_kept_only_where_the_cores_speed_them_up(tmp_path: Path) -> None:
    """Fewer trials at once buy longer trials only where the cores the others leave speed them up: timed
    at under two thirds of the steps in all that every slot steps at once (a trial's threads scale
    worse than linearly on many cores), all of them run after all, and the file says why; at two
    thirds or more, fewer run. Where each trial at once would be short of an nnU-Net epoch, fewer run
    whatever the speed-up."""
    from distmis.data import AT_ONCE_KEPT_SHARE, AT_ONCE_TRIAL_STEPS

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))

    def at(seconds: dict[int, float]) -> Step:
        """A step that takes `seconds[n]` with n trials at once."""
        return lambda filters, patch, batch, at_once: seconds[at_once]

    # 5 minutes at 0.38 s a step with 2 at once: 630 steps each; alone at 0.30 s, 800 (63 % as much in all)
    plan = _plan(raw, at({2: 0.38, 1: 0.30}), 300, concurrency=2)
    assert plan.at_once == [2, 1] and plan.data["search"]["max_concurrent_trials"] == 2, plan.text
    assert plan.data["search"]["num_samples"] == 2 and plan.data["parallelism"]["cpus_per_worker"] == 1
    assert plan.steps == pytest.approx(2 * 240 / 0.38 / 2, rel=0.03) and "at 0.38 s a step" in plan.text, plan.text
    assert "1 at once on all the cores would step 63% as much in all" in plan.text, plan.text
    assert f"under {AT_ONCE_KEPT_SHARE:.0%}" in plan.text and f"under {AT_ONCE_TRIAL_STEPS} steps" in plan.text
    # alone at 0.25 s it steps 76 % as much in all: one trial of 960 steps
    plan = _plan(raw, at({2: 0.38, 1: 0.25}), 300, concurrency=2)
    assert plan.data["search"]["max_concurrent_trials"] == 1 and plan.data["parallelism"]["cpus_per_worker"] == 2
    assert plan.steps == pytest.approx(240 / 0.25, rel=0.03) and "would step" not in plan.text, plan.text
    # 8 slots whose 3 trials at once (3 x 480 s / 0.8 s = 1,800 steps) step 47 % of what 8 do (3,840)
    plan = _plan(raw, at({8: 1.0, 3: 0.8}), 600, concurrency=8)
    assert plan.at_once == [8, 3] and plan.data["search"]["max_concurrent_trials"] == 8, plan.text
    assert "3 at once on all the cores would step 47% as much in all" in plan.text, plan.text
    # each of 2 at once short of 250 steps (80 s at 0.38 s): one trial, however little faster alone
    plan = _plan(raw, at({2: 0.38, 1: 0.30}), 100, concurrency=2)
    assert plan.data["search"]["max_concurrent_trials"] == 1 and "would step" not in plan.text, plan.text


def test_a_short_budget_on_gpus_keeps_every_gpu_and_each_trial_in_its_time(tmp_path: Path) -> None:
    """A trial steps on its own GPU however many others run, so fewer at once would lengthen none: 8
    GPUs whose trials each buy under 250 steps of the whole volume all run, each on a smaller patch,
    and no trial is planned longer than the budget's training share."""
    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))

    def step(filters: int, patch: tuple[int, int, int], batch: int, at_once: int) -> float:
        return 0.05 + 4e-6 * math.prod(patch)  # 0.64 s for the whole volume: 150 steps in 96 s

    plan = _plan(raw, step, 120, budget_text="2m", gpu_memory_gb=80.0, concurrency=8)
    assert plan.data["search"]["max_concurrent_trials"] == 8 and plan.data["search"]["num_samples"] == 8, plan.text
    patch = tuple(plan.data["train"]["patch"])
    assert math.prod(patch) < 48 * 64 * 48, plan.text
    assert plan.steps * step(8, patch, 2, 8) <= 120 * 0.8 * 1.01, (plan.steps, patch, plan.text)  # type: ignore[arg-type]
    assert plan.steps >= MIN_TRIAL_STEPS * 0.99, (plan.steps, patch, plan.text)
