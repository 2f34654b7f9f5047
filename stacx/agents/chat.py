"""Token-exact transcript pieces, derived once from a tokenizer's chat template: only new pieces are
ever tokenized, so what the model saw is what a trainer trains on; message content cannot forge a
message boundary. `ChatFormat` raises ConfigError for a template it cannot take apart.

Design: docs/agents.md#the-agent-loop
"""

from __future__ import annotations

from stacx.errors import ConfigError
from stacx.ports import ChatTokenizer

_A = "\x00STACX-ASSISTANT\x00"
_O = "\x00STACX-OBSERVATION\x00"


class ChatFormat:
    """Builds the token pieces of an episode transcript for one tokenizer."""

    def __init__(self, tokenizer: ChatTokenizer, observation_role: str = "user") -> None:
        self.tokenizer = tokenizer
        self.observation_role = observation_role
        sys_user = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        base = self._render(sys_user, gen=False)
        with_header = self._render(sys_user, gen=True)
        if not with_header.startswith(base):
            raise ConfigError("chat template: the generation prompt is not a suffix; unsupported")
        header = with_header[len(base) :]
        convo = [*sys_user, {"role": "assistant", "content": _A}]
        convo.append({"role": observation_role, "content": _O})
        text = self._render(convo, gen=True)
        if text.count(_A) != 1 or text.count(_O) != 1 or not text.endswith(header):
            raise ConfigError("chat template: cannot locate message boundaries; unsupported")
        after_a = text[text.index(_A) + len(_A) : text.index(_O)]
        after_o = text[text.index(_O) + len(_O) :]
        # after_a = assistant close + observation header; its split point is where the
        # assistant message alone ends (render it without the observation to find it).
        alone = self._render([*sys_user, {"role": "assistant", "content": _A}], gen=False)
        close = alone[alone.index(_A) + len(_A) :]
        if not after_a.startswith(close):
            raise ConfigError("chat template: assistant close is not stable; unsupported")
        self.close_ids = self._framing(close)  # e.g. "<|im_end|>\n"
        self.obs_open_ids = self._framing(after_a[len(close) :])  # "<|im_start|>user\n"
        self.obs_close_ids = self._framing(after_o)  # "<|im_end|>\n<|im_start|>assistant\n"
        if not self.close_ids:
            raise ConfigError("chat template: assistant messages have no end marker; unsupported")
        # The model ends its message by sampling the first close token (ChatML: <|im_end|>).
        self.end_of_turn_id = self.close_ids[0]
        stops = {self.end_of_turn_id}
        if tokenizer.eos_token_id is not None:
            stops.add(tokenizer.eos_token_id)
        self.stop_token_ids = sorted(stops)

    def _render(self, convo: list[dict[str, str]], *, gen: bool) -> str:
        return self.tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=gen)

    def _framing(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def content_ids(self, text: str) -> list[int]:
        """Tokens of message content, with special-token text split into ordinary tokens."""
        if not text:
            return []
        return list(
            self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        )

    def start(self, system: str, user: str) -> list[int]:
        """The first prompt: system + user messages + the assistant header."""
        text = self._render(
            [{"role": "system", "content": system}, {"role": "user", "content": user}], gen=True
        )
        for marker in (system, user):
            if marker and marker not in text:
                raise ConfigError("chat template rewrote message content; unsupported")
        # Split at the two contents so each is tokenized as content, the rest as framing.
        i = text.index(system) if system else 0
        j = text.index(user, i + len(system))
        return (
            self._framing(text[:i])
            + self.content_ids(system)
            + self._framing(text[i + len(system) : j])
            + self.content_ids(user)
            + self._framing(text[j + len(user) :])
        )

    def close(self, output_ids: list[int]) -> list[int]:
        """What must follow a model's output so that its message is closed exactly once."""
        if output_ids and output_ids[-1] in self.stop_token_ids:
            if output_ids[-1] == self.end_of_turn_id:
                return self.close_ids[1:]
        return list(self.close_ids)

    def observation(self, text: str) -> list[int]:
        """An observation message followed by the next assistant header."""
        return self.obs_open_ids + self.content_ids(text) + self.obs_close_ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
