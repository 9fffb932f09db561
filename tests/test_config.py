"""The configuration file: every invalid input gives one error naming file, line and YAML path."""

from __future__ import annotations

from pathlib import Path

import pytest

from distmis.cli import main
from distmis.config import ExperimentConfig, apply_params, load_config, resolve_param_name
from distmis.exceptions import ConfigError

REPO = Path(__file__).resolve().parents[1]

VALID = """\
name: t
train: {epochs: 2}
space:
  lr: {loguniform: [1.0e-4, 1.0e-2]}
  norm: {choice: [batch, group]}
  groups: {choice: [2, 4], when: {norm: group}}
"""


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", ["quickstart.yaml", "distmis_grid.yaml", "brats_tpe.yaml"])
def test_shipped_search_spaces_are_valid(name: str) -> None:
    cfg = load_config(REPO / "search_spaces" / name, require_space=True)
    assert cfg.space


def test_valid_file_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, VALID), require_space=True)
    assert cfg.train.epochs == 2 and set(cfg.space) == {"lr", "norm", "groups"}


def test_a_config_an_older_distmis_saved_still_loads_without_its_retired_keys(tmp_path: Path) -> None:
    """Every finalized model keeps its whole config, so a key that was dropped from the schema must
    not make an older model unreadable."""
    cfg = load_config(
        write(tmp_path, "data:\n  prepare: {shape: [16, 16, 16], shards: 4}\n" + VALID), require_space=True
    )
    assert cfg.data.prepare.shape == (16, 16, 16)
    assert "shards" not in cfg.to_yaml_dict()["data"]["prepare"]
    with pytest.raises(ConfigError, match=r"data\.prepare\.shard: unknown key"):
        load_config(write(tmp_path, "data:\n  prepare: {shard: 4}\n" + VALID), require_space=True)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        # bad type, with the line of the key
        ("train:\n  epochs: lots\n", r":2: train\.epochs: .*integer"),
        # unknown key with a did-you-mean hint
        ("train:\n  epoch: 3\n", r":2: train\.epoch: unknown key \(did you mean 'epochs'\?\)"),
        ("optimiser: {lr: 0.1}\n", r":1: optimiser: unknown key \(did you mean 'optimizer'\?\)"),
        # empty space
        ("name: t\n", r"space: the search space is empty"),
        # low > high
        ("space:\n  lr: {uniform: [0.1, 0.01]}\n", r":2: space\.lr: `low < high` must hold"),
        # loguniform <= 0
        ("space:\n  lr: {loguniform: [0.0, 0.01]}\n", r"space\.lr: loguniform needs low > 0"),
        # unknown condition target
        (
            "space:\n  groups: {choice: [2], when: {nrom: group}}\n  norm: {choice: [group]}\n",
            r"space\.groups\.when\.nrom: condition on 'nrom'.*\(did you mean 'norm'\?\)",
        ),
        # unknown metric
        (
            "search: {metric: val_dcie}\nspace:\n  lr: {loguniform: [0.001, 0.01]}\n",
            r":1: search\.metric: unknown metric 'val_dcie' \(did you mean 'val_dice'\?\)",
        ),
        # unknown searchable field
        ("space:\n  learning_rate: {loguniform: [0.001, 0.01]}\n", r"space\.learning_rate: unknown searchable field"),
        # two distributions at once
        ("space:\n  lr: {uniform: [0.1, 0.2], choice: [1]}\n", r"space\.lr: a parameter needs exactly one of"),
        # U-Net cannot downsample this patch
        (
            "train: {patch: [30, 32, 32]}\nspace:\n  lr: {loguniform: [0.001, 0.01]}\n",
            r"train\.patch must be divisible",
        ),
        # groups must divide filters
        (
            "model: {norm: group, groups: 3, filters: 8}\nspace:\n  lr: {loguniform: [0.001, 0.01]}\n",
            r"groups to divide filters",
        ),
        # not YAML at all
        ("space: [unclosed\n", r"not valid YAML"),
    ],
)
def test_invalid_files_give_one_clear_error(tmp_path: Path, text: str, pattern: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(path, require_space=True)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path / "nope.yaml")


