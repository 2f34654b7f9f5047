"""The sampling rules, on hand-made logits (no model)."""

from __future__ import annotations

import math

import torch

from stacx.inference.sampling import RowParams, sample

LOGITS = torch.tensor([[0.0, 3.0, 2.9, -1.0], [5.0, 0.0, 0.0, 0.0]])


def test_temperature_zero_is_argmax_with_raw_logprob() -> None:
    tokens, lps = sample(LOGITS, [RowParams(0.0, 1.0, -1), RowParams(0.0, 0.1, 1)])
    assert tokens.tolist() == [1, 0]
    assert lps.tolist() == torch.log_softmax(LOGITS, -1)[[0, 1], [1, 0]].tolist()


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = [RowParams(5.0, 1.0, 1, gen)] * 2
    for _ in range(20):
        assert sample(LOGITS, rows)[0].tolist() == [1, 0]


def test_top_p_keeps_the_token_that_crosses_the_threshold() -> None:
    # p(1) ~ 0.51 and p(2) ~ 0.46 in row 0: top_p=0.6 keeps exactly tokens 1 and 2
    seen = set()
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        seen.add(int(sample(LOGITS[:1], [RowParams(1.0, 0.6, -1, gen)])[0]))
    assert seen == {1, 2}


def test_reported_logprob_ignores_temperature_and_truncation() -> None:
    gen = torch.Generator().manual_seed(0)
    tok, lp = sample(LOGITS[:1], [RowParams(0.3, 0.5, 2, gen)])
    expected = torch.log_softmax(LOGITS[0], -1)[int(tok)]
    assert math.isclose(float(lp), float(expected), rel_tol=1e-6)


def test_same_seed_same_draws() -> None:
    def draws(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        flat = torch.zeros(1, 1000)
        return [int(sample(flat, [RowParams(1.0, 1.0, -1, gen)])[0]) for _ in range(5)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
