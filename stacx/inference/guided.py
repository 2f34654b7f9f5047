"""Constrained decoding in the torch engine: a request with `SamplingParams.grammar` (llguidance,
Lark form) samples only tokens the grammar allows and stops once it is complete; its logprobs are
under the masked distribution it was drawn from. A rejected grammar is an EngineError.
Design: docs/engine.md#constrained-decoding
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import llguidance.hf
import llguidance.torch as llt
import torch

from stacx.errors import EngineError


class Guide:
    """One request's place in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def consume(self, token: int) -> bool:
        """Advance past the sampled `token`; True when the grammar is complete (or broken)."""
        self.matcher.consume_token(token)
        return bool(self.matcher.is_stopped())


class Guides:
    """Makes a `Guide` per grammar, over one tokenizer (llguidance's view of it, built once)."""

    def __init__(self, tokenizer: object, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._ll: llguidance.LLTokenizer | None = None

    def new(self, grammar: str) -> Guide:
        if self._ll is None:
            self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)  # type: ignore[arg-type]
        grammar_json = llguidance.LLMatcher.grammar_from_lark(grammar)
        bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_json, self._ll)
        if bad:
            raise EngineError(f"the grammar is not valid: {'; '.join(messages)}")
        matcher = llguidance.LLMatcher(self._ll, grammar_json, log_level=0)
        if matcher.is_error():
            raise EngineError(f"the grammar is not valid: {matcher.get_error()}")
        return Guide(matcher)


def mask_logits(logits_B_V: torch.Tensor, guides: Sequence[Guide | None]) -> torch.Tensor:
    """`logits_B_V` with each guided row's disallowed tokens at -inf (a copy). Plain tensor ops:
    llguidance's own apply kernel is a torch.compile, needing a compiler at run time."""
    rows = [i for i, g in enumerate(guides) if g is not None]
    if not rows:
        return logits_B_V
    vocab = logits_B_V.shape[-1]
    bitmask = llt.allocate_token_bitmask(len(rows), vocab)
    for j, i in enumerate(rows):
        guide = guides[i]
        assert guide is not None
        llt.fill_next_token_bitmask(guide.matcher, bitmask, j)
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> bits) & 1).flatten(1)[:, :vocab].bool()
    out = logits_B_V.float().clone()
    idx = torch.tensor(rows, device=out.device)
    masked = out.index_select(0, idx).masked_fill_(~allowed.to(out.device), float("-inf"))
    return out.index_copy_(0, idx, masked)
