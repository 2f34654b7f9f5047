"""Fixtures of the agent tests: the default model's real tokenizer (prepared once, cached)."""

from __future__ import annotations

import pytest

from stacx.agents.chat import ChatFormat, ChatTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> ChatTokenizer:
    from transformers import AutoTokenizer

    from stacx.hf import default_model_dir, find_default_gguf, is_prepared

    # The prepared checkpoint's tokenizer is the GGUF's, saved; either is the real one.
    if is_prepared(default_model_dir()):
        tok: ChatTokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    else:
        gguf = find_default_gguf()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return tok


@pytest.fixture(scope="session")
def chat(tokenizer: ChatTokenizer) -> ChatFormat:
    return ChatFormat(tokenizer)
