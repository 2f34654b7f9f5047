"""The in-process engine's forward pass: batched prefill and decode over a KV cache.

It owns attention and the cache (the transformers model supplies weights and layers), so requests
of different lengths share one graph-capturable decode step; padding never corrupts a row, and
fused projections keep the model's parameters the same objects. Llama-style models only. These
are its torch ops; its Triton path (CUDA) is decoder_kernels.py.
Design: docs/engine.md#the-decoder-cache-layout-and-fused-projections
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from stacx.errors import EngineError
from stacx.inference.flat_prefill import FlatPiece
from stacx.inference.kv_cache import KVCache, PagedKVCache, gather_blocks

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


class KernelPath(Protocol):
    """What the decoder runs instead of its torch ops once a Triton path is enabled
    (`decoder_kernels.KernelStep`, which imports this module: the protocol keeps it one way)."""

    def decode(
        self,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
        ids_B: torch.Tensor,
        pos_B: torch.Tensor,
        kv_len: int,
        table_B_W: torch.Tensor | None = None,
        splits: int = 0,
    ) -> torch.Tensor: ...

    def prefill(
        self,
        cache: KVCache,
        slots: list[int],
        offsets: list[int],
        new_ids: list[list[int]],
        logits_from: list[int],
        budget: int,
        run: Callable[[FlatPiece], torch.Tensor] | None,
    ) -> list[torch.Tensor]: ...

    def prefill_tokens(self, cache: KVCache, piece: FlatPiece) -> torch.Tensor: ...


class Decoder:
    """Prefill and decode over a :class:`KVCache` with a transformers model's parameters, used
    in place: a ``copy_`` load takes effect next step and keeps captured CUDA graphs valid."""

    def __init__(self, model: nn.Module, max_len: int, *, fuse: bool = True) -> None:
        # transformers modules are dynamically typed (config fields, submodules by name)
        hf: Any = model
        self.model = model
        cfg = hf.config
        if cfg.model_type not in SUPPORTED_MODEL_TYPES:
            raise EngineError(
                f"model_type {cfg.model_type!r} is not supported by the in-process engine; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        base = hf.model
        self.layers: list[Any] = list(base.layers)
        self.embed: Any = base.embed_tokens
        self.norm: Any = base.norm
        self.lm_head: Any = hf.lm_head
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.rep = self.n_heads // self.n_kv
        attn0 = self.layers[0].self_attn
        self.scaling = float(getattr(attn0, "scaling", self.head_dim**-0.5))
        self.qk_norm = hasattr(attn0, "q_norm")
        limit = int(cfg.max_position_embeddings)
        window = getattr(cfg, "sliding_window", None)
        if window and getattr(cfg, "use_sliding_window", True):
            limit = min(limit, int(window))
        self.max_len = min(max_len, limit)  # longest sequence (prompt + output)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.cos, self.sin = self._rope_tables(hf, self.max_len + 1)
        # tokens per prefill chunk: bigger on GPU, where a chunk costs ~the same launch overhead
        # whatever its size
        self.prefill_chunk = 16384 if self.device.type == "cuda" else 2048
        self.gemv_rows = 0  # see _linear; set by enable_compile
        self.compiled = False
        self.kernel_step: KernelPath | None = None  # the Triton path: decoder_kernels.py
        self.flat_prefill: bool | None = None  # the Triton prefill: None until its first use
        self.gemm_rows = 0  # see decoder_kernels.enable_kernels
        self.qkv_split = (
            self.n_heads * self.head_dim,
            self.n_kv * self.head_dim,
            self.n_kv * self.head_dim,
        )
        self.fused_qkv: list[Fused | None] = []
        self.fused_gate_up: list[Fused | None] = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
            gate_up = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj")]
            ok_mlp = hasattr(mlp, "down_proj") and hasattr(mlp, "act_fn")
            self.fused_qkv.append(fuse_rows(qkv) if fuse else None)
            self.fused_gate_up.append(fuse_rows(gate_up) if fuse and ok_mlp else None)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.n_kv, self.head_dim, self.dtype, self.device)

    def new_paged_cache(self, rows: int, blocks: int, block: int) -> PagedKVCache:
        """A pool of `blocks` blocks of `block` positions read by `rows` decode rows."""
        return PagedKVCache(
            len(self.layers),
            self.n_kv,
            self.head_dim,
            self.dtype,
            self.device,
            rows=rows,
            max_len=self.max_len,
            blocks=blocks,
            block=block,
        )

    def _rope_tables(self, model: Any, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Same arithmetic as transformers' rotary modules: fp32 freqs, cat(freqs, freqs),
        # times attention_scaling, cast to the model dtype.
        rotary = getattr(model.model, "rotary_emb", None) or getattr(
            self.layers[0].self_attn, "rotary_emb", None
        )
        if rotary is None or not hasattr(rotary, "inv_freq"):
            raise EngineError("the model exposes no rotary embedding module (rotary_emb)")
        inv_freq = rotary.inv_freq.float().to(self.device)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        pos = torch.arange(length, device=self.device, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(self.dtype), (emb.sin() * scale).to(self.dtype)

    def _qkv(
        self, i: int, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [..., H, D], k and v [..., Hkv, D] with rope applied; `cos`/`sin` are [..., D]."""
        attn = layer.self_attn
        lead = h.shape[:-1]
        fused = self.fused_qkv[i]
        if fused is not None:
            q, k, v = self._linear(h, fused.weight, fused.bias).split(self.qkv_split, dim=-1)
        else:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        q = q.view(*lead, self.n_heads, self.head_dim)
        k = k.view(*lead, self.n_kv, self.head_dim)
        v = v.view(*lead, self.n_kv, self.head_dim)
        if self.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _mlp(self, i: int, layer: Any, h: torch.Tensor) -> torch.Tensor:
        mlp = layer.mlp
        fused = self.fused_gate_up[i]
        if fused is None:
            return mlp(h)  # type: ignore[no-any-return]
        gate, up = self._linear(h, fused.weight, fused.bias).chunk(2, dim=-1)
        return self._project(mlp.down_proj, mlp.act_fn(gate) * up)

    def _project(self, module: Any, h: torch.Tensor) -> torch.Tensor:
        if type(module) is nn.Linear:
            return self._linear(h, module.weight, module.bias)
        return module(h)  # type: ignore[no-any-return]

    def _linear(
        self, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``F.linear``; while compiling a step of at most ``gemv_rows`` rows, a multiply-and-sum
        that inductor makes one GEMV kernel (never eagerly: it would build [rows, out, in])."""
        if h.dim() == 2 and h.shape[0] <= self.gemv_rows and torch.compiler.is_compiling():
            out = (h[:, None, :].float() * weight.float()).sum(-1)
            if bias is not None:
                out = out + bias.float()
            return out.to(h.dtype)
        return F.linear(h, weight, bias)

    def enable_compile(self, mode: str | None = None, gemv_rows: int = 0) -> None:
        """Run the decode step through ``torch.compile`` (``mode``: its mode); steps of at most
        ``gemv_rows`` rows compile per shape with GEMVs (`_linear`). Shapes and figures:
        docs/engine.md#the-compiled-step."""
        # every shape of the static small-batch compile is one cache entry of the same code
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self.gemv_rows, self.compiled = gemv_rows, True
        self._decode_fn = torch.compile(self._decode_impl, mode=mode)
        self._decode_small = (
            torch.compile(self._decode_impl, mode=mode, dynamic=False)
            if gemv_rows
            else self._decode_fn
        )

    @property
    def kernels(self) -> bool:
        """Whether decode steps and prefills run as the Triton path (`kernel_step`)."""
        return self.kernel_step is not None

    def disable_compile(self) -> None:
        self.gemv_rows, self.compiled = 0, False
        self.kernel_step = None
        self._decode_fn = self._decode_small = self._decode_impl

    @torch.inference_mode()
    def decode(
        self,
        cache: KVCache,
        ids_B: torch.Tensor,
        pos_B: torch.Tensor,
        kv_len: int,
        splits: int = 0,
    ) -> torch.Tensor:
        """One token for each of rows ``[0, B)``: writes its k/v at ``pos``, returns logits [B, V].
        Reads keys ``[0, kv_len)`` (``pos < kv_len <= capacity``); graph-capturable shapes. The
        Triton step splits each row's keys into ``splits`` ranges (0: its rule for ``kv_len``)."""
        table = None if cache.table is None else cache.table[: ids_B.shape[0]]  # paged: row r's
        if self.kernel_step is not None:
            return self.kernel_step.decode(cache.k, cache.v, ids_B, pos_B, kv_len, table, splits)
        small = ids_B.shape[0] <= self.gemv_rows
        fn = getattr(self, "_decode_small" if small else "_decode_fn", self._decode_impl)
        visible = torch.arange(kv_len, device=ids_B.device)[None, :] <= pos_B[:, None]
        if self.compiled:
            torch._dynamo.mark_static(visible, 1)  # the key length: see enable_compile
        return fn(cache.k, cache.v, ids_B, pos_B, visible, table)  # type: ignore[no-any-return]

    def _decode_impl(
        self,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
        ids_B: torch.Tensor,
        pos_B: torch.Tensor,
        visible_B_T: torch.Tensor,
        table_B_W: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The torch-op step; ``table_B_W``: a paged cache's block tables (None: slot r)."""
        n, kv_len = visible_B_T.shape
        rows = torch.arange(n, device=ids_B.device)
        cell_rows, cells = rows, pos_B
        if table_B_W is not None:
            block = k_cache[0].shape[2]
            cell_rows, cells = table_B_W[rows, pos_B // block].long(), pos_B % block
            table_B_W = table_B_W[:, : -(-kv_len // block)].long()
        x = self.embed(ids_B)
        cos, sin = self.cos[pos_B], self.sin[pos_B]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, layer, layer.input_layernorm(x), cos, sin)
            kc, vc = k_cache[i], v_cache[i]
            kc[cell_rows, :, cells] = k
            vc[cell_rows, :, cells] = v
            if table_B_W is None:
                keys, values = kc[:n, :, :kv_len], vc[:n, :, :kv_len]
            else:
                keys, values = (
                    gather_blocks(kc, table_B_W, kv_len),
                    gather_blocks(vc, table_B_W, kv_len),
                )
            qg = q.view(n, self.n_kv, self.rep, self.head_dim)
            scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * self.scaling
            scores = scores.masked_fill(~visible_B_T[:, None, None, :], float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            out = torch.matmul(probs, values).reshape(n, self.n_heads * self.head_dim)
            x = x + self._project(layer.self_attn.o_proj, out)
            x = x + self._mlp(i, layer, layer.post_attention_layernorm(x))
        return self._project(self.lm_head, self.norm(x))

    @torch.inference_mode()
    def score(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """Teacher-forced ``log_softmax(logits)[token]`` of each output token (own cache)."""
        ids = prompt_ids + output_ids
        cache = self.new_cache()
        cache.grow(1, len(ids) + 1)
        (logits,) = self.prefill(cache, [0], [0], [ids], [len(prompt_ids) - 1])
        logp = torch.log_softmax(logits[: len(output_ids)].float(), dim=-1)
        target = torch.tensor(output_ids, device=logp.device)[:, None]
        return logp.gather(1, target).squeeze(1).tolist()  # type: ignore[no-any-return]

    def load_in_place(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy `state` into the parameters in place (fused tensors, CUDA graphs stay valid); an
        unknown name or a shape mismatch is an :class:`EngineError` and changes nothing."""
        own = self.model.state_dict()
        unknown = [k for k in state if k not in own]
        if unknown:
            raise EngineError(f"weights: unknown parameter names {unknown[:5]} (not in this model)")
        bad = [k for k, t in state.items() if tuple(t.shape) != tuple(own[k].shape)]
        if bad:
            raise EngineError(f"weights: shape mismatch for {bad[:5]}")
        with torch.no_grad():
            for k, t in state.items():
                own[k].copy_(t.to(device=own[k].device, dtype=own[k].dtype))

    def changes_keys(self, names: Mapping[str, object]) -> bool:
        """Whether loading these names changes cached keys: all do but the final norm, an untied
        lm_head and the last layer's o_proj, MLP and post-attention norm."""
        own = self.model.state_dict(keep_vars=True)
        last = self.layers[-1]
        feeding = [self.embed, *self.layers[:-1], last.input_layernorm, last.self_attn]
        ptrs = {t.data_ptr() for m in feeding for t in m.state_dict(keep_vars=True).values()}
        late = {t.data_ptr() for t in last.self_attn.o_proj.state_dict(keep_vars=True).values()}
        return any(k not in own or own[k].data_ptr() in ptrs - late for k in names)  # unknown: yes

    @torch.inference_mode()
    def prefill(
        self,
        cache: KVCache,
        slots: list[int],
        offsets: list[int],
        new_ids: list[list[int]],
        logits_from: list[int],
        token_budget: int | None = None,
        run: Callable[[FlatPiece], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Feed ``new_ids[i]`` into slot ``slots[i]`` from position ``offsets[i]`` (positions before
        it must be valid), chunked to ~`token_budget` tokens at once. Returns per row the logits
        [t_i - logits_from[i], V] after each new token from index ``logits_from[i]`` on.
        ``run``: runs one flat piece (`KernelStep.prefill_tokens`'s arguments; a CUDA graph's
        replay)."""
        cache.sync_table()
        step = self.kernel_step
        if step is not None and self.flat_prefill is not False:
            budget = token_budget or self.prefill_chunk
            try:
                got = step.prefill(cache, slots, offsets, new_ids, logits_from, budget, run)
            except Exception as e:  # the Triton build failing on this GPU, at its first use
                if self.flat_prefill or self.device.type != "cuda":
                    raise
                warnings.warn(
                    f"the Triton prefill failed ({type(e).__name__}: {e}); "
                    "prefills run as torch ops",
                    stacklevel=2,
                )
                self.flat_prefill = False
            else:
                self.flat_prefill = True
                return got
        return self._prefill_torch(cache, slots, offsets, new_ids, logits_from, token_budget)

    def _prefill_torch(
        self,
        cache: KVCache,
        slots: list[int],
        offsets: list[int],
        new_ids: list[list[int]],
        logits_from: list[int],
        token_budget: int | None,
    ) -> list[torch.Tensor]:
        """`prefill` as torch ops (rows padded to the longest), chunk by chunk."""
        n = len(slots)
        lens = [len(ids) for ids in new_ids]
        t_max = max(lens)
        dev = self.device
        scratch = cache.capacity - 1
        ids = torch.zeros(n, t_max, dtype=torch.long)
        for r, row in enumerate(new_ids):
            ids[r, : lens[r]] = torch.tensor(row, dtype=torch.long)
        ids = ids.to(dev)
        j = torch.arange(t_max, device=dev)
        off = torch.tensor(offsets, device=dev)
        valid = j[None, :] < torch.tensor(lens, device=dev)[:, None]
        pos = torch.where(valid, off[:, None] + j[None, :], scratch)
        slot_idx = torch.tensor(slots, device=dev)
        # attention reads the rows' keys back from the cache: a slice (a view) when the slots
        # are consecutive, else a gather
        rows: slice | torch.Tensor = (
            slice(slots[0], slots[0] + n)
            if slots == list(range(slots[0], slots[0] + n))
            else slot_idx
        )
        budget = token_budget or self.prefill_chunk
        chunk = max(16, budget // n)
        hidden: list[list[torch.Tensor]] = [[] for _ in range(n)]
        # fresh prompts in one chunk attend only to their own new keys: plain causal attention
        fresh = t_max <= chunk and not any(offsets)
        for c0 in range(0, t_max, chunk):
            c1 = min(t_max, c0 + chunk)
            kv_len = max(o + min(t, c1) for o, t in zip(offsets, lens, strict=True))
            where = cache.locate(slot_idx[:, None], pos[:, c0:c1])  # the chunk's cache cells
            x = self._prefill_chunk(cache, where, rows, ids[:, c0:c1], pos[:, c0:c1], kv_len, fresh)
            for r in range(n):
                lo, hi = max(c0, logits_from[r]), min(c1, lens[r])
                if lo < hi:
                    hidden[r].append(x[r, lo - c0 : hi - c0])
        # one norm and lm_head GEMM for all rows (per row, 64 rows cost 64 weight reads)
        states = [torch.cat(h, dim=0) for h in hidden]
        logits = self.lm_head(self.norm(torch.cat(states, dim=0)))
        return list(logits.split([len(h) for h in states]))

    def _prefill_chunk(
        self,
        cache: KVCache,
        where: tuple[torch.Tensor, torch.Tensor],
        rows: slice | torch.Tensor,
        ids: torch.Tensor,
        pos: torch.Tensor,
        kv_len: int,
        fresh: bool = False,
    ) -> torch.Tensor:
        """One chunk of prefill. ``fresh``: each row's whole prompt from position 0, so attention
        is causal over the chunk's own keys, no mask; ``rows``: the slots attention reads;
        ``where``: each token's (storage row, cell), from ``cache.locate``."""
        n, c = ids.shape
        x = self.embed(ids)
        key_pos = torch.arange(kv_len, device=ids.device)
        mask = None if fresh else (key_pos[None, None, :] <= pos[:, :, None])[:, None]
        cos, sin = self.cos[pos], self.sin[pos]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, layer, layer.input_layernorm(x), cos, sin)
            kc, vc = cache.k[i], cache.v[i]
            kc[where[0], :, where[1]] = (
                k  # [n, c, Hkv, D] into (slot, pos) cells (paged: block, offset)
            )
            vc[where[0], :, where[1]] = v
            if fresh:
                keys, values = k.transpose(1, 2), v.transpose(1, 2)
            else:
                keys, values = cache.keys(kc, rows, kv_len), cache.keys(vc, rows, kv_len)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                keys,
                values,
                attn_mask=mask,
                is_causal=fresh,
                scale=self.scaling,
                enable_gqa=self.rep > 1,
            )
            x = x + layer.self_attn.o_proj(out.transpose(1, 2).reshape(n, c, -1))
            x = x + self._mlp(i, layer, layer.post_attention_layernorm(x))
        return x


class Fused(NamedTuple):
    weight: torch.Tensor  # [sum of out_features, in_features]
    bias: torch.Tensor | None


def fuse_rows(linears: list[Any]) -> Fused | None:
    """One weight whose row blocks ARE the layers' weights (``weight.data``/``bias.data``
    re-pointed), so in-place loads land in it. None, changing nothing, unless all are plain
    ``nn.Linear`` of one device and dtype, all with or all without bias."""
    if not linears or not all(type(m) is nn.Linear for m in linears):
        return None
    ws = [m.weight for m in linears]
    if len({(w.device, w.dtype, w.shape[1]) for w in ws}) != 1:
        return None
    has_bias = [m.bias is not None for m in linears]
    if any(has_bias) and not all(has_bias):
        return None
    with torch.no_grad():
        weight = torch.cat([w.detach() for w in ws])
        bias = torch.cat([m.bias.detach() for m in linears]) if all(has_bias) else None
        row = 0
        for m in linears:
            n = m.weight.shape[0]
            m.weight.data = weight[row : row + n]
            if bias is not None:
                m.bias.data = bias[row : row + n]
            row += n
    return Fused(weight, bias)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
