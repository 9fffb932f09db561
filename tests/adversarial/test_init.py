"""``distmis init``: a search file planned from the data, each rule visible, and never over a user's file."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import yaml
from conftest import Assets, Workspace, check_case, run_distmis, write_msd

pytestmark = pytest.mark.slow


def _init(tmp_path: Path, raw: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """init run as a user runs it, its file checked as init's own and valid; the run, for what it said."""
    result = run_distmis(["init", str(raw), "--out", "plan.yaml", *extra], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "plan.yaml").read_text()
    assert text.startswith("# written by distmis init")
    valid = run_distmis(["validate", "plan.yaml"], cwd=tmp_path)
    assert valid.returncode == 0, valid.stdout[-2000:] + valid.stderr[-2000:]
    return result


def _plan(tmp_path: Path, raw: Path, *extra: str) -> dict:
    _init(tmp_path, raw, *extra)
    return yaml.safe_load((tmp_path / "plan.yaml").read_text())


def test_the_plan_follows_the_data(tmp_path: Path) -> None:
    """Two foreground labels -> multi-class with Dice + CE; a volume that fits -> the whole volume as
    the patch; a small GPU -> a smaller patch with foreground oversampling; the source is the data."""
    raw = write_msd(tmp_path / "raw", cases=6, shape=(48, 40, 36))
    plan = _plan(tmp_path, raw)
    assert plan["data"]["source"] == "raw"
    assert plan["data"]["prepare"]["label_mode"] == "multiclass" and plan["train"]["loss"] == "dice_ce"
    assert plan["data"]["prepare"]["shape"] == [48, 40, 36]
    assert plan["train"]["patch"] == [48, 40, 36] and plan["train"]["foreground_oversampling"] == 0.0
    # nnU-Net's depth (3 halvings to 4-voxel maps at 36) rounds the median shape up to a multiple of 8
    nn = _plan(tmp_path, raw, "--recipe", "nnunet", "--overwrite")
    assert nn["data"]["prepare"]["shape"] == [48, 40, 40] and nn["model"]["depth"] == 4
    assert plan["model"]["norm"] == "instance"  # distmis's recipe, the measured default
    assert plan["parallelism"]["gpus_per_worker"] == 0
    small = _plan(tmp_path, raw, "--gpu-memory", "0.02", "--overwrite")
    patch = small["train"]["patch"]
    assert all(p <= s for p, s in zip(patch, [48, 40, 36], strict=True)) and patch != [48, 40, 36]
    assert small["train"]["foreground_oversampling"] > 0 and small["parallelism"]["gpus_per_worker"] == 1
    assert small["train"]["validation"] == "patch" and plan["train"]["validation"] == "window"


