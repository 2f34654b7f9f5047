"""CUDA-graph replay of the decode step, captured once per (batch bucket, `Span`), and
multi-step replays (``launch_chunk``) that pick each step's token on the GPU.

A graph reads static buffers and the cache's fixed tensors: the cache must never be reallocated
after capture and weights must load in place (``copy_``). Padded rows write the scratch cell.
Design: docs/engine.md#cuda-graphs
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from stacx.device_lock import CUDA_EXCLUSIVE
from stacx.inference.decoder import Decoder
from stacx.inference.flat_prefill import FlatPiece
from stacx.inference.kv_cache import KVCache

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
PREFILL_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048)  # tokens of a graphed prefill piece
MIN_KV_BUCKET = 256  # key-length buckets: 256, 384, 512, 768, 1024, 1536, ... (x1.5, x4/3)


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    for s in sizes:
        if s >= n:
            return s
    return n


def kv_bucket(kv_len: int, capacity: int) -> int:
    """The smallest key-length bucket >= kv_len: powers of two and their midpoints, so a step
    reads at most a third more keys than it needs (at batch 64 the keys are most of a step's
    bytes); at most `capacity`."""
    b = MIN_KV_BUCKET
    while b < kv_len:
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3
    return min(b, capacity)


class Span(NamedTuple):
    """A decode graph's key arguments (`Decoder.decode`): the Triton step's are the cache's
    capacity less the scratch cell and the attention's split count, which each row applies to
    its own keys, so one graph serves a batch bucket's every context length with that count (a
    handful: `triton_attention.attention_splits`); the torch step's, the key-length bucket."""

    keys: int
    splits: int = 0


class Chunk(NamedTuple):
    """A launched multi-step replay: its [2, steps, rows] tokens and logprobs land in
    ``host`` (pinned) once ``done`` has completed; ``sampled``: drawn at the rows' temperatures."""

    host: torch.Tensor
    done: torch.cuda.Event
    rows: int
    steps: int
    sampled: bool

    def read(self) -> tuple[list[list[float]], list[list[float]]]:
        self.done.synchronize()
        tok, lp = self.host[:, :, : self.rows].tolist()
        return tok, lp


