"""Model resolution: the prepared default checkpoint, local directories, clear errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stacx import hf as models
from stacx.errors import ConfigError


def test_default_is_prepared_once_and_then_instant(model_dir: str) -> None:
    assert models.is_prepared(Path(model_dir))
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (Path(model_dir) / name).is_file()
    t0 = time.monotonic()
    assert models.prepare_default_model() == Path(model_dir)
    assert time.monotonic() - t0 < 1.0  # no second conversion


def test_default_checkpoint_carries_a_chat_template(model_dir: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_local_directory_resolves_to_itself(model_dir: str) -> None:
    assert models.resolve_model(model_dir) == str(Path(model_dir).resolve())


def test_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json"):
        models.resolve_model(tmp_path)


def test_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    with pytest.raises(ConfigError, match="is a file"):
        models.resolve_model(f)


def test_missing_hub_id_offline_names_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="no-such-owner/no-such-model"):
        models.resolve_model("no-such-owner/no-such-model")


def test_nonsense_spec_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a hub id"):
        models.resolve_model("./does/not/exist")


def test_cli_prepare_is_idempotent_and_prints_the_path(model_dir: str) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "stacx", "models", "prepare"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == model_dir