def test_thick_slices_get_nnunets_pooling_and_kernels(tmp_path: Path) -> None:
    """Slices 3x thicker than the pixels: init writes nnU-Net's planner's pools and kernels for the spacing
    (the thick axis neither halved nor convolved with 3 at the first level), rounds the shape up only to
    what those pools need along each axis, and the file trains as written."""
    from distmis.config import load_config

    raw = write_msd(tmp_path / "raw", cases=6, shape=(40, 36, 10), spacing=(1.0, 1.0, 3.0))
    for recipe in ("distmis", "nnunet"):
        plan = _plan(tmp_path, raw, "--recipe", recipe, "--overwrite")
        model = plan["model"]
        assert model["pools"][0] == [2, 2, 1] and model["kernels"][0] == [3, 3, 1]
        assert len(model["pools"]) == model["depth"] - 1 and len(model["kernels"]) == model["depth"]
        config = load_config(tmp_path / "plan.yaml", require_space=True)
        divisors = config.model.divisors()
        assert divisors[2] < divisors[0], divisors  # the thick axis is pooled fewer times
        assert plan["data"]["prepare"]["shape"] == [
            math.ceil(s / d) * d for s, d in zip((40, 36, 10), divisors, strict=True)
        ]
        assert "anisotropic spacing [1.0, 1.0, 3.0] mm" in (tmp_path / "plan.yaml").read_text()
    # the nnunet recipe's thick-slice plan, trained one step as written
    plan["train"] |= {"epochs": 1, "steps_per_epoch": 1}
    (tmp_path / "thick.yaml").write_text(yaml.safe_dump(plan))
    env = {"DISTMIS_DATA_HOME": str(tmp_path / "cache"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    trained = run_distmis(["train", "thick.yaml", "--out", "run"], cwd=tmp_path, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    iso = _plan(tmp_path, write_msd(tmp_path / "iso", cases=6, shape=(40, 36, 10)), "--overwrite")
    assert "pools" not in iso["model"] and "kernels" not in iso["model"]


def test_the_patch_is_sized_at_the_batch_that_trains(tmp_path: Path) -> None:
    """A dataset that leaves one case to train plans a batch of 1, so the same GPU memory holds a
    larger patch than at nnU-Net's batch of 2, and the estimate init states still fits the budget."""
    plans = {}
    for cases in (3, 6):
        raw = write_msd(tmp_path / f"raw{cases}", cases=cases, shape=(48, 40, 36))
        plans[cases] = _plan(tmp_path, raw, "--gpu-memory", "0.02", "--overwrite")
        text = (tmp_path / "plan.yaml").read_text()
        estimate = re.search(r"~([0-9.]+) GiB", text)
        assert estimate and float(estimate.group(1)) <= 0.02, text
    assert plans[3]["train"]["batch_size_per_replica"] == 1 and plans[6]["train"]["batch_size_per_replica"] == 2
    assert math.prod(plans[3]["train"]["patch"]) > math.prod(plans[6]["train"]["patch"])


def test_one_label_plans_a_binary_dice_bce_search(tmp_path: Path) -> None:
    raw = write_msd(tmp_path / "raw", cases=4, shape=(16, 16, 16))
    meta = json.loads((raw / "dataset.json").read_text())
    meta["labels"] = {"0": "background", "1": "lesion"}
    (raw / "dataset.json").write_text(json.dumps(meta))
    for entry in meta["training"]:
        path = raw / entry["label"]
        label = np.asarray(nib.load(path).dataobj)
        nib.save(nib.Nifti1Image((label > 0).astype(np.uint8), np.eye(4)), path)
    plan = _plan(tmp_path, raw)
    assert plan["data"]["prepare"]["label_mode"] == "binary" and plan["train"]["loss"] == "dice_bce"


def test_brats_labels_plan_the_tumour_regions(tmp_path: Path) -> None:
    result = run_distmis(["synth", "brats", "--cases", "4", "--shape", "16,16,16"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = _plan(tmp_path, tmp_path / "brats")
    assert plan["data"]["regions"] == "msd_task01" and plan["data"]["prepare"]["label_mode"] == "regions"
    # the BraTS challenges' own numbering: 1 necrotic core, 2 edema, 4 enhancing (no 3)
    raw = tmp_path / "brats"
    meta = json.loads((raw / "dataset.json").read_text())
    meta["labels"] = {"0": "background", "1": "NCR (necrotic tumour core)", "2": "ED (peritumoral edema)",
                      "4": "ET (GD-enhancing tumour)"}  # fmt: skip
    (raw / "dataset.json").write_text(json.dumps(meta))
    renumber = np.array([0, 2, 1, 4], dtype=np.uint8)  # MSD's 1 edema, 2 non-enhancing, 3 enhancing
    for entry in meta["training"]:
        path = raw / entry["label"]
        image = nib.load(path)
        nib.save(nib.Nifti1Image(renumber[np.asarray(image.dataobj).astype(np.intp)], image.affine), path)
    plan = _plan(tmp_path, raw, "--overwrite")
    assert plan["data"]["regions"] == "brats21" and plan["data"]["prepare"]["label_mode"] == "regions"
    assert "# WT = 1,2,4; TC = 1,4; ET = 4" in (tmp_path / "plan.yaml").read_text()


def test_init_never_replaces_a_file_it_did_not_write(assets: Assets, tmp_path: Path) -> None:
    ws = Workspace(tmp_path, assets)
    ws.raw("data")
    ws.file("mine.yaml", "name: my own search\n")
    check_case("init-over-own", "init", ws, ["init", "data", "--out", "mine.yaml", "--overwrite"], "mine.yaml")
    check_case("init-exists", "init", ws, ["init", "data", "--out", "mine.yaml"], "--overwrite")
    check_case("init-into-data", "init", ws, ["init", "data", "--out", "data/plan.yaml"], "inside the dataset")
    check_case("init-no-dataset", "init", ws, ["init", "nothere", "--out", "x.yaml"], "nothere")
    (ws.dir / "link.yaml").symlink_to(ws.dir / "mine.yaml")
    check_case("init-through-link", "init", ws, ["init", "data", "--out", "link.yaml"], "link.yaml")


def _claims(tmp_path: Path, raw: Path, *extra: str):
    """init's file, read back through the config loader as tune reads it, with its text."""
    from distmis.config import apply_params, load_config

    _plan(tmp_path, raw, "--overwrite", *extra)
    config = load_config(tmp_path / "plan.yaml", require_space=True)
    return config, apply_params(config, config.search.points[0]), (tmp_path / "plan.yaml").read_text()


def test_what_init_comments_is_what_the_file_resolves_to(tmp_path: Path) -> None:
    """Each claim of init's comments checked against the resolved configuration, with and without a budget."""
    from distmis.data import MIN_TRIAL_STEPS
    from distmis.recipes import NNUNET

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))
    config, first, text = _claims(tmp_path, raw, "--recipe", "nnunet")
    # "no early stopping: every trial runs all its epochs"
    assert "no early stopping" in text and config.search.scheduler.type == "none"
    # "no --budget: 8 trials of 12 epochs, each at least 250 steps"
    assert config.search.num_samples == 8 and config.train.epochs == 12
    assert config.train.epochs * config.train.steps_per_epoch >= MIN_TRIAL_STEPS
    assert config.search.time_budget is None
    # "the nnunet recipe's own configuration, tried first": the first trial is nnU-Net's configuration
    assert first.optimizer.name == "sgd" and first.optimizer.nesterov and first.optimizer.lr == NNUNET.optimizer["lr"]
    assert first.optimizer.momentum == 0.99 and first.optimizer.weight_decay == 3e-5
    assert first.model.deep_supervision and first.model.norm == "instance" and first.model.activation == "leaky_relu"
    assert first.model.downsample == "strided" and first.model.max_filters == 320
    assert first.train.lr_schedule == "poly"
    # "fewer than 20 labelled cases: most of them train"
    assert list(config.data.prepare.split) == [0.8, 0.1, 0.1]
    # "the whole volume ... nothing to centre"
    assert list(config.train.patch) == list(config.data.prepare.shape) and config.train.foreground_oversampling == 0
    # "depth 3 for the smallest side 32": nnU-Net's rule, deepest maps >= 4 voxels
    assert config.model.depth == 4 and 32 / 2 ** (config.model.depth - 1) >= 4
    # distmis's recipe, the default
    old, old_first, _ = _claims(tmp_path, raw)
    assert old.model.norm == "instance" and old.optimizer.name == "adam" and not old_first.model.deep_supervision
    assert old.model.activation == "relu" and old.model.downsample == "maxpool" and old.model.filters == 8


def test_a_budget_is_spent_on_trials_that_train(tmp_path: Path) -> None:
    """--budget with a given step time: the trials fit the budget, none is shorter than one nnU-Net epoch
    when the budget allows, and the deadline is in the file."""
    from distmis.data import MIN_TRIAL_STEPS, TRAINING_SHARE

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))
    for budget, seconds, workers in (("5m", 0.3, 2), ("20m", 0.3, 2), ("24h", 2.0, 8), ("2m", 5.0, 2)):
        config, _, text = _claims(
            tmp_path, raw, "--budget", budget, "--step-seconds", str(seconds), "--workers", str(workers),
            "--recipe", "nnunet",
        )  # fmt: skip
        assert config.search.time_budget == budget
        budget_s = config.search.time_budget_seconds()
        trial_steps = config.train.epochs * config.train.steps_per_epoch
        concurrency = config.search.max_concurrent_trials
        rounds = -(-config.search.num_samples // concurrency)
        # --step-seconds is the recipe's 32-filter step; a CPU plan may narrow it, at the square of the width
        step = seconds * (config.model.filters / 32) ** 2
        assert f"{step:.2f} s a step ({config.model.filters} filters)" in text
        # in step-seconds over the --workers slots: fewer trials at once get the idle slots' cores
        assert rounds * trial_steps * step * concurrency <= budget_s * TRAINING_SHARE * workers + 1e-6, (budget, text)
        if budget_s * TRAINING_SHARE * concurrency / step >= MIN_TRIAL_STEPS:
            assert trial_steps >= MIN_TRIAL_STEPS * 0.99, (budget, trial_steps)
        assert config.search.scheduler.type == "none"
    bad = run_distmis(["init", str(raw), "--out", "bad.yaml", "--budget", "soon"], cwd=tmp_path)
    assert bad.returncode == 2 and "--budget" in bad.stderr and not (tmp_path / "bad.yaml").exists()


def test_a_second_round_of_trials_only_when_each_trial_stays_long(tmp_path: Path) -> None:
    """Between one round of trials and two, the longer trials win until each of two rounds keeps four
    nnU-Net epochs: at 0.4 s a step on 2 workers, 10 minutes is 2 trials of 1,200 steps, not 4 of 600;
    20 minutes is 4 trials of 1,200. Two trials at once on a CPU keep 1,000 steps each as well, so 5
    minutes is 1 trial of 1,200 steps on both slots, not 2 of 600. With ``--finalize`` the search keeps
    two rounds from two nnU-Net epochs a trial, so that its folds are the 4 measured, not 2."""
    from distmis.data import FINALIZE_ROUND_TRIAL_STEPS, MIN_TRIAL_STEPS, ROUND_TRIAL_STEPS, TRAINING_SHARE

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))
    plans = (
        ("5m", [], 1, 1), ("10m", [], 2, 2), ("20m", [], 4, 2), ("20m", ["--finalize"], 4, 2),
        ("10m", ["--finalize"], 2, 2),
    )  # fmt: skip
    for budget, extra, trials, at_once in plans:
        args = ["--budget", budget, "--step-seconds", "0.4", "--workers", "2", *extra]
        config, _, text = _claims(tmp_path, raw, *args)
        total = config.search.time_budget_seconds() * TRAINING_SHARE * 2 / 0.4
        trial_steps = config.train.epochs * config.train.steps_per_epoch
        assert (config.search.num_samples, config.search.max_concurrent_trials) == (trials, at_once), (args, text)
        assert trial_steps == pytest.approx(total / trials, rel=0.05), (args, text)
        rounds = trials // at_once
        assert f"{rounds} round(s) of {at_once} trial(s) of {trial_steps} steps" in text
        if at_once < 2:
            assert f"2 at once would leave each trial under {ROUND_TRIAL_STEPS} steps" in text, (args, text)
            continue
        needed = FINALIZE_ROUND_TRIAL_STEPS if extra else ROUND_TRIAL_STEPS
        assert (rounds == 2) == (total >= 2 * 2 * needed), (args, text)
        if rounds == 1 and total >= 2 * 2 * MIN_TRIAL_STEPS:
            assert f"two rounds would leave each trial under {needed} steps" in text, (args, text)
        if extra:  # a round of folds for each round of trials: 4 folds after two rounds, as measured
            assert config.finalize.folds == 2 * rounds, (args, text)