class GraphedDecode:
    """``run(ids, pos, kv_len)`` -> logits [len(ids), V], replaying a captured graph."""

    def __init__(self, decoder: Decoder, cache: KVCache) -> None:
        self.decoder, self.cache = decoder, cache
        dev = decoder.device
        self.ids = torch.zeros(cache.slots, dtype=torch.long, device=dev)
        self.pos = torch.full((cache.slots,), cache.capacity - 1, dtype=torch.long, device=dev)
        self.last = torch.zeros_like(self.ids)  # each multi-step replay's last token per row
        self.temp = torch.zeros(cache.slots, dtype=torch.float32, device=dev)  # sampled replays'
        self.seed = torch.zeros(cache.slots, dtype=torch.int64, device=dev)
        self.graphs: dict[tuple[int, Span], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # (batch, span, steps, sampled) -> graph
        self.greedy: dict[
            tuple[int, Span, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]
        ] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.prefills: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._uncaptured: set[int] = set()  # prefill buckets whose capture failed: eager
        self._piece: FlatPiece | None = None  # the static inputs of the prefill graphs
        self._host: dict[tuple[int, int], list[torch.Tensor]] = {}  # pinned outputs, 2 per shape
        # graphs captured and their time (with the Triton builds a first capture runs): the
        # engine shares its stats dict, so a pass that meets an uncaptured shape shows it
        self.stats: dict[str, int] = {"graph_captures": 0, "capture_us": 0}

    @contextmanager
    def _counted(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stats["graph_captures"] += 1
            self.stats["capture_us"] += int((time.perf_counter() - t0) * 1e6)

    @torch.inference_mode()
    def prefill_piece(self, piece: FlatPiece) -> torch.Tensor:
        """`KernelStep.prefill_tokens` by a graph captured per token bucket (a turn's new tokens
        cost one replay, not ~12 launches a layer from Python); larger pieces run eagerly."""
        t, n_tiles = piece.ids.shape[0], piece.tiles.shape[0]
        b = bucket(t, PREFILL_BUCKETS)
        from stacx.inference.triton_attention import prefill_tile_tokens

        j = b // prefill_tile_tokens(self.decoder.rep) + min(b, self.cache.slots) + 1
        if t > PREFILL_BUCKETS[-1] or n_tiles > j or b in self._uncaptured:
            return self._prefill_tokens(piece)
        static = self._load_piece(piece, b, j)
        if b not in self.prefills:
            captured = self._capture_prefill(static)
            if captured is None:
                self._uncaptured.add(b)
                return self._prefill_tokens(piece)
            self.prefills[b] = captured
        graph, out = self.prefills[b]
        graph.replay()
        return out[:t]

    def _prefill_tokens(self, piece: FlatPiece) -> torch.Tensor:
        step = self.decoder.kernel_step
        assert step is not None  # flat pieces are the Triton path's prefill
        return step.prefill_tokens(self.cache, piece)

    def _load_piece(self, piece: FlatPiece, b: int, j: int) -> FlatPiece:
        """`piece` padded to `b` tokens and `j` tiles in the static buffers (padding: token 0 of
        row 0 at the scratch position, tiles of no tokens)."""
        if self._piece is None:
            most = PREFILL_BUCKETS[-1]
            dev = self.decoder.device
            most_tiles = most + self.cache.slots + 1
            self._piece = FlatPiece(
                torch.zeros(most, dtype=torch.long, device=dev),
                torch.zeros(most, dtype=torch.long, device=dev),
                torch.zeros(most, dtype=torch.long, device=dev),
                torch.zeros(most_tiles, 3, dtype=torch.int32, device=dev),
                0,
                [],
            )
        ids, pos, rows, tiles, _, _ = self._piece
        t, n_tiles = piece.ids.shape[0], piece.tiles.shape[0]
        ids[:t].copy_(piece.ids)
        pos[:t].copy_(piece.pos)
        rows[:t].copy_(piece.rows)
        tiles[:n_tiles].copy_(piece.tiles)
        ids[t:b].zero_()
        pos[t:b].fill_(self.cache.capacity - 1)
        rows[t:b].zero_()
        tiles[n_tiles:j].zero_()
        return FlatPiece(ids[:b], pos[:b], rows[:b], tiles[:j], 0, [])

    def _capture_prefill(
        self, static: FlatPiece
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        """A graph of `KernelStep.prefill_tokens` over the static inputs (which hold a real piece:
        the warm-up writes its keys, as the replay will); None if it cannot be captured."""
        try:
            with self._counted(), CUDA_EXCLUSIVE.capture():
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self._prefill_tokens(static)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    out = self._prefill_tokens(static)
            return graph, out
        except Exception as e:  # eager prefill still works
            warnings.warn(
                f"capturing the prefill of {static.ids.shape[0]} tokens failed "
                f"({type(e).__name__}: {e}); it runs eagerly",
                stacklevel=2,
            )
            return None

    @torch.inference_mode()
    def run(self, ids: list[int], pos: list[int], kv_len: int) -> torch.Tensor:
        n = len(ids)
        b = min(bucket(n, BATCH_BUCKETS), self.cache.slots)
        t = self._span(b, kv_len)
        self._load_inputs(ids, pos, n, b)
        key = (b, t)
        if key not in self.graphs:
            self.graphs[key] = self._capture(b, t)
        graph, out = self.graphs[key]
        graph.replay()
        return out[:n]

    @torch.inference_mode()
    def launch_chunk(
        self,
        ids: list[int],
        pos: list[int],
        kv_len: int,
        steps: int,
        sample: tuple[list[float], list[int]] | None = None,
    ) -> Chunk:
        """Launch ``steps`` tokens for rows ``[0, len(ids))`` in one replay without waiting: tokens
        and logprobs go to pinned host memory, the advanced inputs stay on the device for
        `continue_chunk`. ``kv_len`` >= ``max(pos) + steps``. Greedy, or ``sample`` =
        (temperature, seed) per row, drawn by `triton_pick.pick` (Triton step only)."""
        n = len(ids)
        if sample is not None and not self.decoder.kernels:
            raise ValueError("sampled multi-step replays need the Triton decode step")
        key = self._chunk_key(n, kv_len, steps, sample is not None)
        b = key[0]
        self._load_inputs(ids, pos, n, b)  # first: a capture's warm-up steps read them
        if sample is not None:
            temps, seeds = sample
            self.temp[:n].copy_(torch.tensor(temps, dtype=torch.float32), non_blocking=True)
            self.seed[:n].copy_(torch.tensor(seeds, dtype=torch.int64), non_blocking=True)
            self.temp[n:b].zero_()
        if key not in self.greedy:
            if (b, key[1]) not in self.graphs:
                self.graphs[(b, key[1])] = self._capture(b, key[1])
            self.greedy[key] = self._capture_greedy(*key)
        return self._replay(key, n)

    @torch.inference_mode()
    def continue_chunk(self, chunk: Chunk, kv_len: int, steps: int) -> Chunk | None:
        """The chunk after `chunk` over the same rows (same temperatures and seeds), from the
        inputs it left on the device; None if that graph is not captured yet."""
        key = self._chunk_key(chunk.rows, kv_len, steps, chunk.sampled)
        if key not in self.greedy:
            return None
        self.cache.sync_table()  # a paged cache: the blocks reserved for this chunk
        return self._replay(key, chunk.rows)

    def _chunk_key(
        self, n: int, kv_len: int, steps: int, sampled: bool
    ) -> tuple[int, Span, int, bool]:
        b = min(bucket(n, BATCH_BUCKETS), self.cache.slots)
        return b, self._span(b, kv_len), steps, sampled

    def _span(self, b: int, kv_len: int) -> Span:
        """The graph arguments for `b` rows reading at most `kv_len` keys (see `Span`)."""
        if self.decoder.kernels:
            from stacx.inference.triton_attention import attention_splits

            return Span(self.cache.capacity - 1, attention_splits(b, self.decoder.n_kv, kv_len))
        return Span(kv_bucket(kv_len, self.cache.capacity))

    def _replay(self, key: tuple[int, Span, int, bool], n: int) -> Chunk:
        b, _, steps, sampled = key
        graph, out = self.greedy[key]
        graph.replay()
        pinned = self._host.setdefault((steps, b), [])
        if len(pinned) < 2:
            pinned.append(torch.empty(out.shape, dtype=out.dtype, pin_memory=True))
        host = pinned.pop(0)
        pinned.append(host)  # alternate: one chunk being read while the next is in flight
        host.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.ids[:b].copy_(self.last[:b])
        self.pos[:b].add_(steps).clamp_(max=self.cache.capacity - 1)
        return Chunk(host, done, n, steps, sampled)

    def _load_inputs(self, ids: list[int], pos: list[int], n: int, b: int) -> None:
        self.cache.sync_table()  # a paged cache: the rows' block tables (a graph input)
        self.ids[:n].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        self.pos[:n].copy_(torch.tensor(pos, dtype=torch.long), non_blocking=True)
        self.ids[n:b].zero_()
        self.pos[n:b].fill_(self.cache.capacity - 1)

    def _chunk_steps(self, b: int, t: Span, steps: int, sampled: bool) -> torch.Tensor:
        ids, pos0 = self.ids[:b], self.pos[:b]
        scratch = self.cache.capacity - 1
        out = torch.empty(2, steps, b, dtype=torch.float32, device=ids.device)
        tok = ids.clone()
        for i in range(steps):
            pos = torch.clamp(pos0 + i, max=scratch)
            logits = self.decoder.decode(self.cache, tok, pos, *t)
            if self.decoder.kernels:  # the pick and its logprob in one pass over the logits
                from stacx.inference.triton_pick import pick

                draw = (self.temp[:b], self.seed[:b], pos) if sampled else None
                tok = pick(logits, out[0, i], out[1, i], draw)
                continue
            logits = logits.float()
            tok = torch.argmax(logits, dim=-1)  # the same ops as sampling.sample at temperature 0
            out[0, i] = tok.float()
            out[1, i] = torch.log_softmax(logits, dim=-1).gather(1, tok[:, None]).squeeze(1)
        self.last[:b].copy_(tok)
        return out

    def _capture_greedy(
        self, b: int, t: Span, steps: int, sampled: bool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # a trainer thread sharing the GPU must not run beside a capture
        with self._counted(), CUDA_EXCLUSIVE.capture():
            return self._capture_greedy_once(b, t, steps, sampled)

    def _capture_greedy_once(
        self, b: int, t: Span, steps: int, sampled: bool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._chunk_steps(b, t, 1, sampled)  # warm up the eager ops around the (warm) decode
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self._chunk_steps(b, t, steps, sampled)
        return graph, out

    def _capture(self, b: int, t: Span) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        try:
            return self._capture_once(b, t)
        except Exception as e:  # torch.compile or Triton failing on this GPU: eager still works
            kind = "Triton" if self.decoder.kernels else "compiled"
            if not (self.decoder.compiled or self.decoder.kernels):
                raise
            warnings.warn(
                f"the {kind} decode step failed ({type(e).__name__}: {e}); using eager torch ops",
                stacklevel=2,
            )
            self.decoder.disable_compile()
            return self._capture_once(b, t)

    def _capture_once(self, b: int, t: Span) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # a trainer thread sharing the GPU must not run beside a capture
        with self._counted(), CUDA_EXCLUSIVE.capture():
            return self._capture_locked(b, t)

    def _capture_locked(self, b: int, t: Span) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        ids, pos = self.ids[:b], self.pos[:b]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up allocator and kernels outside the capture
                self.decoder.decode(self.cache, ids, pos, *t)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the capture is this thread's; stacx.device_lock keeps a trainer
        # sharing the process from running CUDA work beside it
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self.decoder.decode(self.cache, ids, pos, *t)
        return graph, out
