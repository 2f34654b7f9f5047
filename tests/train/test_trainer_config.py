"""TrainerConfig: defaults are valid; bad values fail naming the key and the accepted values,
also when the config is embedded in a larger recipe Struct; the keys that depend on the
algorithm fail when the algorithm is asked for (stacx.train.algorithms.algorithm_for)."""

from __future__ import annotations

import msgspec
import pytest

from stacx.errors import ConfigError
from stacx.train.algorithms import algorithm_for, ready_threshold, row_filter, source_view
from stacx.train.config import TrainerConfig, load


def test_defaults_are_a_valid_grpo_config() -> None:
    cfg = TrainerConfig()
    assert algorithm_for(cfg).name == "grpo" and source_view(cfg) == "grpo_batch"
    assert ready_threshold(cfg) == cfg.batch_groups
    assert row_filter(TrainerConfig(algorithm="sft")) == "reward >= 1"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mode": "later"}, "trainer.mode = 'later': accepted values are sync | async"),
        ({"steps": 0}, "trainer.steps = 0: accepted values are an integer >= 1"),
        ({"lr": -1.0}, "trainer.lr = -1.0"),
        ({"lr": "fast"}, "trainer.lr"),
        ({"clip_eps": 1.5}, "trainer.clip_eps = 1.5: accepted values are a float in"),
        ({"min_ready": 0}, "trainer.min_ready = 0"),
        ({"source": "x; drop table y"}, "trainer.source"),
        ({"trainable": "("}, "trainer.trainable"),
        ({"device": "tpu"}, "trainer.device = 'tpu': accepted values are auto | cpu"),
        ({"batch_size": 4}, "unknown field `batch_size`"),
        ({"world_size": 0}, "trainer.world_size = 0: accepted values are an integer >= 1"),
        ({"mixed_precision": True}, "trainer.mixed_precision = True: accepted values are false"),
        (
            {"is_mask_band": [2.0, 3.0]},
            "trainer.is_mask_band = .2.0, 3.0.: accepted values are .low, high. with 0 < low < 1 < high",
        ),
        ({"is_mask_band": [0.5]}, "trainer.is_mask_band"),
    ],
)
def test_bad_values_name_the_key_and_accepted_values(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("|", r"\|")):
        load(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"algorithm": "ppo"}, "trainer.algorithm = 'ppo': accepted values are sft | grpo"),
        ({"algorithm": "eval"}, "trainer.algorithm = 'eval': accepted values are sft | grpo"),
        ({"min_ready": 9, "batch_groups": 4}, "trainer.min_ready = 9"),
        ({"min_ready": 9, "batch_episodes": 8, "algorithm": "sft"}, r"batch size 8\]"),
        ({"steps_per_iteration": 2}, "trainer.steps_per_iteration = 2: accepted values are 1"),
    ],
)
def test_keys_the_algorithm_decides_fail_when_it_is_asked(
    data: dict[str, object], message: str
) -> None:
    cfg = load(data)  # the config alone knows no algorithm
    with pytest.raises(ConfigError, match=message.replace("|", r"\|")):
        algorithm_for(cfg)


def test_dataset_algorithms_take_epochs() -> None:
    assert algorithm_for(TrainerConfig(algorithm="dagger", steps_per_iteration=3)).dataset


def test_validation_runs_when_embedded_in_a_recipe_struct() -> None:
    class Recipe(msgspec.Struct, frozen=True):
        trainer: TrainerConfig

    assert msgspec.convert({"trainer": {"steps": 2}}, Recipe).trainer.steps == 2
    with pytest.raises(ConfigError, match=r"trainer\.mode"):
        msgspec.convert({"trainer": {"mode": "x"}}, Recipe)


def test_sync_mode_means_zero_staleness() -> None:
    assert TrainerConfig(mode="sync", max_staleness=3).staleness_limit == 0
    assert TrainerConfig(mode="async", max_staleness=3).staleness_limit == 3
