"""Token sampling for a batch of rows that each carry their own sampling parameters.

Pure tensor functions, no model state. Guarantees:

- ``temperature == 0`` is greedy (argmax of the raw logits), independent of top_p/top_k.
- Otherwise the token is drawn from softmax(logits / temperature) restricted to the top_k
  tokens (``top_k <= 0``: no limit) and then to the smallest set whose probability reaches
  ``top_p`` (the token that crosses the threshold is kept).
- The reported logprob is ``log_softmax(raw logits)[token]``: the model's own distribution at
  temperature 1, before any truncation. That is what teacher scoring (:meth:`score`) returns
  too, so behaviour and teacher logprobs compare like for like; it is NOT the probability under
  the tempered/truncated sampling distribution.
- Rows with a seed draw their noise from their own ``torch.Generator``, so a seeded request
  reproduces its tokens whatever else shares the batch.
- The TorchEngine's Triton step on CUDA draws rows sampled at a plain temperature (no top-p /
  top-k truncation, see `RowParams.truncated`) with ``triton_pick.pick`` instead, inside its
  multi-step CUDA graphs: the same distribution, by the Gumbel-max form of the same race, with
  noise from Philox keyed on (the row's ``seed``, the position, the token id), which again
  depends on nothing else in the batch. Truncated rows keep this module's path.

Sampling uses the exponential-race form of the categorical draw
(``argmax(p / Exp(1))``), which lets every row share one vectorized argmax.
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
    """`sample`, or with ``on_gpu_pick`` (the Triton step) greedy rows and rows at a plain
    temperature drawn by ``triton_pick.pick`` at ``positions`` (the position of the token each
    row's logits follow), as the multi-step replays draw them, so a row's draw does not depend
    on which path its batch took; truncated rows (top-p/top-k) by `sample`."""
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
