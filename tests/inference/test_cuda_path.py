"""The CUDA path (static cache + CUDA-graph decode) on a small random Qwen3 (q/k norms, GQA):
greedy tokens equal transformers' greedy `generate`. Skipped where there is no GPU (CI)."""

from __future__ import annotations

import msgspec
import pytest
import torch

from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def small_qwen3() -> torch.nn.Module:
    import transformers

    cfg = transformers.Qwen3Config(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=512,
        vocab_size=1000,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).float().cuda().eval()


def hf_greedy(model: torch.nn.Module, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each prompt's `n` greedy tokens from transformers' `generate`, alone, EOS ignored."""
    refs = []
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        out = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        refs.append(out[0, len(p) :].tolist())
    return refs


@pytest.mark.parametrize(
    ("graphs", "gemv_rows", "lengths"),
    [
        (True, 4, (5, 17, 40)),  # <= gemv_rows rows: compiled reduction GEMVs, 16 steps per replay
        (True, 0, (5, 17, 40)),  # the Triton kernel step at 3 rows (keys split across programs)
        (True, 4, (5, 17, 40, 9, 33, 12, 27, 50, 3, 21, 44, 8)),  # the kernel step, cuBLAS GEMMs
        (False, 4, (5, 17, 40)),
    ],
)
async def test_cuda_greedy_equals_hf_generate(
    graphs: bool, gemv_rows: int, lengths: tuple[int, ...]
) -> None:
    model = small_qwen3()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in lengths]
    refs = hf_greedy(model, prompts, 12)
    engine = TorchEngine(
        model,
        device="cuda",
        dtype=torch.float32,
        max_batch=16,
        max_len=128,
        cuda_graphs=graphs,
        gemv_rows=gemv_rows,
    )
    d = engine.decoder
    assert (engine.decode_steps, d.gemv_rows, d.kernels) == (
        (16, gemv_rows, True) if graphs else (16, 0, False)
    )
    try:
        gens = await engine.generate(
            prompts, SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
        )
    finally:
        await engine.close()
    assert [g.output_ids for g in gens] == refs


async def test_multi_step_greedy_replay_equals_one_step_per_replay() -> None:
    """Chunks of 16 greedy steps per graph replay give the same tokens, logprobs and finish
    reasons as one step per replay, with rows stopping mid-chunk (a stop id) and at the
    context limit."""
    model = small_qwen3()
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (7, 30, 61)]
    results = []
    for steps in (1, 16):
        engine = TorchEngine(
            model, device="cuda", dtype=torch.float32, max_batch=8, max_len=160, decode_steps=steps
        )
        try:
            (first,) = await engine.generate(
                [prompts[0]], SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
            )
            stop = first.output_ids[21]  # a token the greedy row really produces mid-chunk
            gens = await engine.generate(
                prompts,
                SamplingParams(
                    max_new_tokens=37, temperature=0.0, ignore_eos=True, stop_token_ids=[stop]
                ),
            )
            long = await engine.generate(
                [prompts[1]], SamplingParams(max_new_tokens=150, temperature=0.0, ignore_eos=True)
            )
        finally:
            await engine.close()
        results.append([(g.output_ids, g.finish_reason, g.logprobs) for g in [first, *gens, *long]])
        # 16 steps per replay: chunks were launched while the previous one's tokens were read
        assert (engine.stats["decode_ahead"] > 0) == (steps == 16)
    one, multi = results
    assert [r[:2] for r in multi] == [r[:2] for r in one]
    assert multi[1][1] == "stop" and len(multi[1][0]) <= 22
    assert multi[4][1] == "length" and len(multi[4][0]) == 160 - len(prompts[1])  # context limit
    for (_, _, lp1), (_, _, lpm) in zip(one, multi, strict=True):
        assert torch.allclose(torch.tensor(lp1), torch.tensor(lpm), atol=1e-4)


async def test_a_request_joining_a_running_greedy_batch_gets_its_own_tokens() -> None:
    """A request submitted while chunks run ahead on the device waits for them to be read,
    is admitted, and both get exactly their greedy tokens (each equal to running it alone)."""
    import asyncio

    model = small_qwen3()
    gen = torch.Generator().manual_seed(3)
    first, second = (torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (11, 23))
    params = SamplingParams(max_new_tokens=100, temperature=0.0, ignore_eos=True)
    engine = TorchEngine(model, device="cuda", dtype=torch.float32, max_batch=8, max_len=160)
    try:
        alone = [(await engine.generate([p], params))[0].output_ids for p in (first, second)]
        await engine.flush_cache()
        ahead = engine.stats["decode_ahead"]
        running = asyncio.ensure_future(engine.generate([first], params))
        while engine.stats["decode_ahead"] == ahead:  # noqa: ASYNC110 (a counter of the engine thread)
            await asyncio.sleep(0.001)
        (late,) = await engine.generate([second], params)
        (early,) = await running
    finally:
        await engine.close()
    assert [early.output_ids, late.output_ids] == alone


async def test_sampled_rows_run_in_multi_step_replays_and_repeat_per_seed() -> None:
    """Rows sampled at a plain temperature run 16 steps per replay, drawn on the GPU: a seeded
    row repeats its tokens alone, beside another row, and beside a top-p row (which sends the
    batch to the per-step path); a greedy row beside sampled ones keeps its greedy tokens; the
    reported logprobs are the model's (teacher-forced scores of the same tokens)."""
    import asyncio

    model = small_qwen3()
    gen = torch.Generator().manual_seed(4)
    p1, p2 = (torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (9, 26))
    hot = SamplingParams(max_new_tokens=40, temperature=1.0, seed=11, ignore_eos=True)
    greedy = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    nucleus = SamplingParams(max_new_tokens=40, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True)
    engine = TorchEngine(model, device="cuda", dtype=torch.float32, max_batch=8, max_len=160)
    try:
        (alone,) = await engine.generate([p1], hot)
        steps, calls = engine.stats["decode_steps"], engine.stats["decode_calls"]
        assert steps / calls > 4  # multi-step replays, not one step per replay
        pair = await engine.generate([p1, p2], hot)  # p2 is seeded 12
        (greedy_alone,) = await engine.generate([p2], greedy)
        (g_mixed,), (s_mixed,) = await asyncio.gather(
            engine.generate([p2], greedy), engine.generate([p1], hot)
        )
        (s_beside_top_p,), _ = await asyncio.gather(
            engine.generate([p1], hot), engine.generate([p2], nucleus)
        )
        scored = await engine.score(p1, alone.output_ids)
    finally:
        await engine.close()
    assert pair[0].output_ids == alone.output_ids != pair[1].output_ids
    assert s_mixed.output_ids == alone.output_ids == s_beside_top_p.output_ids
    assert g_mixed.output_ids == greedy_alone.output_ids
    assert len(set(alone.output_ids)) > 10  # sampled, not a greedy loop
    torch.testing.assert_close(
        torch.tensor(alone.logprobs), torch.tensor(scored), atol=1e-3, rtol=0
    )


async def test_captures_beside_a_training_thread_on_the_same_gpu() -> None:
    """An engine and a trainer sharing a process and a GPU (colocated, local placement): while a
    thread trains with dropout (random ops on the default CUDA generator) and a compiled step
    under stacx.device_lock, as the trainer does, the engine captures graphs for new batch shapes
    and samples with top-p (the host sampler) without the "Offset increment outside graph
    capture" failure that used to poison every later engine step."""
    import asyncio
    import threading

    from stacx.device_lock import exclusive

    engine = TorchEngine(
        small_qwen3(), device="cuda", dtype=torch.float32, max_batch=16, max_len=256
    )
    student = small_qwen3().train()
    student.model.layers[0].compile(dynamic=True)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4)
    stop, errors, steps = threading.Event(), [], [0]

    def step() -> None:
        ids = torch.randint(3, 1000, (4, 64), device="cuda")
        hidden = torch.nn.functional.dropout(student.model(ids).last_hidden_state, 0.1)
        student.lm_head(hidden).float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()

    def train() -> None:
        try:
            while not stop.is_set():
                exclusive(step)
                steps[0] += 1
        except BaseException as e:  # reported below, not swallowed
            errors.append(e)

    worker = threading.Thread(target=train)
    worker.start()
    gen = torch.Generator().manual_seed(7)
    try:
        for rows in (1, 3, 5, 9, 16, 2, 12):  # new batch buckets: new captures
            prompts = [
                torch.randint(3, 1000, (int(n),), generator=gen).tolist()
                for n in torch.randint(5, 120, (rows,), generator=gen)
            ]
            nucleus = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, ignore_eos=True)
            hot = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True)
            outs = await asyncio.gather(
                engine.generate(prompts, nucleus), engine.generate(prompts, hot)
            )
            assert all(len(g.output_ids) == 24 for out in outs for g in out)
    finally:
        stop.set()
        await asyncio.to_thread(worker.join)
        await engine.close()
    assert not errors, errors
    assert steps[0] > 0


