"""Per-token logprobs of a packed batch under a transformers causal LM: the decoder runs on packed
rows and logprobs come from the chunked lm_head at loss positions only (no ``[N, V]`` logits).
Attention never crosses a sequence boundary (``boundaries``: ``position_ids``, ``block_mask`` or
``varlen``). Limits: the lm_head must be a plain linear map of the last hidden state; soft-capped or
scaled logits are rejected.
Design: docs/training.md#the-model-and-the-step
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from stacx.errors import StacxError
from stacx.train.attention import VARLEN_ATTENTION
from stacx.train.losses import chunked_token_logprobs
from stacx.train.packing import PackedBatch

BoundaryMode = Literal["auto", "position_ids", "block_mask", "varlen"]


class ModelShapeError(StacxError):
    """The model's head is not a plain linear layer on the last hidden state."""


def _check_plain_head(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier"):
        value = getattr(config, attr, None)
        if value not in (None, 1, 1.0):
            raise ModelShapeError(
                f"config.{attr}={value}: chunked logprobs support plain linear lm_heads only"
            )


def packed_token_logprobs(
    model: nn.Module,
    batch: PackedBatch,
    *,
    boundaries: BoundaryMode = "auto",
    chunk_tokens: int = 2048,
) -> Tensor:
    """``[R, T]`` logprob of each target at loss positions, 0 elsewhere; differentiable; fp32 (fp64
    for an fp64 model). ``batch`` must be on the model's device."""
    _check_plain_head(model)
    decoder = model.get_decoder()  # type: ignore[operator]
    head = model.get_output_embeddings()  # type: ignore[operator]
    if decoder is None or head is None:
        raise ModelShapeError(f"{type(model).__name__} has no decoder or no output embeddings")
    out = decoder(
        input_ids=batch.input_ids_R_T,
        position_ids=batch.position_ids_R_T,
        use_cache=False,
        **_boundaries(model, batch, boundaries),
    )
    hidden_R_T_H: Tensor = out.last_hidden_state
    select_R_T = batch.loss_mask_R_T
    hidden_N_H = hidden_R_T_H[select_R_T]
    logprobs_N = chunked_token_logprobs(
        hidden_N_H, head.weight, batch.targets_R_T[select_R_T], chunk_tokens=chunk_tokens
    )
    logprobs_R_T = logprobs_N.new_zeros(select_R_T.shape)
    return logprobs_R_T.masked_scatter(select_R_T, logprobs_N)


def _boundaries(
    model: nn.Module, batch: PackedBatch, boundaries: BoundaryMode
) -> dict[str, Tensor | int | None]:
    """The decoder's keyword arguments that keep packed sequences apart: an attention mask
    (``block_mask``), the varlen offsets (``varlen``), or none (``position_ids``)."""
    mask = None
    varlen: dict[str, Tensor | int] = {}
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if batch.shares_prompts:  # branches continue a shared prompt: only a mask says so
        if boundaries == "varlen" or impl == VARLEN_ATTENTION:
            raise ModelShapeError(
                "a batch with shared prompts (pack_shared) needs mask-based attention (eager, "
                "sdpa); pack it with pack() for the varlen attention"
            )
        boundaries = "block_mask"
    if boundaries == "auto":
        boundaries = "varlen" if impl == VARLEN_ATTENTION else "position_ids"
    if boundaries == "block_mask":
        mask = batch.block_causal_mask().to(batch.input_ids_R_T.device)
        if impl == "eager":  # an additive mask
            dtype = next(model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min
            )
    elif boundaries == "varlen":
        if impl != VARLEN_ATTENTION:
            raise ModelShapeError(
                f'boundaries="varlen" needs the {VARLEN_ATTENTION} attention, the model has '
                f"{impl!r}: call stacx.train.attention.use_varlen_attention(model) first"
            )
        varlen = {
            "cu_seq_lens_q": batch.cu_seqlens,
            "cu_seq_lens_k": batch.cu_seqlens,
            "max_length_q": batch.max_seqlen,
            "max_length_k": batch.max_seqlen,
        }
    return {"attention_mask": mask, **varlen}


class PackedLM(nn.Module):
    """A causal LM whose ``forward(batch)`` is :func:`packed_token_logprobs`: the root FSDP2 shards,
    whose hooks gather the embedding, norm and head. Its parameters are the LM's, prefixed ``lm.``.
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, batch: PackedBatch) -> Tensor:
        return packed_token_logprobs(self.lm, batch)


def token_logprobs_of(model: nn.Module, batch: PackedBatch) -> Tensor:
    """:func:`packed_token_logprobs` of a plain LM, or a :class:`PackedLM`'s forward."""
    return model(batch) if isinstance(model, PackedLM) else packed_token_logprobs(model, batch)


def language_model(model: nn.Module) -> nn.Module:
    """The transformers LM inside (a :class:`PackedLM`'s, or ``model`` itself)."""
    return model.lm if isinstance(model, PackedLM) else model
