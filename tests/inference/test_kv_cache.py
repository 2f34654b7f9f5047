"""The paged KV cache and prefix sharing (kv_cache.py, kv_plan.py) on CPU: the paged
forward pass reads exactly the keys the slot cache holds, a paged engine equals the slot
engine and HF ``generate`` even when its pool is too small for its requests (admission control
and preemption), a GRPO group computes its prompt once, a weight load drops keys only when
it changes them, and the slot cache keeps the prefixes that waiting prompts extend."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from stacx.errors import EngineError
from stacx.inference.decoder import Decoder
from stacx.inference.kv_cache import KVCache
from stacx.inference.kv_plan import KEEP_CACHED_ROWS, SlotKV, common_prefix
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams

MODES = [{"kv_cache": "slots"}, {"kv_cache": "paged", "kv_block": 4}]


def small() -> torch.nn.Module:
    shape = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=300,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).float().eval()


def prompts(*lengths: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,  # type: ignore[operator]
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def engine(model: torch.nn.Module, **kw: object) -> TorchEngine:
    return TorchEngine(model, device="cpu", max_len=200, threads=1, **kw)  # type: ignore[arg-type]


GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)


def test_paged_forward_reads_exactly_the_slot_cache_keys() -> None:
    """Prefill (in two parts: the second reuses the first's keys) and decode steps over
    scattered, out-of-order blocks of 4 give bit-for-bit the slot cache's logits, with a
    padded row at the scratch position."""
    dec = Decoder(small(), 128)
    rows = prompts(5, 13, 9)
    slots = dec.new_cache()
    slots.grow(3, 129)
    paged = dec.new_paged_cache(rows=3, blocks=40, block=4)
    for r, blocks in enumerate(
        [[7, 3, 30, 1, 12, 8], [2, 39, 5, 6, 20, 21, 22], [38, 37, 4, 11, 9]]
    ):
        paged.set_row(r, blocks)
    split = [3, 8, 6]
    got = []
    for cache in (slots, paged):
        first = dec.prefill(
            cache, [0, 1, 2], [0] * 3, [p[:s] for p, s in zip(rows, split, strict=True)], [0] * 3
        )
        rest = dec.prefill(
            cache, [0, 1, 2], split, [p[s:] for p, s in zip(rows, split, strict=True)], [0] * 3
        )
        steps = []
        pos = torch.tensor([len(p) for p in rows])
        ids = torch.tensor([p[-1] for p in rows])
        for _ in range(3):
            pos_in = pos.clone()
            pos_in[1] = cache.capacity - 1  # row 1 is padding this step
            steps.append(dec.decode(cache, ids, pos_in, int(pos.max()) + 1))
            ids, pos = steps[-1].argmax(-1), pos + 1
        got.append((torch.cat(first + rest), [s[[0, 2]] for s in steps]))
    assert torch.equal(got[0][0], got[1][0])
    for a, b in zip(got[0][1], got[1][1], strict=True):
        assert torch.equal(a, b)


async def test_paged_engine_equals_hf_and_slots_when_its_pool_is_too_small() -> None:
    """A pool of 96 positions for four requests that need ~190: requests wait for room
    (admission control), running ones are preempted and recomputed, and every greedy output
    is still HF's; the pool's peak use stays within it."""
    model = small()
    batch = prompts(5, 40, 21, 33)
    refs = [hf_greedy(model, p, GREEDY.max_new_tokens) for p in batch]
    outs, stats = [], []
    for kw in ({"kv_cache": "slots"}, {"kv_cache": "paged", "kv_block": 4, "kv_tokens": 96}):
        e = engine(model, **kw)
        try:
            outs.append([g.output_ids for g in await e.generate(batch, GREEDY)])
            stats.append((dict(e.stats), e.kv_usage()))
        finally:
            await e.close()
    assert outs[0] == outs[1] == refs
    (paged, usage) = stats[1]
    assert paged["preempted"] > 0
    assert usage["peak_tokens"] <= usage["pool_tokens"] == 96


async def test_a_prompt_that_can_never_fit_the_pool_is_an_error() -> None:
    e = engine(small(), kv_cache="paged", kv_block=4, kv_tokens=32)
    try:
        with pytest.raises(EngineError, match="raise kv_tokens"):
            await e.generate(prompts(40), GREEDY)
    finally:
        await e.close()


@pytest.mark.parametrize("mode", MODES, ids=["slots", "paged"])
async def test_a_group_computes_its_prompt_once(mode: dict[str, object]) -> None:
    """n samples of one prompt in one call: the prompt is prefilled once, each sibling
    computes only its last token; the samples are those each seed gives alone."""
    model = small()
    (prompt,) = prompts(41, seed=5)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11, ignore_eos=True)
    e = engine(model, **mode)
    try:
        group = await e.generate([prompt] * 4, params)
        assert e.stats["prefill_tokens"] == len(prompt) + 3
        assert e.stats["reused_tokens"] == 3 * (len(prompt) - 1)
    finally:
        await e.close()
    for i, g in enumerate(group):
        alone = engine(model)
        try:
            one = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11 + i, ignore_eos=True)
            (ref,) = await alone.generate([prompt], one)
        finally:
            await alone.close()
        assert g.output_ids == ref.output_ids
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
    assert len({tuple(g.output_ids) for g in group}) > 1


@pytest.mark.parametrize("mode", MODES, ids=["slots", "paged"])
async def test_a_weight_load_drops_cached_keys_only_when_it_changes_them(
    mode: dict[str, object],
) -> None:
    """The final norm acts after every key: a load of it keeps the prompt's cached keys (and
    the output follows the new weights); a load into a layer drops them."""
    model = small()
    (prompt,) = prompts(30, seed=7)
    e = engine(model, **mode)
    try:
        await e.generate([prompt], GREEDY)
        state = model.state_dict()
        for name, reused in (
            ("model.norm.weight", len(prompt) - 1),
            ("model.layers.0.mlp.down_proj.weight", 0),
        ):
            await e.load_state({name: state[name] * 0.5}, e.weight_version + 1)
            before = e.stats["reused_tokens"]
            (g,) = await e.generate([prompt], GREEDY)
            assert e.stats["reused_tokens"] - before == reused, name
            assert g.output_ids == hf_greedy(model, prompt, GREEDY.max_new_tokens), name
    finally:
        await e.close()


@pytest.mark.parametrize("mode", MODES, ids=["slots", "paged"])
async def test_episodes_beyond_max_batch_keep_their_previous_turns(mode: dict[str, object]) -> None:
    """Three episodes through two rows, turn after turn. Paged: every later turn reuses its
    whole previous turn (cached prefixes live in the pool, not in rows). Slots: two rows hold
    two prefixes, and the two episodes that extend them are admitted first, so two of three
    reuse theirs (before: the first request in line could take a row another one extends)."""
    model = small()
    e = engine(model, max_batch=2, **mode)
    ctx = prompts(20, 24, 28, seed=9)
    last: list[int] = []
    try:
        for turn in range(3):
            before = e.stats["reused_tokens"]
            # one request of three prompts: all three wait together whatever the machine's load
            # (separate requests may reach the engine one by one, and the slot choice is about
            # the prompts that wait)
            gens = [[g] for g in await e.generate(ctx, GREEDY)]
            reusable = [len(c) + len(g.output_ids) - 1 for c, (g,) in zip(ctx, gens, strict=True)]
            reused = e.stats["reused_tokens"] - before
            if turn:
                if mode["kv_cache"] == "paged":
                    assert reused == sum(last)
                else:  # exactly two episodes reuse their whole previous turn
                    assert reused in {sum(last) - x for x in last}, (reused, last)
            last = reusable
            ctx = [
                c + g.output_ids + prompts(6, seed=turn)[0]
                for c, (g,) in zip(ctx, gens, strict=True)
            ]
    finally:
        await e.close()


def test_slot_choice_spares_the_prefixes_waiting_prompts_extend() -> None:
    """The slot bookkeeping alone: a request that reuses nothing takes an empty row, else the
    least recently used cached prefix that no waiting prompt extends."""
    cache = KVCache(1, 1, 4, torch.float32, torch.device("cpu"))
    plan = SlotKV(cache, max_rows=2)
    a, b, c = list(range(100, 130)), list(range(200, 230)), list(range(300, 330))
    pa, pb = plan.place(a, len(a), []), plan.place(b, len(b), [])
    assert pa is not None and pb is not None and (pa.row, pb.row) == (0, 1)
    plan.release(pa.row, keep=True)
    plan.release(pb.row, keep=True)  # row 0 is now the least recently used
    pc = plan.place(c, len(c), upcoming=[[*a, 1, 2, 3]])
    assert pc is not None and pc.row == 1 and pc.reuse == 0  # row 0 is wanted: row 1 goes
    pa2 = plan.place([*a, 1, 2, 3], len(a) + 3, [])
    assert pa2 is not None and (pa2.row, pa2.reuse) == (0, len(a))


def test_an_unrelated_request_takes_a_new_row_not_a_cached_prefix() -> None:
    """While the table may grow, a request that reuses nothing gets a new row: the agent's
    cached turn survives a condenser's (or a judge's) call between two of its turns. With
    KEEP_CACHED_ROWS free cached rows on a cache that would grow, the least recently used goes."""
    cache = KVCache(1, 1, 4, torch.float32, torch.device("cpu"))
    plan = SlotKV(cache, max_rows=8)
    agent = list(range(100, 140))
    pa = plan.place(agent, len(agent), [])
    assert pa is not None
    plan.release(pa.row, keep=True)
    other = plan.place(list(range(500, 540)), 40, [])  # nothing waits that extends the agent's
    assert other is not None and other.row != pa.row
    plan.release(other.row, keep=True)
    nxt = plan.place([*agent, 1, 2, 3], len(agent) + 3, [])
    assert nxt is not None and (nxt.row, nxt.reuse) == (pa.row, len(agent))
    plan.release(nxt.row, keep=True)
    k = 2
    while len(plan.live) < KEEP_CACHED_ROWS:  # a new row for each prefix, all kept
        p = plan.place(list(range(1000 * k, 1000 * k + 40)), 40, [])
        assert p is not None and p.row == len(plan.live) - 1
        plan.release(p.row, keep=True)
        k += 1
    last = plan.place(list(range(9000, 9040)), 40, [])  # KEEP_CACHED_ROWS free rows: one goes
    assert last is not None and last.row == other.row  # the least recently used
    assert len(plan.live) == KEEP_CACHED_ROWS


def test_a_cache_allocated_up_front_keeps_every_prefix_its_rows_hold() -> None:
    """A cache already holding its rows (CUDA allocates them all up front) drops no cached
    prefix while one of its rows is unused, KEEP_CACHED_ROWS or not."""
    cache = KVCache(1, 1, 4, torch.float32, torch.device("cpu"))
    cache.grow(KEEP_CACHED_ROWS + 3, 64)
    plan = SlotKV(cache, max_rows=KEEP_CACHED_ROWS + 3)
    for k in range(KEEP_CACHED_ROWS + 3):
        p = plan.place(list(range(1000 * k, 1000 * k + 40)), 40, [])
        assert p is not None and (p.row, p.reuse) == (k, 0)
        plan.release(p.row, keep=True)
    again = plan.place([*range(40), 7], 41, [])  # the first prefix is still there
    assert again is not None and (again.row, again.reuse) == (0, 40)


def test_common_prefix_equals_a_token_by_token_scan() -> None:
    """The sliced comparison (chunks that grow, then a bisection inside the first differing
    one) against the plain scan, over random lists sharing prefixes across chunk edges."""
    rng = random.Random(0)
    for _ in range(3000):
        a = [rng.randint(0, 2) for _ in range(rng.randint(0, 400))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 2) for _ in range(rng.randint(0, 300))]
        limit = rng.randint(0, 500)
        n = 0
        while n < min(len(a), len(b), limit) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b, limit) == n


@pytest.mark.model
async def test_paged_engine_on_the_default_model_equals_hf_and_reuses_the_last_turn(
    model_dir: str,
) -> None:
    """The real SmolLM2 through the paged cache (blocks of 16): greedy equals HF generate in a
    shared batch, and a next turn reuses all of the previous one."""
    e = TorchEngine(model_dir, device="cpu", max_len=2048, threads=1, kv_cache="paged", kv_block=16)
    tok = e.tokenizer
    try:
        chats = [
            tok.encode(
                tok.apply_chat_template(
                    [{"role": "user", "content": q}],
                    tokenize=False,  # type: ignore[attr-defined]
                    add_generation_prompt=True,
                ),
                add_special_tokens=False,
            )
            for q in ("What is 2+2?", "Name three animals.")
        ]
        gens = await e.generate(chats, SamplingParams(max_new_tokens=12, temperature=0.0))
        for p, g in zip(chats, gens, strict=True):
            assert g.output_ids == hf_greedy(e.model, p, 12)[: len(g.output_ids)]
        second = chats[1] + gens[1].output_ids + chats[0][1:]
        before = e.stats["reused_tokens"]
        (g2,) = await e.generate([second], SamplingParams(max_new_tokens=12, temperature=0.0))
        assert e.stats["reused_tokens"] - before == len(chats[1]) + len(gens[1].output_ids) - 1
        assert g2.output_ids == hf_greedy(e.model, second, 12)[: len(g2.output_ids)]
    finally:
        await e.close()
