"""The in-process torch engine, the embedded default backend (CPU or CUDA).

One worker thread owns the model and loops over jobs, admission and one batched decode step; the
asyncio loop only enqueues and awaits. Greedy output equals transformers' ``generate`` whatever
shares the batch; every token is attributed to the weights that sampled it. One device, no TP.
Design: docs/engine.md#the-torch-engine
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from stacx.errors import EngineError
from stacx.hf import read_safetensors
from stacx.inference import adapters
from stacx.inference.decoder import Decoder
from stacx.inference.engine_admission import Holds
from stacx.inference.engine_replays import MultiStepReplays
from stacx.inference.engine_requests import (
    Item,
    Request,
    eos_ids,
    hand_over,
    new_request,
    post,
    put_done,
    put_tokens,
)
from stacx.inference.engine_setup import decode_path, place_model, set_threads
from stacx.inference.engine_warmup import WarmUp, warm_up_plan
from stacx.inference.guided import Guides, mask_logits
from stacx.inference.kv_plan import KVPlan, Place, new_plan
from stacx.inference.sampling import sample_rows
from stacx.ports import Generation, GenerationDelta, SamplingParams

if TYPE_CHECKING:
    from stacx.inference.cuda_graphs import Chunk

T = TypeVar("T")


class TorchEngine(MultiStepReplays):
    """An :class:`~stacx.ports.Engine` running a transformers model in this process.

    ``kv_cache`` ("slots"/"paged", with ``kv_tokens``, ``kv_block``) and ``cache_bytes`` (its
    CUDA budget): kv_plan.new_plan. ``decode_steps``: steps per CUDA-graph replay while every row
    is greedy or plainly sampled (docs/engine.md#the-gpu-decode-step). ``hold_s``,
    ``prefill_tokens``: engine_admission.py. ``threads``, ``kernels``, ``compile``,
    ``compile_mode``, ``gemv_rows``, ``fuse``: engine_setup.py.
    """

    name = "torch"
    grammars = True  # honours SamplingParams.grammar (stacx.inference.guided)

    def __init__(
        self,
        model: str | nn.Module | None = None,
        *,
        device: str = "auto",
        dtype: torch.dtype | None = None,
        max_batch: int | None = None,
        max_len: int = 8192,
        cuda_graphs: bool = True,
        compile: bool | None = None,
        weight_version: int = 0,
        threads: int | None = None,
        decode_steps: int = 16,
        compile_mode: str | None = None,
        fuse: bool = True,
        gemv_rows: int = 4,
        kernels: bool | None = None,
        kv_cache: str = "slots",
        kv_tokens: int | None = None,
        kv_block: int = 64,
        cache_bytes: int | None = None,
        hold_s: float = 0.5,
        prefill_tokens: int | None = None,
    ) -> None:
        """Load `model`: "default"/None, an HF directory, a hub id, or a ready nn.Module."""
        if decode_steps < 1:
            raise EngineError(f"decode_steps must be >= 1, got {decode_steps}")
        self.decode_steps = decode_steps
        set_threads(threads)
        self.model, self.tokenizer, self.model_path, dev = place_model(model, device, dtype)
        self.decoder = Decoder(self.model, max_len, fuse=fuse)
        self._lora = adapters.LoraMerge(self.model)  # LoRA versions: merged at load
        self.device = dev
        self.max_len = self.decoder.max_len
        self.eos_ids = eos_ids(self.model, self.tokenizer)
        self.vocab_size = int(self.decoder.embed.num_embeddings)
        self._guides = Guides(self.tokenizer, self.vocab_size)  # SamplingParams.grammar
        self._plan_cache(kv_cache, max_batch, kv_tokens, kv_block, cache_bytes)
        self._graphed = decode_path(
            self.decoder,
            self._cache,
            dev,
            cuda_graphs=cuda_graphs,
            kernels=kernels,
            compile=compile,
            compile_mode=compile_mode,
            gemv_rows=gemv_rows,
        )
        self._version = weight_version
        self._start(hold_s, prefill_tokens)

    def _plan_cache(
        self,
        kv_cache: str,
        max_batch: int | None,
        kv_tokens: int | None,
        kv_block: int,
        cache_bytes: int | None,
    ) -> None:
        """The KV cache (`new_plan`) and the rows it gives."""
        self.max_batch = max_batch or (64 if self.device.type == "cuda" else 32)
        self._kv: KVPlan = new_plan(
            self.decoder,
            kv_cache,
            self.max_batch,
            kv_tokens=kv_tokens,
            block=kv_block,
            cache_bytes=cache_bytes,
        )
        self.max_batch = self._kv.max_rows  # a cache budget can lower it
        self.kv_cache = kv_cache
        self._cache = self._kv.cache

    def _start(self, hold_s: float, prefill_tokens: int | None) -> None:
        """The scheduler's state (queue, holds, admission) and its thread."""
        self._ahead: tuple[list[Request], Chunk] | None = None  # see _continuation
        self._owner: list[Request | None] = [None] * len(self._kv.tokens)  # per row
        self._waiting: collections.deque[Request] = collections.deque()
        self._blocked = False  # the paged pool refused the next request: retry after a release
        self._holds = Holds(hold_s, patience=self.max_batch)  # rows held for next turns
        self._held_back = False  # every free row is held and the head of the queue claims none
        self._submits = 0  # submissions so far: with the holds and releases, when to reorder
        self._order_key: tuple[int, int, int] | None = None
        self.prefill_tokens = prefill_tokens or self.decoder.prefill_chunk
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        # decode_calls: device calls (graph replays) that made the decode steps; decode_ahead:
        # those launched before their predecessor's tokens were read (see _continuation)
        # preempted: rows evicted from a full paged pool (recomputed later)
        # admit_rounds: admissions that prefilled (each then lets a decode step run), admit_us:
        # their time (the prefill and the first tokens' pick, read on the host: on the device too)
        self.stats = {
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "decode_steps": 0,
            "decode_calls": 0,
            "decode_ahead": 0,
            "preempted": 0,
            "admit_rounds": 0,
            "admit_us": 0,
        }
        if self._graphed is not None:  # graph_captures, capture_us: counted where they happen
            self.stats.update(self._graphed.stats)
            self._graphed.stats = self.stats
        self._thread = threading.Thread(target=self._run, name="stacx-engine", daemon=True)
        self._thread.start()

    # ---- Engine API -------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def running(self) -> int:
        """Requests holding a cache slot now (admitted, not finished)."""
        return self._n_active()

    async def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One :class:`Generation` per prompt; prompt i with a seed uses ``seed + i``."""
        loop = asyncio.get_running_loop()
        reqs = [self._request(p, params, i, loop) for i, p in enumerate(prompts)]
        self._submit(reqs)
        try:
            return list(await asyncio.gather(*(r.future for r in reqs)))
        except asyncio.CancelledError:
            for r in reqs:
                r.cancelled = True  # the worker frees their slots at the next step
            raise

    async def generate_stream(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        """`generate`, streamed as each step produces ids; leaving early aborts the unfinished."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Item] = asyncio.Queue()
        reqs = [self._request(p, params, i, loop) for i, p in enumerate(prompts)]
        for i, r in enumerate(reqs):
            r.on_tokens = functools.partial(put_tokens, queue, i)
            # scheduled after the on_tokens calls the worker posted before it finished r
            r.future.add_done_callback(functools.partial(put_done, queue, i, r))
        self._submit(reqs)
        sent = [0] * len(reqs)
        try:
            left = len(reqs)
            while left:
                item = await queue.get()
                if len(item) == 3:
                    i, ids, lps = item
                    sent[i] += len(ids)
                    yield GenerationDelta(index=i, output_ids=ids, logprobs=lps)
                    continue
                i, r = item
                left -= 1
                gen = r.future.result()  # an EngineError of a failed step raises here
                yield GenerationDelta(
                    index=i,
                    output_ids=gen.output_ids[sent[i] :],
                    logprobs=None if gen.logprobs is None else gen.logprobs[sent[i] :],
                    generation=gen,
                )
        finally:
            for r in reqs:
                r.cancelled = True  # finished ones are unaffected; the others abort next step

    def _submit(self, reqs: list[Request]) -> None:
        with self._cv:
            if self._closing:
                raise EngineError("the engine is closed")
            self._waiting.extend(r for r in reqs if not r.future.done())
            self._submits += 1
            self._held_back = False  # a next turn may have come: admission decides again
            self._cv.notify()

    async def score(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """``log p(output_ids[i] | prompt_ids + output_ids[:i])`` under the current weights."""
        if not prompt_ids or not output_ids:
            raise EngineError("score needs a non-empty prompt and a non-empty output")
        ids = prompt_ids + output_ids
        self._check_ids(ids)
        if len(ids) > self.max_len:
            raise EngineError(f"score: {len(ids)} tokens exceed the context limit {self.max_len}")
        return await self._call(lambda: self.decoder.score(prompt_ids, output_ids))

    async def load_weights(self, path: str | os.PathLike[str], version: int) -> None:
        """Load a safetensors file or a directory of them (see `load_state` for the keys)."""
        state = await asyncio.to_thread(read_safetensors, path)
        await self.load_state(state, version)

    async def load_state(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Load a state dict (`LoadsState`); a subset of the parameters is fine; an unknown key
        or a shape mismatch is an :class:`EngineError` and changes nothing."""
        await self._call(lambda: self._apply_weights(state, version))

    async def load_adapter(
        self, path: str, version: int, state: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Serve base + a LoRA adapter, merged into the weights (`LoadsAdapter`, adapters.py)."""
        scale = await asyncio.to_thread(adapters.scaling, path)
        if state is None:
            state = await asyncio.to_thread(adapters.read_adapter, path)
        await self._call(lambda: self._apply_weights(state, version, scale))

    def kv_usage(self) -> dict[str, int]:
        """`KVPlan.usage` (slots: a running row holds max_len positions whatever its length)."""
        return self._kv.usage()

    def reset_kv_peak(self) -> None:
        self._kv.reset_peak()

    async def flush_cache(self) -> None:
        """Never reuse keys computed so far; drop cached prefixes and next-turn holds."""
        await self._call(self._flush)

    def _flush(self) -> None:
        self._kv.invalidate()
        self._holds.held.clear()  # no next turn can reuse the keys they were held for

    @property
    def graphed(self) -> bool:
        """Whether decode runs from CUDA graphs (whose first use of a shape captures it)."""
        return self._graphed is not None

    async def warm_up(self) -> WarmUp:
        """Build the step's kernels and capture the graphs a first pass meets, before any request
        does (`warm_up_plan`: a prefill at every piece bucket, then greedy and sampled replies at
        every batch bucket, short and long); the prefix cache, holds and counters are then reset,
        so serving starts as on a fresh engine. The open path runs it where decode is `graphed`
        (a CPU engine builds nothing ahead)."""
        t0 = time.perf_counter()
        pool = self._kv.usage()["pool_tokens"]
        long_keys = None
        if self.decoder.kernels:  # where each batch bucket's decode graphs stop changing
            from stacx.inference.triton_attention import most_splits_keys

            long_keys = functools.partial(most_splits_keys, n_kv=self.decoder.n_kv)
        plan = warm_up_plan(
            self.max_batch, self.max_len, self.decode_steps, self.vocab_size, pool, long_keys
        )
        tokens = 0
        hold_s, self._holds.hold_s = self._holds.hold_s, 0.0  # no next turns: hold no rows for any
        try:
            for prompts, params in plan:
                tokens += sum(len(g.output_ids) for g in await self.generate(prompts, params))
        finally:
            self._holds.hold_s = hold_s
        await self._call(self._reset_after_warm_up)
        return WarmUp(time.perf_counter() - t0, sum(len(p) for p, _ in plan), tokens)

    def _reset_after_warm_up(self) -> None:
        self._flush()
        self._kv.reset_peak()
        for key in self.stats:
            self.stats[key] = 0

    async def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        await asyncio.to_thread(self._thread.join)

    # ---- submission (event loop side) ---------------------------------------------------------

    def _check_ids(self, ids: list[int]) -> None:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise EngineError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")

    def _request(
        self, prompt: list[int], params: SamplingParams, index: int, loop: asyncio.AbstractEventLoop
    ) -> Request:
        if not prompt:
            raise EngineError("empty prompt: generation needs at least one prompt token")
        self._check_ids(prompt)
        if len(prompt) >= self.max_len:
            raise EngineError(
                f"prompt of {len(prompt)} tokens leaves no room under the context limit "
                f"{self.max_len}"
            )
        too_long = self._kv.too_long(len(prompt) + 1)
        if too_long:
            raise EngineError(f"prompt of {len(prompt)} tokens: {too_long}")
        req = new_request(prompt, params, index, loop, self.device, self.eos_ids)
        if params.grammar:
            req.guide = self._guides.new(params.grammar)
        if params.max_new_tokens <= 0:
            req.future.set_result(req.generation("length", self._version))
        return req

    async def _call(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                value: T | BaseException = fn()
            except Exception as e:
                value = e if isinstance(e, EngineError) else EngineError(f"{type(e).__name__}: {e}")
            post(loop, fut, value)

        with self._cv:
            if self._closing:
                raise EngineError("the engine is closed")
            self._jobs.append(job)
            self._cv.notify()
        return await fut

    # ---- worker thread ------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not (
                    self._closing
                    or self._jobs
                    or self._n_active()
                    or (self._waiting and not self._held())
                ):
                    self._cv.wait(self._holds.wait_s())  # a hold's end may let a request in
                if self._closing:
                    break
                jobs = list(self._jobs)
                self._jobs.clear()
            try:
                if jobs or self._admissible():
                    self._drain()  # before a weight load, and before the batch changes
                for job in jobs:
                    job()
                self._admit()
                if self._n_active():
                    self._step()
            except Exception as e:  # a broken step fails the requests in it, not the engine
                self._ahead = None
                self._fail_all(EngineError(f"engine step failed: {type(e).__name__}: {e}"))
        with self._cv:
            pending = list(self._waiting)
            self._waiting.clear()
        for r in pending + [r for r in self._owner if r is not None]:
            post(r.loop, r.future, r.generation("abort", self._version))

    def _fail_all(self, err: EngineError) -> None:
        for i, r in enumerate(self._owner):
            if r is not None:
                post(r.loop, r.future, err)
                self._blocked = False
                self._owner[i] = None
                self._kv.release(i, keep=False)

    def _admit(self) -> None:
        """Admit waiting requests while rows (paged: blocks) are free, then prefill them, group
        siblings reusing a prompt admitted in this step last (`Place.after`)."""
        if self._blocked:
            return
        with self._cv:
            # admitted requests own their row at once, so _n_active() already counts them
            if len(self._waiting) > 1 and self._n_active() < self.max_batch:
                self._order_waiting()
            batch = self._take_waiting()
        if not batch:
            return
        t0 = time.perf_counter()
        logits: dict[int, torch.Tensor] = {}
        try:
            for phase in (
                [b for b in batch if b[1].after is None],
                [b for b in batch if b[1].after is not None],
            ):
                if phase:
                    logits.update(self._prefill(phase))
        finally:
            self._kv.end_step()
        reqs = [r for r, _ in batch]
        self._accept(reqs, torch.cat([logits[r.slot] for r in reqs], dim=0))
        self.stats["admit_rounds"] += 1
        self.stats["admit_us"] += int((time.perf_counter() - t0) * 1e6)

    def _prefill(self, batch: list[tuple[Request, Place]]) -> dict[int, torch.Tensor]:
        """Each row's tokens past its reused prefix into the cache; its last token's logits."""
        tokens = [r.prompt + r.output for r, _ in batch]
        self._ensure_cache(len(self._owner), max(map(len, tokens)) + 2)
        for _, p in batch:
            self._kv.copy(p.copies)
        logits = self.decoder.prefill(
            self._cache,
            [p.row for _, p in batch],
            [p.reuse for _, p in batch],
            [t[p.reuse :] for t, (_, p) in zip(tokens, batch, strict=True)],
            [len(t) - p.reuse - 1 for t, (_, p) in zip(tokens, batch, strict=True)],
            run=None if self._graphed is None else self._graphed.prefill_piece,
        )
        for t, (_, p) in zip(tokens, batch, strict=True):
            self.stats["reused_tokens"] += p.reuse
            self.stats["prefill_tokens"] += len(t) - p.reuse
        return {p.row: lg for (_, p), lg in zip(batch, logits, strict=True)}

    def _reserve(self, live: list[Request], steps: int) -> bool:
        """Room for each row's next `steps` positions (paged), preempting the youngest rows to
        the queue's front; a lone row that cannot grow finishes at "length". False: replan."""
        ok = True
        for r in sorted(live, key=lambda r: r.admitted):
            while self._owner[r.slot] is r and not self._kv.reserve(r.slot, r.cached + steps):
                ok = False
                rest = [x for x in live if self._owner[x.slot] is x]
                if len(rest) == 1:
                    self._finish(r, "length")
                    break
                victim = max(rest, key=lambda x: x.admitted)
                self._blocked = False  # (readmitted only with a block to spare per running row)
                self._owner[victim.slot] = None
                self._kv.release(victim.slot, keep=False)
                victim.slot, victim.next_turn = (
                    -1,
                    True,
                )  # readmitted before new work, as next turns are
                self.stats["preempted"] += 1
                with self._cv:
                    self._waiting.appendleft(victim)
        return ok

    def _ensure_cache(self, slots: int, capacity: int) -> None:
        if self._graphed is not None:
            return  # allocated at full size up front
        cap = 64
        while cap < capacity:
            cap *= 2
        self._cache.grow(max(slots, self._cache.slots), min(cap, self.max_len + 1))

    def _step(self) -> None:
        if self._ahead is not None:  # a continuation is running: its tokens come first
            self._run_chunk(*self._ahead)
            return
        live = [r for r in self._owner if r is not None]
        for r in live:
            if r.cancelled:
                self._finish(r, "abort")
        live = [r for r in live if not r.cancelled]
        if not live:
            return
        steps, sampled = self._chunk_plan(live)
        if not self._reserve(live, steps):
            return  # rows were preempted: plan again (admitting first)
        hi = max(r.slot for r in live) + 1
        self._ensure_cache(hi, max(r.cached for r in live) + 2)
        scratch = self._cache.capacity - 1
        ids, pos = [0] * hi, [scratch] * hi
        for r in live:
            ids[r.slot], pos[r.slot] = r.output[-1], r.cached
        kv_len = max(r.cached for r in live) + 1
        if steps > 1:
            assert self._graphed is not None
            draw = None
            if sampled:
                temps, seeds = [0.0] * hi, [0] * hi
                for r in live:
                    temps[r.slot], seeds[r.slot] = r.row.temperature, r.row.seed
                draw = (temps, seeds)
            self._run_chunk(
                live, self._graphed.launch_chunk(ids, pos, kv_len + steps - 1, steps, draw)
            )
            return
        if self._graphed is not None:
            logits = self._graphed.run(ids, pos, kv_len)
        else:
            dev = self.device
            self._cache.sync_table()
            logits = self.decoder.decode(
                self._cache, torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), kv_len
            )
        self.stats["decode_steps"] += 1
        self.stats["decode_calls"] += 1
        if len(live) == hi:  # rows 0..hi-1 all live (`live` is in slot order): no gather
            self._accept(live, logits[:hi])
            return
        rows = torch.tensor([r.slot for r in live], device=logits.device)
        self._accept(live, logits.index_select(0, rows))

    def _accept(self, reqs: list[Request], logits_B_V: torch.Tensor) -> None:
        positions = [len(r.prompt) + len(r.output) - 1 for r in reqs]  # of the token each follows
        logits_B_V = mask_logits(logits_B_V, [r.guide for r in reqs])  # constrained rows
        tokens, logprobs = sample_rows(
            logits_B_V, [r.row for r in reqs], positions, self.decoder.kernels
        )
        # one device->host transfer (ids < 2**24 are exact in float32)
        tok_list, lp_list = torch.stack([tokens.float(), logprobs]).tolist()
        for r, tok_f, lp in zip(reqs, tok_list, lp_list, strict=True):
            self._take(r, int(tok_f), lp)
        hand_over(reqs, self._owner)

    def _take(self, r: Request, tok: int, lp: float) -> bool:
        """Append one sampled token to `r`; finish it on a stop or a limit (returns True)."""
        if r.output:
            self._kv.tokens[r.slot].append(r.output[-1])  # its keys were just written
        if not r.versions or r.versions[-1] != self._version:  # a load since its last token
            r.version_starts.append(len(r.output))
            r.versions.append(self._version)
        r.output.append(tok)
        r.logprobs.append(lp)
        if tok in r.stop_ids or (r.guide is not None and r.guide.consume(tok)):
            self._finish(r, "stop")
            return True
        if (
            len(r.output) >= r.params.max_new_tokens
            or len(r.prompt) + len(r.output) >= self.max_len
        ):
            self._finish(r, "length")
            return True
        return False

    def _finish(self, r: Request, reason: str) -> None:
        self._owner[r.slot] = None
        self._blocked = False
        self._kv.release(r.slot, keep=True)  # prompt + output[:-1] stay as a reusable prefix
        if reason != "abort":  # its episode's next turn may follow: hold the row for it
            self._holds.release(r.prompt)
        post(r.loop, r.future, r.generation(reason, self._version))

    def _apply_weights(
        self, state: Mapping[str, torch.Tensor], version: int, lora_scale: float | None = None
    ) -> None:
        if lora_scale is not None:
            self._lora.merge(state, lora_scale)
        else:
            self._lora.forget()
            self.decoder.load_in_place(state)
        # e.g. not for the final norm or an untied lm_head; an adapter's names are unknown to
        # the decoder, so a LoRA version always drops the keys
        if self.decoder.changes_keys(state):
            self._kv.invalidate()
        self._version = version