@pytest.mark.parametrize("kernels", [True, False])
async def test_paged_cache_on_cuda_equals_hf_under_preemption_and_group_sharing(
    kernels: bool,
) -> None:
    """The paged cache on the CUDA path (graphs, 16 steps per replay, replays launched ahead,
    the block table a graph input): greedy rows equal HF generate with a pool too small for
    them (rows are preempted and recomputed), and a group of samples of one prompt prefills
    it once, each sample what its seed gives alone."""
    model = small_qwen3()
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (5, 17, 40, 33, 61, 8)]
    refs = hf_greedy(model, prompts, 48)
    engine = TorchEngine(
        model,
        device="cuda",
        dtype=torch.float32,
        max_batch=8,
        max_len=160,
        kv_cache="paged",
        kv_tokens=256,
        kv_block=16,
        kernels=kernels,
        compile=False,
    )
    try:
        gens = await engine.generate(
            prompts, SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
        )
        assert [g.output_ids for g in gens] == refs
        assert engine.stats["preempted"] > 0  # and multi-step replays ran over block tables:
        assert engine.stats["decode_steps"] > 2 * engine.stats["decode_calls"]
        hot = SamplingParams(max_new_tokens=20, temperature=1.0, seed=3, ignore_eos=True)
        before = engine.stats["prefill_tokens"]
        group = await engine.generate([prompts[2]] * 4, hot)
        assert engine.stats["prefill_tokens"] - before <= len(prompts[2]) + 3
        await engine.flush_cache()
        alone = [
            (await engine.generate([prompts[2]], msgspec.structs.replace(hot, seed=3 + i)))[0]
            for i in range(4)
        ]
    finally:
        await engine.close()
    assert [g.output_ids for g in group] == [a.output_ids for a in alone]


