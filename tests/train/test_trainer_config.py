"""TrainerConfig: defaults are valid; bad values fail naming the key and the accepted values,
also when the config is embedded in a larger recipe Struct."""

from __future__ import annotations

import msgspec
import pytest

from stacx.errors import ConfigError
from stacx.train.config import TrainerConfig, load


def test_defaults_are_a_valid_grpo_config() -> None:
    cfg = TrainerConfig()
    assert cfg.algorithm == "grpo" and cfg.source_view == "grpo_batch"
    assert cfg.ready_threshold == cfg.batch_groups
    assert TrainerConfig(algorithm="sft").row_filter == "reward >= 1"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"algorithm": "ppo"}, "trainer.algorithm = 'ppo': accepted values are sft | grpo"),
        ({"mode": "later"}, "trainer.mode = 'later': accepted values are sync | async"),
        ({"steps": 0}, "trainer.steps = 0: accepted values are an integer >= 1"),
        ({"lr": -1.0}, "trainer.lr = -1.0"),
        ({"lr": "fast"}, "trainer.lr"),
        ({"clip_eps": 1.5}, "trainer.clip_eps = 1.5: accepted values are a float in"),
        ({"min_ready": 9, "batch_groups": 4}, "trainer.min_ready = 9"),
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


def test_validation_runs_when_embedded_in_a_recipe_struct() -> None:
    class Recipe(msgspec.Struct, frozen=True):
        trainer: TrainerConfig

    assert msgspec.convert({"trainer": {"steps": 2}}, Recipe).trainer.steps == 2
    with pytest.raises(ConfigError, match=r"trainer\.mode"):
        msgspec.convert({"trainer": {"mode": "x"}}, Recipe)


def test_sync_mode_means_zero_staleness() -> None:
    assert TrainerConfig(mode="sync", max_staleness=3).staleness_limit == 0
    assert TrainerConfig(mode="async", max_staleness=3).staleness_limit == 3