def test_cli_validate_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(write(tmp_path, VALID))]) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["validate", str(write(tmp_path, "train: {epoch: 1}\n"))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("distmis: error:") and "did you mean 'epochs'" in err


@pytest.mark.parametrize(
    ("search", "trials"),
    [
        ("{algorithm: optuna, num_samples: 5}", 5),
        ("{algorithm: grid, num_samples: 5}", 4),  # lr x norm: the grid runs its points, whatever num_samples
        (
            "{algorithm: points, points: [{lr: 0.001, norm: batch}, {lr: 0.01, norm: batch}, {lr: 0.01, norm: group}]}",
            3,
        ),
    ],
)
def test_validate_announces_the_trials_a_search_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], search: str, trials: int
) -> None:
    text = "name: t\nspace:\n  lr: {choice: [0.001, 0.01]}\n  norm: {choice: [batch, group]}\nsearch: " + search + "\n"
    path = write(tmp_path, text)
    assert load_config(path).planned_trials() == trials
    assert main(["validate", str(path)]) == 0
    assert f", {trials} trials, " in capsys.readouterr().out


def test_short_and_dotted_names() -> None:
    assert resolve_param_name("lr") == "optimizer.lr"
    assert resolve_param_name("norm") == "model.norm"
    assert resolve_param_name("train.epochs") == "train.epochs"
    cfg = apply_params(ExperimentConfig(), {"lr": 0.01, "norm": "group", "groups": 2})
    assert cfg.optimizer.lr == 0.01 and cfg.model.norm == "group" and cfg.model.groups == 2


def test_apply_params_validates() -> None:
    with pytest.raises(ValueError, match="groups to divide filters"):
        apply_params(ExperimentConfig(), {"norm": "group", "groups": 3})


def test_yaml_merge_keys_merge_and_own_keys_win(tmp_path: Path) -> None:
    text = "train:\n  <<: {epochs: 3, batch_size_per_replica: 4}\n  epochs: 5\n"
    cfg = load_config(write(tmp_path, text, name="m2.yaml"))
    assert cfg.train.epochs == 5 and cfg.train.batch_size_per_replica == 4
    with pytest.raises(ConfigError, match="duplicate key 'epochs'"):
        load_config(write(tmp_path, "train:\n  <<: {epochs: 3}\n  epochs: 5\n  epochs: 6\n", name="m3.yaml"))


@pytest.mark.parametrize(
    ("search", "pattern"),
    [
        ("{algorithm: optuna, points: [{lr: 0.5}]}", r"search\.points\.0\.lr: 0\.5 is outside its loguniform"),
        ("{algorithm: random, points: [{beta_2: 0.9}]}", r"not parameters of space"),
        ("{algorithm: grid, points: [{lr: 1.0e-3}]}", r"a grid runs its own points"),
    ],
)
def test_starting_points_must_be_ones_the_sampler_could_propose(tmp_path: Path, search: str, pattern: str) -> None:
    path = write(tmp_path, f"search: {search}\nspace:\n  lr: {{loguniform: [1.0e-4, 1.0e-2]}}\n")
    with pytest.raises(ConfigError, match=pattern):
        load_config(path, require_space=True)


def test_starting_points_are_accepted_for_the_samplers(tmp_path: Path) -> None:
    path = write(
        tmp_path, "search: {algorithm: optuna, points: [{lr: 5.0e-3}]}\nspace:\n  lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    )
    assert load_config(path, require_space=True).search.points == [{"lr": 5.0e-3}]


def test_a_search_varies_one_augmentation_at_a_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """nnU-Net's transforms are keys a search can vary, each on its own (``rotation``, or dotted
    ``train.augment.nnunet_intensity``), without restating the whole ``train.augment`` group."""
    assert resolve_param_name("rotation") == "train.augment.rotation"
    assert resolve_param_name("train.augment.nnunet_intensity") == "train.augment.nnunet_intensity"
    with pytest.raises(ValueError, match="train.augment.rotatoin"):
        resolve_param_name("train.augment.rotatoin")
    base = ExperimentConfig.model_validate({"name": "x", "train": {"augment": {"noise": 0.05}}})
    tried = apply_params(base, {"rotation": 30.0, "train.augment.scale": [0.7, 1.4], "lr": 1e-3})
    assert tried.train.augment.rotation == 30.0 and tried.train.augment.scale == (0.7, 1.4)
    assert tried.train.augment.noise == 0.05 and tried.train.augment.flip  # the rest of the group kept
    with pytest.raises(ValueError, match="rotation"):
        apply_params(base, {"rotation": 400.0})
    space = tmp_path / "space.yaml"
    space.write_text(
        "name: s\nspace:\n  rotation: {choice: [0, 30]}\n  nnunet_intensity: {uniform: [0.0, 1.0]}\n"
        "  lr: {loguniform: [1.0e-4, 1.0e-2]}\n"
    )
    assert main(["validate", str(space)]) == 0
    assert "train.augment.rotation" in capsys.readouterr().out
    space.write_text("name: s\nspace:\n  rotation: {choice: [0, 400]}\n")
    assert main(["validate", str(space)]) == 2
    assert "rotation" in capsys.readouterr().err