async def test_a_cache_budget_sizes_the_kv_cache_in_new_plan() -> None:
    """``cache_bytes`` (placement.engine_cache_gib) decides the cache's size in kv_plan's
    new_plan: slots keep the full-length rows that fit (and still serve more requests than
    rows), a paged pool stays within the budget, a budget below one row is refused."""
    from stacx.errors import EngineError

    model = small_qwen3()
    per_token = 2 * 4 * 2 * 32 * 4  # layers x (k, v) x kv heads x head_dim x fp32
    per_row = per_token * 129  # max_len + 1 positions
    engine = TorchEngine(
        model,
        device="cuda",
        dtype=torch.float32,
        max_batch=16,
        max_len=128,
        cuda_graphs=False,
        cache_bytes=3 * per_row + 100,
    )
    try:
        assert engine.max_batch == 3
        assert engine.kv_usage()["bytes"] <= 3 * per_row + 100
        gens = await engine.generate(
            [[5, 6, 7]] * 5, SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
        )
        assert [len(g.output_ids) for g in gens] == [4] * 5
    finally:
        await engine.close()
    budget = 1000 * per_token
    paged = TorchEngine(
        model,
        device="cuda",
        dtype=torch.float32,
        max_batch=16,
        max_len=128,
        cuda_graphs=False,
        kv_cache="paged",
        kv_block=16,
        cache_bytes=budget,
    )
    try:
        usage = paged.kv_usage()
        assert usage["bytes"] <= budget
        assert usage["pool_tokens"] >= 1000 - 2 * 16
    finally:
        await paged.close()
    with pytest.raises(EngineError, match="engine_cache_gib"):
        TorchEngine(
            model,
            device="cuda",
            dtype=torch.float32,
            max_batch=4,
            max_len=128,
            cuda_graphs=False,
            cache_bytes=per_row - 1,
        )