def test_the_distmis_recipe_keeps_its_width_at_every_budget(tmp_path: Path) -> None:
    """A CPU plan of the default recipe keeps its own 8 base filters however long the budget (16 were
    level with 8 at 20 minutes with instance norm, in one seed), while nnU-Net's recipe narrows from its 32 as its CPU widths allow."""
    from distmis.recipes import DISTMIS, NNUNET

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))
    own = DISTMIS.model["filters"]
    for budget in ("5m", "1h", "8h"):
        config, _, text = _claims(tmp_path, raw, "--budget", budget, "--step-seconds", "0.27")
        assert config.model.filters == own and f"{own} base filters" in text, (budget, text)
    narrowed = {
        _claims(tmp_path, raw, "--budget", b, "--step-seconds", "2.0", "--recipe", "nnunet")[0].model.filters
        for b in ("5m", "8h")
    }
    assert narrowed <= set(NNUNET.cpu_widths) and len(narrowed) == 2  # a short budget narrows, a long one not


def test_a_budget_with_finalize_leaves_finalize_its_half(tmp_path: Path) -> None:
    """--budget B --finalize: the search is planned for and stopped at half of B, and the file's
    finalize section cross-validates the best configuration on folds that fit in the other half."""
    from distmis.config import parse_duration
    from distmis.data import SEARCH_SHARE, TRAINING_SHARE
    from distmis.recipes import DISTMIS

    raw = write_msd(tmp_path / "raw", cases=10, shape=(32, 32, 32))
    for budget, seconds, workers in (("20m", 0.3, 2), ("1h", 0.5, 4), ("3m", 0.3, 2)):
        config, _, text = _claims(
            tmp_path, raw, "--budget", budget, "--finalize", "--step-seconds", str(seconds), "--workers", str(workers)
        )
        whole = run_distmis(["validate", "plan.yaml"], cwd=tmp_path).stdout
        assert "then distmis finalize with top 1" in whole, whole
        half = parse_duration(budget) * SEARCH_SHARE
        assert config.search.time_budget_seconds() == pytest.approx(half, abs=1)
        assert f"of {budget}; finalize has the rest" in text
        f = config.finalize
        assert (f.top, f.pairs) == (1, False) and f.folds is not None and 2 <= f.folds <= 9  # 9 cases outside test
        concurrency = config.search.max_concurrent_trials
        step = seconds * (config.model.filters / DISTMIS.model["filters"]) ** 2  # the default recipe's own width
        trial_seconds = config.train.epochs * config.train.steps_per_epoch * step
        rounds = -(-config.search.num_samples // concurrency)
        # in step-seconds over the --workers slots: fewer trials at once get the idle slots' cores
        slot_seconds = half * TRAINING_SHARE * workers + 1e-6
        assert rounds * trial_seconds * concurrency <= slot_seconds, (budget, text)
        if "times the search's time" not in text:  # where the budget buys one trial, finalize says it needs more
            assert -(-f.folds // concurrency) * trial_seconds * concurrency <= slot_seconds, (budget, text)
    alone = run_distmis(["init", str(raw), "--out", "alone.yaml", "--finalize"], cwd=tmp_path)
    assert alone.returncode == 2 and "--finalize" in alone.stderr and "--budget" in alone.stderr
    assert not (tmp_path / "alone.yaml").exists()


def test_a_budget_times_the_planned_network_here(tmp_path: Path) -> None:
    """Without ``--step-seconds`` init times the planned network here, at the batch it plans and with as
    many trials stepping at once as will run: 3 cases leave 1 to train, so its steps are timed at a batch
    of 1, not at nnU-Net's 2; a budget too short for two trials of four nnU-Net epochs each times again
    with one trial on all the cores, which is how its one trial will step. (10 minutes buy two trials
    at once their 1,000 steps each at any step under 0.48 s; a 16^3 step at batch 1 takes well under.)"""
    from distmis.config import load_config

    raw = write_msd(tmp_path / "raw", cases=3, shape=(16, 16, 16))
    result = _init(tmp_path, raw, "--budget", "10m")
    assert "batch 1; 2 trials at once)" in result.stderr and "batch 2" not in result.stderr, result.stderr[-2000:]
    assert "batch 1)" not in result.stderr, result.stderr[-2000:]  # two trials at once: timed once, that way
    text = (tmp_path / "plan.yaml").read_text()
    config = load_config(tmp_path / "plan.yaml", require_space=True)
    assert "s a step" in text and config.search.time_budget == "10m"
    assert config.train.batch_size_per_replica == 1 and config.search.max_concurrent_trials == 2
    assert config.train.epochs * config.train.steps_per_epoch >= 1
    # 1 s buys no two trials of 1,000 steps at any step a U-Net takes on a CPU: one trial, timed alone
    result = _init(tmp_path, raw, "--budget", "1s", "--overwrite")
    timings = [line for line in result.stderr.splitlines() if "timing training steps" in line]
    assert len(timings) >= 2 and "2 trials at once)" in timings[0] and "batch 1)" in timings[1], timings
    config = load_config(tmp_path / "plan.yaml", require_space=True)
    assert config.search.max_concurrent_trials == 1 and config.parallelism.cpus_per_worker == 2


def test_a_short_budget_on_a_large_volume_trains_on_smaller_patches(tmp_path: Path) -> None:
    """Where even one trial of the whole volume would get fewer than 250 steps in the budget, init shrinks
    the patch (the longest axis first, as for memory, never under half of an axis) until one trial gets
    them, and plans as for any patch smaller than the volume: a third of the patches centred on
    foreground, validation on patches. The plan's own step estimate still fits the budget."""
    from distmis.data import MIN_TRIAL_STEPS, TRAINING_SHARE

    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))
    # the given step is the whole volume's: 5 minutes buy 2 slots x 240 s / 4 s = 120 steps of it, and
    # the one trial that runs gets both slots
    config, _, text = _claims(tmp_path, raw, "--budget", "5m", "--step-seconds", "4.0")
    patch, shape = list(config.train.patch), list(config.data.prepare.shape)
    assert shape == [48, 64, 48] and patch != shape, text
    assert all(s / 2 <= p <= s for p, s in zip(patch, shape, strict=True)), patch
    assert patch[1] < 64 and math.prod(patch) < math.prod(shape) / 2  # the longest axis went first
    steps = config.train.epochs * config.train.steps_per_epoch
    step = float(re.search(r"at ([0-9.]+) s a step", text).group(1))  # type: ignore[union-attr]
    assert steps >= MIN_TRIAL_STEPS and config.search.num_samples == 1, text
    assert steps * step <= config.search.time_budget_seconds() * TRAINING_SHARE * 2 + 1, text
    assert f"smaller than the {shape} that fits" in text and f"of a smaller patch than {shape}" in text
    assert config.train.foreground_oversampling == 0.33 and config.train.validation == "patch"
    # a step so slow that a quarter of it still buys too few: half of each axis, and the file says so
    config, _, text = _claims(tmp_path, raw, "--budget", "5m", "--step-seconds", "20")
    assert list(config.train.patch) == [24, 32, 24], text
    assert f"the smallest patch planned, and the budget buys fewer than {MIN_TRIAL_STEPS} even of it" in text
    # a budget that buys the whole volume its steps keeps it
    config, _, text = _claims(tmp_path, raw, "--budget", "5m", "--step-seconds", "0.5")
    assert list(config.train.patch) == shape and config.train.validation == "window", text


