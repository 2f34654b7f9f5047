"""Varlen attention for packed batches, registered with transformers as ``"stacx_varlen"``: every
sequence attends causally to itself only, from the batch's ``cu_seqlens``, with no ``T x T`` mask
built. On CUDA in bf16/fp16 it is PyTorch's flash varlen kernel (GQA native); elsewhere an exact,
slow loop of causal sdpa over the segments (what the CPU tests run). Limits: training and prefill
only (no KV cache); no dropout, no sliding window.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from stacx.errors import StacxError

VARLEN_ATTENTION = "stacx_varlen"


class VarlenAttentionError(StacxError):
    """The varlen attention was called without sequence boundaries or with unsupported options."""


def _kernel() -> tuple[Any, dict[str, Any], bool] | None:
    """PyTorch's varlen kernel, the kwargs that make it causal, and whether it takes GQA."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal: dict[str, Any] = (
        {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    )
    return varlen_attn, causal, "enable_gqa" in params


_KERNEL = _kernel()


def _segments_reference(
    q_N_H_D: Tensor, k_N_G_D: Tensor, v_N_G_D: Tensor, cu_seqlens: Tensor, scaling: float | None
) -> Tensor:
    out = torch.empty_like(q_N_H_D)
    bounds = cu_seqlens.tolist()
    for start, end in itertools.pairwise(bounds):
        q, k, v = (x[start:end].transpose(0, 1)[None] for x in (q_N_H_D, k_N_G_D, v_N_G_D))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
        out[start:end] = o[0].transpose(0, 1)
    return out


def varlen_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers attention interface: ``query [B, Hq, T, D]``, ``key``/``value [B, Hkv, T, D]``
    -> ``[B, T, Hq, D]``; needs ``cu_seq_lens_q`` (int32, over the flattened ``B*T`` tokens)."""
    cu_seqlens: Tensor | None = kwargs.get("cu_seq_lens_q")
    max_len: int | None = kwargs.get("max_length_q")
    if cu_seqlens is None or max_len is None:
        raise VarlenAttentionError(
            f"{VARLEN_ATTENTION} needs cu_seq_lens_q and max_length_q (pass the PackedBatch's "
            "cu_seqlens/max_seqlen; see stacx.train.forward)"
        )
    if dropout:
        raise VarlenAttentionError(f"{VARLEN_ATTENTION} does not support attention dropout")
    b, hq, t, d = query.shape
    hk = key.shape[1]
    q, k, v = (x.transpose(1, 2).reshape(b * t, x.shape[1], d) for x in (query, key, value))
    if _KERNEL is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        varlen_attn, causal, takes_gqa = _KERNEL
        gqa: dict[str, bool] = {}
        if hq != hk:
            if takes_gqa:
                gqa = {"enable_gqa": True}
            else:
                k, v = (x.repeat_interleave(hq // hk, dim=1) for x in (k, v))
        out = varlen_attn(
            q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, scale=scaling, **causal, **gqa
        )
    else:
        out = _segments_reference(q, k, v, cu_seqlens, scaling)
    return out.reshape(b, t, hq, d), None


def _no_mask(*args: object, **kwargs: object) -> None:
    """Mask builder for the varlen path: boundaries travel as cu_seqlens, never as a mask."""
    return None


def use_varlen_attention(model: nn.Module) -> None:
    """Switch a transformers model to the varlen attention, registered first with transformers as
    ``"stacx_varlen"`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(VARLEN_ATTENTION, _no_mask)
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(VARLEN_ATTENTION)
    else:
        model.config._attn_implementation = VARLEN_ATTENTION  # type: ignore[union-attr]
