"""The rollout tests share the agent tests' real tokenizer fixtures."""

from tests.agents.conftest import chat, tokenizer

__all__ = ["chat", "tokenizer"]