def test_a_budget_too_short_for_the_whole_volume_times_only_the_smaller_patch(tmp_path: Path) -> None:
    """Where even a linear speed-up of the trials stepping at once would leave one trial short of 250
    steps, the memory's patch is not timed a second time, alone: only the smaller patch that one trial
    gets is, as that trial will step it (a second timing of the big patch costs a third of a 5-minute
    budget at 240 x 240 x 155)."""
    from distmis.config import load_config

    raw = write_msd(tmp_path / "raw", cases=10, shape=(48, 64, 48))
    result = _init(tmp_path, raw, "--budget", "1s")
    timings = [line for line in result.stderr.splitlines() if "timing training steps" in line]
    assert len(timings) == 2, timings
    assert "patch [48, 64, 48]" in timings[0] and "2 trials at once)" in timings[0], timings
    assert "patch [24, 32, 24]" in timings[1] and "at once" not in timings[1], timings
    config = load_config(tmp_path / "plan.yaml", require_space=True)
    assert list(config.train.patch) == [24, 32, 24] and config.search.max_concurrent_trials == 1
    step = float(re.search(r"at ([0-9.]+) s a step", (tmp_path / "plan.yaml").read_text()).group(1))  # type: ignore[union-attr]
    assert step > 0


HOSTILE_TEXT = [
    "brain\ntracking: {uri: 'http://attacker.example'} #",
    "two\r\nlines",
    "a # b: c",
    "x\u2028search: {num_samples: 999}",
    "y\x85parallelism: {mode: data}",
    "!!python/object:os.system 'rm -rf /'",
    "quotes ' and \" and \\ ",
    "colon: value",
]


