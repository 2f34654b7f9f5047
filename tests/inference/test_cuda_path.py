"""The CUDA path (static cache + CUDA-graph decode) on a small random Qwen3 (q/k norms, GQA):
greedy tokens equal transformers' greedy `generate`. Skipped where there is no GPU (CI)."""

from __future__ import annotations

import pytest
import torch

from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def small_qwen3() -> torch.nn.Module:
    import transformers

    cfg = transformers.Qwen3Config(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        head_dim=32, intermediate_size=512, vocab_size=1000, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).float().cuda().eval()


@pytest.mark.parametrize("graphs", [True, False])
async def test_cuda_greedy_equals_hf_generate(graphs: bool) -> None:
    model = small_qwen3()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (5, 17, 40)]
    refs = []
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            min_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        refs.append(out[0, len(p) :].tolist())
    engine = TorchEngine(model, device="cuda", dtype=torch.float32, max_batch=8, max_len=128,
                         cuda_graphs=graphs)  # fmt: skip
    try:
        gens = await engine.generate(
            prompts, SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
        )
    finally:
        await engine.close()
    assert [g.output_ids for g in gens] == refs
