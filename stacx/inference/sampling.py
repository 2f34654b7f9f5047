"""Token sampling for a batch of rows that each carry their own sampling parameters (pure tensor
functions). Temperature 0 is greedy; the logprob reported is under the raw logits (temperature 1,
untruncated), as teacher scoring returns; a seeded row repeats its draw whatever shares the batch.
Design: docs/engine.md#sampling
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class RowParams:
    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None = None
    seed: int = 0  # the Philox key of triton_pick.pick (the request's seed, or a random one)

    def truncated(self, vocab: int) -> bool:
        """Sampled with top-p or top-k restricting the vocabulary."""
        return self.temperature > 0 and (self.top_p < 1.0 or 0 < self.top_k < vocab)


def sample(logits_B_V: torch.Tensor, rows: list[RowParams]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled token ids [B] and their logprobs [B] (float32, under the raw logits)."""
    logits = logits_B_V.float()
    logprobs_B_V = torch.log_softmax(logits, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    stochastic = [i for i, r in enumerate(rows) if r.temperature > 0]
    if stochastic:
        idx = torch.tensor(stochastic, device=logits.device)
        sub = logits.index_select(0, idx)
        temps = torch.tensor(
            [rows[i].temperature for i in stochastic], device=logits.device, dtype=sub.dtype
        )
        sub = sub / temps[:, None]
        sub = _truncate_top_k(sub, [rows[i].top_k for i in stochastic])
        probs = torch.softmax(sub, dim=-1)
        probs = _truncate_top_p(probs, [rows[i].top_p for i in stochastic])
        noise = torch.empty_like(probs)
        for j, i in enumerate(stochastic):
            noise[j].exponential_(generator=rows[i].generator)
        drawn = torch.argmax(probs / noise.clamp_min(1e-20), dim=-1)
        tokens = tokens.index_copy(0, idx, drawn)
    chosen = logprobs_B_V.gather(1, tokens[:, None]).squeeze(1)
    return tokens, chosen


def sample_rows(
    logits_B_V: torch.Tensor, rows: list[RowParams], positions: list[int], on_gpu_pick: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample`; with ``on_gpu_pick`` (the Triton step) untruncated rows are drawn by
    ``triton_pick.pick`` at ``positions``, as multi-step replays draw them, whatever the path."""
    if not on_gpu_pick:
        return sample(logits_B_V, rows)
    from stacx.inference.triton_pick import pick

    dev, n, vocab = logits_B_V.device, len(rows), logits_B_V.shape[-1]
    odd = [i for i, row in enumerate(rows) if row.truncated(vocab)]
    temps = torch.tensor([0.0 if row.truncated(vocab) else row.temperature for row in rows])
    seeds = torch.tensor([row.seed for row in rows], dtype=torch.int64)
    tok_f, logprobs = torch.empty(n, device=dev), torch.empty(n, device=dev)
    draw = (temps.to(dev), seeds.to(dev), torch.tensor(positions).to(dev))
    tokens = pick(logits_B_V.contiguous(), tok_f, logprobs, draw)
    if odd:
        idx = torch.tensor(odd, device=dev)
        t_odd, lp_odd = sample(logits_B_V.index_select(0, idx), [rows[i] for i in odd])
        tokens, logprobs = tokens.index_copy(0, idx, t_odd), logprobs.index_copy(0, idx, lp_odd)
    return tokens, logprobs


def _truncate_top_k(logits_B_V: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    vocab = logits_B_V.shape[-1]
    ks = [k if 0 < k < vocab else vocab for k in top_k]
    if all(k == vocab for k in ks):
        return logits_B_V
    kmax = max(ks)
    top = torch.topk(logits_B_V, kmax, dim=-1).values
    kth = top.gather(1, torch.tensor(ks, device=logits_B_V.device)[:, None] - 1)
    return logits_B_V.masked_fill(logits_B_V < kth, float("-inf"))


def _truncate_top_p(probs_B_V: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    if all(p >= 1.0 for p in top_p):
        return probs_B_V
    ps = torch.tensor(top_p, device=probs_B_V.device, dtype=probs_B_V.dtype)
    sorted_p, order = torch.sort(probs_B_V, dim=-1, descending=True)
    # drop a token when the mass strictly before it already reaches top_p
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    sorted_p = sorted_p.masked_fill(before >= ps[:, None], 0.0)
    return torch.zeros_like(probs_B_V).scatter(1, order, sorted_p)