@pytest.mark.parametrize("text", HOSTILE_TEXT, ids=range(len(HOSTILE_TEXT)))
def test_no_text_from_the_dataset_becomes_yaml(tmp_path: Path, text: str) -> None:
    """The dataset's name and modality names, holding line breaks of every kind, ``#``, ``: ``,
    quotes and YAML tags, only ever land in a comment that they cannot end: the planned file parses
    to exactly what the same dataset with plain names plans."""
    raw = write_msd(tmp_path / "raw", cases=4, shape=(16, 16, 16))
    plain = _plan(tmp_path, raw)
    meta = json.loads((raw / "dataset.json").read_text())
    meta["name"] = text
    meta["modality"] = {"0": text, "1": "T1 " + text}
    (raw / "dataset.json").write_text(json.dumps(meta))
    hostile = _plan(tmp_path, raw, "--overwrite")
    assert hostile == plain
    assert "attacker" not in json.dumps(hostile)


def test_ct_is_recognised_by_its_name_in_any_spelling() -> None:
    from distmis.data import is_ct

    assert all(is_ct(name) for name in ("CT", "ct", "CT scan", "non-contrast CT", "Computed Tomography", "ct_arterial"))
    assert not any(is_ct(name) for name in ("T1", "FLAIR", "octave", "PET", "ACT-R"))


