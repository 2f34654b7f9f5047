"""CUDA-graph replay of the decode step.

Per decode step the engine runs ~25 small kernels per layer; at small batch the GPU waits on
Python and kernel launches, not on math. Capturing :meth:`Decoder.decode` once per
(batch bucket, key-length bucket) and replaying it removes that overhead.

Guarantees: a graph reads its inputs from static buffers and the cache's fixed tensors, so the
cache must not be reallocated after capture (the engine allocates it at full size on CUDA), and
weights must be loaded in place (``copy_``), which ``load_state_dict`` does. Padded rows use
the scratch cell (see decoder.py), so running a bucket larger than the live batch is safe.
"""

from __future__ import annotations

import warnings

import torch

from stacx.inference.decoder import Decoder, KVCache

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_KV_BUCKET = 256


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    for s in sizes:
        if s >= n:
            return s
    return n


class GraphedDecode:
    """``run(ids, pos, kv_len)`` -> logits [len(ids), V], replaying a captured graph."""

    def __init__(self, decoder: Decoder, cache: KVCache) -> None:
        self.decoder, self.cache = decoder, cache
        dev = decoder.device
        self.ids = torch.zeros(cache.slots, dtype=torch.long, device=dev)
        self.pos = torch.full((cache.slots,), cache.capacity - 1, dtype=torch.long, device=dev)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def _kv_bucket(self, kv_len: int) -> int:
        b = MIN_KV_BUCKET
        while b < kv_len:
            b *= 2
        return min(b, self.cache.capacity)

    @torch.inference_mode()
    def run(self, ids: list[int], pos: list[int], kv_len: int) -> torch.Tensor:
        n = len(ids)
        b = min(bucket(n, BATCH_BUCKETS), self.cache.slots)
        t = self._kv_bucket(kv_len)
        self.ids[:n].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        self.pos[:n].copy_(torch.tensor(pos, dtype=torch.long), non_blocking=True)
        self.ids[n:b].zero_()
        self.pos[n:b].fill_(self.cache.capacity - 1)
        key = (b, t)
        if key not in self.graphs:
            self.graphs[key] = self._capture(b, t)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:n]

    def _capture(self, b: int, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        try:
            return self._capture_once(b, t)
        except Exception as e:  # torch.compile unavailable or failing here: eager still works
            if getattr(self.decoder, "_decode_fn", None) is None:
                raise
            warnings.warn(
                f"compiled decode failed ({type(e).__name__}: {e}); using eager", stacklevel=2
            )
            self.decoder.disable_compile()
            return self._capture_once(b, t)

    def _capture_once(self, b: int, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        ids, pos = self.ids[:b], self.pos[:b]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up allocator and kernels outside the capture
                self.decoder.decode(self.cache, ids, pos, t)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.decoder.decode(self.cache, ids, pos, t)
        return graph, out
