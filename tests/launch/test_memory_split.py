"""The declared GPU memory split (placement.engine_cache_gib / trainer_gib): validated at load
with key paths, checked against the device at start (stacx.launch.memory), and background
checkpoints refused where the engine cannot take a version from memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.errors import ConfigError
from stacx.launch.loader import load_recipe
from stacx.launch.memory import GIB, cache_bytes, check_split, trainer_static_bytes

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "recipes" / "retool" / "grpo_gpu.toml"
TINY = ROOT / "recipes" / "retool" / "grpo_tiny.toml"


def test_a_split_that_fits_passes_and_names_the_cache_budget() -> None:
    recipe = load_recipe(GPU, ["placement.engine_cache_gib=20", "placement.trainer_gib=60"])
    assert cache_bytes(recipe) == 20 * GIB
    check_split(
        device_bytes=141 * GIB,
        engine_weights_bytes=8 * GIB,
        cache_gib=20,
        trainer_gib=60,
        trainer_static=32 * GIB,
    )


def test_a_split_beyond_the_device_is_refused_with_its_parts() -> None:
    with pytest.raises(ConfigError) as info:
        check_split(
            device_bytes=141 * GIB,
            engine_weights_bytes=8 * GIB,
            cache_gib=60,
            trainer_gib=80,
            trainer_static=32 * GIB,
        )
    msg = str(info.value)
    assert "placement.engine_cache_gib 60.0" in msg and "placement.trainer_gib 80.0" in msg
    assert "150.0 GiB, the device has 141.0 GiB" in msg


def test_a_trainer_share_below_its_static_state_is_refused() -> None:
    static = trainer_static_bytes(4_000_000_000, 2)  # 4B params, bf16: weights, grads, AdamW
    assert static == 32_000_000_000
    with pytest.raises(ConfigError, match=r"placement.trainer_gib = 20: .* 29.8 GiB"):
        check_split(
            device_bytes=141 * GIB,
            engine_weights_bytes=8 * GIB,
            cache_gib=20,
            trainer_gib=20,
            trainer_static=static,
        )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["placement.engine_cache_gib=-1"], "placement.engine_cache_gib = -1.0: accepted values"),
        (["placement.engine_cache_gib=4"], "engine.device = 'cpu'"),
        (["placement.trainer_gib=4", "trainer.device='cpu'"], "trainer.device = 'cpu'"),
        (
            ["trainer.background_checkpoint=true", "placement.mode='ray'"],
            "trainer.background_checkpoint = true: needs placement.mode 'local' or 'processes'",
        ),
        (
            ["trainer.background_checkpoint=true", "trainer.inprocess_handoff=false"],
            "trainer.background_checkpoint = True: accepted values are false unless",
        ),
        (["trainer.checkpoint_every=0"], "trainer.checkpoint_every = 0"),
    ],
)
def test_bad_splits_and_checkpoint_keys_name_their_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(TINY, overrides)
    assert needle in str(info.value)
