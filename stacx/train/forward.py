"""Per-token logprobs of a packed batch under a transformers causal LM.

:func:`packed_token_logprobs` runs the model's decoder on packed rows and computes logprobs
only at loss positions, with the chunked lm_head of ``stacx.train.losses`` (no ``[N, V]``
logits tensor ever exists). Attention never crosses a sequence boundary; how that is enforced:

- ``"position_ids"``: no attention mask is passed; transformers derives sequence
  boundaries from ``position_ids`` restarting at 0 (its packed-sequence path). With
  ``flash_attention_2`` this is the varlen kernel (one row per batch: pack with a single row);
  with ``sdpa``, ``eager`` and ``flex_attention`` transformers builds the block-causal mask.
- ``"block_mask"``: the fallback; the batch's own ``[R, 1, T, T]`` block-causal mask is passed
  as a 4-D mask (bool for sdpa/flex, additive float for eager). Costs ``R*T*T`` bytes.
- ``"varlen"``: the batch's ``cu_seqlens`` go to the ``stacx_varlen`` attention
  (``stacx.train.attention``: PyTorch's flash varlen kernel on GPU); any number of rows; the
  model must have been switched with ``use_varlen_attention(model)``. The fastest path on GPU
  (``tools/bench/train.py``: 61k tok/s with torch.compile on the decoder layers vs 31k for the
  sdpa mask path on an H200, Qwen3-0.6B shape).

``"auto"`` (default) picks ``"varlen"`` when the model uses that attention, else
``"position_ids"``.

Limits: the lm_head must be a plain linear map of the last hidden state (Llama, Qwen, SmolLM,
Mistral); configs with logit soft-capping or scaling are rejected rather than silently wrong.
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


def _mask_for(model: nn.Module, batch: PackedBatch, dtype: torch.dtype) -> Tensor:
    allowed = batch.block_causal_mask()
    impl = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    if impl == "eager":
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return additive.masked_fill(~allowed, torch.finfo(dtype).min)
    return allowed


def packed_token_logprobs(
    model: nn.Module,
    batch: PackedBatch,
    *,
    boundaries: BoundaryMode = "auto",
    chunk_tokens: int = 2048,
) -> Tensor:
    """``[R, T]`` logprob of each target at loss positions, 0 elsewhere; differentiable. fp32
    (fp64 for an fp64 model).

    ``batch`` must be on the model's device. ``model`` is a transformers ``*ForCausalLM``
    (anything with ``get_decoder()`` and ``get_output_embeddings()``). ``boundaries="auto"`` is
    ``"varlen"`` for a model switched to the varlen attention, else ``"position_ids"``.
    """
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
    """The decoder's keyword arguments that keep the packed sequences apart: an attention mask
    (``block_mask``: shared prompts need it), the varlen attention's offsets (``varlen``), or
    none (``position_ids``: the positions restart at each sequence)."""
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
        dtype = next(model.parameters()).dtype
        mask = _mask_for(model, batch, dtype).to(batch.input_ids_R_T.device)
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
    """A causal LM whose ``forward(batch)`` is :func:`packed_token_logprobs`.

    Exists for FSDP2 (``stacx.train.distributed``): the trainer reads the decoder and the lm_head
    weight directly, outside the LM's own forward, so the module FSDP shards as its root must be
    one whose forward does exactly that (the root's hooks gather the embedding, norm and head).
    Its parameters are the LM's with the prefix ``lm.``."""

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