def test_init_plans_only_what_runs(assets: Assets, tmp_path: Path) -> None:
    """Too few cases and nothing to segment are refused in one line; three cases plan a batch that
    the one training case can fill, and the file validates."""
    for cases in (1, 2):
        ws = Workspace(tmp_path / f"few{cases}", assets)
        write_msd(ws.dir / "data", cases=cases)
        check_case(f"init-{cases}-cases", "init", ws, ["init", "data", "--out", "plan.yaml"], "at least 3")
    plan = _plan(tmp_path, write_msd(tmp_path / "three", cases=3))
    assert plan["train"]["batch_size_per_replica"] == 1

    ws = Workspace(tmp_path / "nofg", assets)
    raw = write_msd(ws.dir / "data", cases=4)
    meta = json.loads((raw / "dataset.json").read_text())
    for entry in meta["training"]:
        nib.save(nib.Nifti1Image(np.zeros((16, 16, 16), np.uint8), np.eye(4)), raw / entry["label"])
    meta["labels"] = {"0": "background"}
    (raw / "dataset.json").write_text(json.dumps(meta))
    check_case("init-no-foreground-label", "init", ws, ["init", "data", "--out", "plan.yaml"], "no foreground")
    meta["labels"] = {"0": "background", "1": "lesion"}
    (raw / "dataset.json").write_text(json.dumps(meta))
    check_case("init-background-only", "init", ws, ["init", "data", "--out", "plan.yaml"], "background only")