def test_decode_attention_compiles_once_for_every_key_count_and_batch() -> None:
    """The split count and key range of a decode-attention launch are runtime arguments: every
    (batch bucket, key bucket) of a run shares one compiled kernel per split/no-split, so a cold
    engine does not pay a Triton compile per new context length (the cold pass's JIT time)."""
    from stacx.inference import triton_attention as ta

    dev = torch.device("cuda")
    n_heads, n_kv, dim, slots, cap = 8, 2, 64, 64, 4096
    gen = torch.Generator(device=dev).manual_seed(0)
    k_cache = torch.randn(slots, n_kv, cap, dim, device=dev, generator=gen, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    dev_caches = ta._decode_attn_kernel.device_caches
    before = set(dev_caches[torch.cuda.current_device()][0]) if dev_caches else set()
    worst = 0.0
    for batch in (1, 3, 16, 64):
        for keys in (256, 384, 1024, 3072):
            q = torch.randn(batch, n_heads, dim, device=dev, generator=gen, dtype=torch.bfloat16)
            pos = torch.randint(0, keys, (batch,), device=dev, generator=gen)
            out = ta.decode_attention(q, k_cache, v_cache, pos, keys, dim**-0.5)
            for b in range(batch):
                n = int(pos[b]) + 1
                k = k_cache[b, :, :n].float().repeat_interleave(n_heads // n_kv, 0)
                v = v_cache[b, :, :n].float().repeat_interleave(n_heads // n_kv, 0)
                w = torch.softmax(q[b].float()[:, None, :] @ k.transpose(1, 2) * dim**-0.5, -1)
                ref = (w @ v)[:, 0]
                worst = max(worst, float((out[b].float() - ref).norm() / ref.norm()))
    assert worst < 1e-2
    # the variants this test built (earlier tests' fp32 engines built their own)
    compiled = set(ta._decode_attn_kernel.device_caches[torch.cuda.current_device()][0]) - before
    assert len(compiled) <= 2, f"{len(compiled)} compiled variants of _decode_attn_kernel"


async def test_a_warm_up_captures_each_bucket_before_the_first_request_and_changes_no_output() -> (
    None
):
    """`TorchEngine.warm_up` (what `stacx run` and `stacx serve` do before serving on CUDA)
    captures a prefill graph per piece bucket and greedy and sampled multi-step replays at every
    batch bucket; a warmed engine's greedy rows still equal HF generate, and its seeded samples
    what a fresh engine draws."""
    from stacx.inference.cuda_graphs import BATCH_BUCKETS, PREFILL_BUCKETS

    model = small_qwen3()
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (5, 40, 300)]
    refs = hf_greedy(model, prompts, 40)

    def make() -> TorchEngine:
        return TorchEngine(
            model,
            device="cuda",
            dtype=torch.float32,
            max_batch=8,
            max_len=512,
            kv_cache="paged",
            kernels=True,
        )

    hot = SamplingParams(max_new_tokens=40, temperature=1.0, seed=5, ignore_eos=True)
    fresh, warmed = make(), make()
    try:
        done = await warmed.warm_up()
        graphs = warmed._graphed
        assert graphs is not None
        assert {b for b in PREFILL_BUCKETS if b <= 510} <= set(graphs.prefills)
        for sampled in (False, True):
            rows = {k[0] for k in graphs.greedy if k[2] == 16 and k[3] is sampled}
            assert rows == {b for b in BATCH_BUCKETS if b <= 8}
        assert done.tokens > 0 and set(warmed.stats.values()) == {0}
        greedy = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
        assert [g.output_ids for g in await warmed.generate(prompts, greedy)] == refs
        a, b = await fresh.generate(prompts, hot), await warmed.generate(prompts, hot)
        assert [g.output_ids for g in a] == [g.output_ids for g in b]
    finally:
        await fresh.close()
        await warmed.close()


async def test_programmatic_dependent_launch_changes_no_token_or_logprob() -> None:
    """The decode kernels launched under programmatic dependent launch (each waits in-kernel for
    the one before; a projection reads its first weight tile before that wait) give the tokens
    and logprobs they give launched one after another: greedy and seeded-sampled, at GEMV and
    Triton-GEMM row counts, over a paged cache with keys split across programs. The GPU's own
    ordering is what is tested: a missing wait reads a stale activation or KV entry."""
    from stacx.inference import triton_kernels

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm90+")
    model = small_qwen3()
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (70, 5, 130)]
    many = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in range(20, 260, 20)]
    runs, default = [], triton_kernels.PDL
    try:
        for on in (False, True):
            triton_kernels.PDL = on
            engine = TorchEngine(
                model,
                device="cuda",
                dtype=torch.bfloat16,
                max_batch=16,
                max_len=400,
                kv_cache="paged",
                kv_block=16,
                kernels=True,
            )
            try:
                out = []
                for batch in (prompts, many):  # 3 rows: GEMVs; 12 rows: the Triton GEMM
                    for params in (
                        SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True),
                        SamplingParams(max_new_tokens=40, temperature=1.0, seed=5, ignore_eos=True),
                    ):
                        await engine.flush_cache()
                        out += [
                            (g.output_ids, g.logprobs) for g in await engine.generate(batch, params)
                        ]
            finally:
                await engine.close()
            runs.append(out)
    finally:
        triton_kernels.PDL = default
    launched = [
        k.metadata.launch_pdl
        for k in triton_kernels._gemv_kernel.device_caches[torch.cuda.current_device()][0].values()
    ]
    assert True in launched and False in launched  # both ways were really built and launched
    assert runs[0] == runs[1]
