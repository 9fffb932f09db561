"""How `init` spends its timings of a step on a short budget: which patches it times, with how many
trials at once, and which it keeps. The step here is a stated function of the patch (what
``--step-seconds`` or the timer hands the plan), so that each rule is checked at the figures that
trigger it; tests/adversarial/test_init.py times real steps."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

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
