"""The decoder's Triton path: its decode step and flat prefill as hand-written kernels
(triton_kernels.py, triton_attention.py) over the model's own tensors, used in place.

`enable_kernels` switches a :class:`Decoder` to it where `kernels_unsupported` allows: CUDA (or
TRITON_INTERPRET=1), plain nn.Linear projections, RMSNorms, SiLU and a power-of-two head size.
The decoder's torch-op step stays the reference it is tested against. Triton is imported at
first use, so this module imports without it.
Design: docs/engine.md#the-kernels
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from stacx.errors import EngineError
from stacx.inference.decoder import Decoder, Fused
from stacx.inference.flat_prefill import FlatPiece, flat_pieces
from stacx.inference.kv_cache import KVCache

if TYPE_CHECKING:
    from stacx.inference.triton_kernels import Partials


def kernels_unsupported(dec: Decoder) -> str | None:
    """Why the Triton decode step cannot run this model (None: it can)."""
    if dec.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "it runs on CUDA devices (or under TRITON_INTERPRET=1)"
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed"
    if dec.head_dim & (dec.head_dim - 1) or dec.head_dim < 16:
        return f"head_dim {dec.head_dim} is not a power of two >= 16"
    norms = [dec.norm]
    for i, layer in enumerate(dec.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if dec.fused_qkv[i] is None or dec.fused_gate_up[i] is None:
            return f"layer {i}'s q/k/v or gate/up projections are not plain nn.Linear"
        if type(attn.o_proj) is not nn.Linear or type(mlp.down_proj) is not nn.Linear:
            return f"layer {i}'s o_proj or down_proj is not a plain nn.Linear"
        if type(mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
            return f"layer {i}'s activation is {type(mlp.act_fn).__name__}, not SiLU"
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [attn.q_norm, attn.k_norm] if dec.qk_norm else []
    for norm in norms:
        if not _is_rmsnorm(norm):
            return f"{type(norm).__name__} is not an RMSNorm (weight * x / rms(x))"
    return None


def enable_kernels(dec: Decoder, gemv_rows: int = 0, gemm_rows: int = 64) -> None:
    """Run `dec`'s decode steps and prefills as the Triton path: GEMVs up to ``gemv_rows`` rows,
    Triton GEMMs up to ``gemm_rows`` (<= GEMM_ROWS), cuBLAS beyond; EngineError if unsupported."""
    reason = kernels_unsupported(dec)
    if reason is not None:
        raise EngineError(f"the Triton decode step cannot run this model: {reason}")
    dec.kernel_step, dec.gemv_rows = KernelStep(dec), gemv_rows
    from stacx.inference.triton_kernels import GEMM_ROWS

    dec.gemm_rows = min(gemm_rows, GEMM_ROWS)


class KernelLayer(NamedTuple):
    """One layer's tensors as the Triton decode step reads them (the model's own, in place)."""

    in_norm: tuple[torch.Tensor, float]  # weight, eps
    post_norm: tuple[torch.Tensor, float]
    qkv: Fused
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None  # q weight, k weight, eps
    o: Fused
    gate_up: Fused
    down: Fused


class KernelStep:
    """The Triton path of a decoder that `kernels_unsupported` allows: its layers' tensors as the
    kernels read them; rows per projection kind: the decoder's ``gemv_rows`` and ``gemm_rows``."""

    def __init__(self, dec: Decoder) -> None:
        self.dec = dec
        self.layers: list[KernelLayer] = []
        for i, layer in enumerate(dec.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv, gate_up = dec.fused_qkv[i], dec.fused_gate_up[i]
            assert qkv is not None and gate_up is not None  # kernels_unsupported checked
            self.layers.append(
                KernelLayer(
                    _norm(layer.input_layernorm),
                    _norm(layer.post_attention_layernorm),
                    qkv,
                    (attn.q_norm.weight, attn.k_norm.weight, _eps(attn.q_norm))
                    if dec.qk_norm
                    else None,
                    Fused(attn.o_proj.weight, attn.o_proj.bias),
                    gate_up,
                    Fused(mlp.down_proj.weight, mlp.down_proj.bias),
                )
            )

    def decode(
        self,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
        ids_B: torch.Tensor,
        pos_B: torch.Tensor,
        kv_len: int,
        table_B_W: torch.Tensor | None = None,
        splits: int = 0,
    ) -> torch.Tensor:
        """`Decoder._decode_impl` as Triton kernels (projections as chosen in `enable_kernels`);
        ``splits``: the attention's key ranges per row (0: `attention_splits` for ``kv_len``)."""
        from stacx.inference import triton_attention as ta
        from stacx.inference import triton_kernels as tk

        dec = self.dec
        n = ids_B.shape[0]
        x = dec.embed(ids_B)
        small = n <= dec.gemv_rows
        mid = not small and n <= dec.gemm_rows
        residual: torch.Tensor | tk.Partials | None = None
        slot_B, cell_B = None, None  # slots: row r's keys go to slot r at its position
        if table_B_W is not None:
            block = k_cache[0].shape[2]
            slot_B = table_B_W[torch.arange(n, device=pos_B.device), pos_B // block].long()
            cell_B = pos_B % block
        for i, w in enumerate(self.layers):
            if small:
                qkv = tk.gemv(x, *w.qkv, norm=w.in_norm)
            else:
                x, h = tk.add_rmsnorm(x, residual, *w.in_norm)
                qkv = tk.gemm(h, *w.qkv) if mid else F.linear(h, w.qkv.weight, w.qkv.bias)
            q = tk.rope_cache(
                qkv,
                pos_B,
                slot_B,
                k_cache[i],
                v_cache[i],
                dec.cos,
                dec.sin,
                dec.n_heads,
                dec.n_kv,
                w.qk_norm,
                cell=cell_B,
            )
            out = ta.decode_attention(
                q, k_cache[i], v_cache[i], pos_B, kv_len, dec.scaling, table_B_W, splits or None
            )
            x, residual = _kernel_mlp(w, x, residual, out.view(n, -1), small, mid)
        if small and type(dec.lm_head) is nn.Linear:
            return tk.gemv(x, dec.lm_head.weight, dec.lm_head.bias, norm=_norm(dec.norm))
        _, h = tk.add_rmsnorm(x, residual, *_norm(dec.norm))
        return dec._project(dec.lm_head, h)

    def prefill(
        self,
        cache: KVCache,
        slots: list[int],
        offsets: list[int],
        new_ids: list[list[int]],
        logits_from: list[int],
        budget: int,
        run: Callable[[FlatPiece], torch.Tensor] | None,
    ) -> list[torch.Tensor]:
        """`Decoder.prefill` on the Triton step: every row's new tokens as one flat batch (pieces
        of at most `budget` tokens), attention read straight from the cache (`prefill_attention`)."""
        from stacx.inference.triton_attention import prefill_tile_tokens

        dec = self.dec
        hidden: list[list[torch.Tensor]] = [[] for _ in slots]
        tile = prefill_tile_tokens(dec.rep)
        for piece in flat_pieces(slots, offsets, new_ids, budget, tile, dec.device):
            x = run(piece) if run is not None else self.prefill_tokens(cache, piece)
            keep = [j for j, (r, i) in enumerate(piece.picks) if i >= logits_from[r]]
            if not keep:
                continue
            got = x[torch.tensor(keep).to(dec.device, non_blocking=True)]
            start = 0  # a piece's tokens come row by row
            for r, group in itertools.groupby(keep, key=lambda j: piece.picks[j][0]):
                n = len(list(group))
                hidden[r].append(got[start : start + n])
                start += n
        states = [torch.cat(h, dim=0) for h in hidden]
        logits = dec.lm_head(dec.norm(torch.cat(states, dim=0)))
        return list(logits.split([len(h) for h in states]))

    def prefill_tokens(self, cache: KVCache, piece: FlatPiece) -> torch.Tensor:
        """The hidden states [T, hidden] (before the final norm) of a flat piece, its keys and
        values written to the cache; fixed shapes for a piece's size: graph-capturable."""
        from stacx.inference import triton_attention as ta
        from stacx.inference import triton_kernels as tk

        dec = self.dec
        slot_T, cell_T = cache.locate(piece.rows, piece.pos)
        cells = None if cache.table is None else cell_T
        x = dec.embed(piece.ids)
        residual: torch.Tensor | None = None
        for i, w in enumerate(self.layers):
            x, h = tk.add_rmsnorm(x, residual, *w.in_norm)
            qkv = F.linear(h, w.qkv.weight, w.qkv.bias)
            kc, vc = cache.k[i], cache.v[i]
            q = tk.rope_cache(
                qkv,
                piece.pos,
                slot_T,
                kc,
                vc,
                dec.cos,
                dec.sin,
                dec.n_heads,
                dec.n_kv,
                w.qk_norm,
                cell=cells,
            )
            out = ta.prefill_attention(
                q, kc, vc, piece.pos, piece.tiles, dec.scaling, cache.table, piece.keys
            )
            o = F.linear(out.view(out.shape[0], -1), w.o.weight, w.o.bias)
            x, h = tk.add_rmsnorm(x, o, *w.post_norm)
            act = tk.silu_mul(F.linear(h, w.gate_up.weight, w.gate_up.bias))
            residual = F.linear(act, w.down.weight, w.down.bias)
        return x if residual is None else x + residual


def triton_functions() -> list[tuple[str, Any]]:
    """The Triton step's kernels (``triton.runtime.jit.JITFunction``), by name; none without
    triton or under its interpreter."""
    if importlib.util.find_spec("triton") is None:
        return []
    from triton.runtime.jit import JITFunction

    from stacx.inference import triton_attention, triton_kernels, triton_pick

    return [
        (name, fn)
        for module in (triton_kernels, triton_attention, triton_pick)
        for name, fn in vars(module).items()
        if isinstance(fn, JITFunction)
    ]


def triton_builds() -> dict[str, int]:
    """How many builds (one per specialization and device) of each Triton step kernel this
    process holds: a pass that raises a count paid Triton's JIT for it."""
    return {
        name: sum(len(caches[0]) for caches in fn.device_caches.values())
        for name, fn in triton_functions()
    }


def _is_rmsnorm(module: Any) -> bool:
    """transformers' Llama-style RMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps))``."""
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and isinstance(getattr(module, "variance_epsilon", getattr(module, "eps", None)), float)
    )


def _eps(norm: Any) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _norm(norm: Any) -> tuple[torch.Tensor, float]:
    return norm.weight, _eps(norm)


def _kernel_mlp(
    w: KernelLayer,
    x: torch.Tensor,
    residual: torch.Tensor | Partials | None,
    attn: torch.Tensor,
    small: bool,
    mid: bool,
) -> tuple[torch.Tensor, torch.Tensor | Partials | None]:
    """A layer's o projection and MLP as kernels (``small``: GEMVs, ``mid``: Triton GEMMs, else
    cuBLAS): the new ``x`` and the residual the next add+RMSNorm adds (None: already added)."""
    from stacx.inference import triton_kernels as tk

    if small:
        x = tk.gemv(attn, *w.o, residual=x)
        act = tk.gemv(x, *w.gate_up, norm=w.post_norm, glu=True)
        return tk.gemv(act, *w.down, residual=x), residual
    if mid:
        x, h = tk.add_rmsnorm(x, tk.gemm_partials(attn, *w.o), *w.post_norm)
        return x, tk.gemm_partials(tk.gemm(h, *w.gate_up, glu=True), *w.down)
    x, h = tk.add_rmsnorm(x, F.linear(attn, w.o.weight, w.o.bias), *w.post_norm)
    act = tk.silu_mul(F.linear(h, w.gate_up.weight, w.gate_up.bias))
    return x, F.linear(act, w.down.weight, w.down.bias)
