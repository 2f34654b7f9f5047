"""The torch engine serves base + a LoRA adapter by merging it at load (stacx.inference.adapters):
its logprobs equal the peft model's, each adapter merges against the base (never on top of the
previous merge), and a bad adapter changes nothing. The SGLang client's LoRA requests are
answered by `stacx serve`'s SGLang-shaped routes, which serve them through the same merge."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import torch
from aiohttp import web
from torch import nn

from stacx.errors import EngineError
from stacx.inference.server import Server
from stacx.inference.sglang_client import SGLangEngine
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams
from stacx.train import lora
from stacx.train.config import LoraConfig, TrainerConfig
from stacx.train.model import load_model

PROMPT, OUTPUT = [1, 504, 3458, 314, 260], [1345, 28, 253, 4125, 30, 2]


def peft_pair(base: nn.Module, seed: int, rank: int = 4) -> nn.Module:
    """A deep copy of ``base`` wrapped by the trainer's peft LoRA, with random nonzero B (a
    fresh adapter's B is zero: it would not change the model)."""
    cfg = TrainerConfig(lora=LoraConfig(rank=rank, alpha=2.0 * rank))
    model = lora.wrap(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def save_adapter(model: nn.Module, directory: Path) -> Path:
    directory.mkdir(parents=True)
    lora.write(
        directory, lora.adapter_state(dict(model.named_parameters())), lora.peft_config_of(model)
    )
    return directory


def logprobs_of(model: nn.Module) -> torch.Tensor:
    ids = torch.tensor([PROMPT + OUTPUT])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    lp = torch.log_softmax(logits[0, len(PROMPT) - 1 : -1], dim=-1)
    return lp.gather(-1, torch.tensor(OUTPUT)[:, None])[:, 0]


def engine_logprobs(engine: TorchEngine) -> torch.Tensor:
    return torch.tensor(asyncio.run(engine.score(PROMPT, OUTPUT)))


@pytest.fixture(scope="module")
def base() -> nn.Module:
    return load_model("default", torch.device("cpu"), torch.float32).eval()


def test_merged_engine_logprobs_equal_the_peft_model(base: nn.Module, tmp_path: Path) -> None:
    adapted = peft_pair(base, seed=1)
    engine = TorchEngine(copy.deepcopy(base), device="cpu", max_len=64, threads=1)
    try:
        before = engine_logprobs(engine)
        asyncio.run(engine.load_adapter(str(save_adapter(adapted, tmp_path / "a")), 1))
        after = engine_logprobs(engine)
    finally:
        asyncio.run(engine.close())
    assert engine.weight_version == 1
    want = logprobs_of(adapted)
    assert (after - before).abs().max() > 1e-2  # the adapter matters ...
    torch.testing.assert_close(after, want, atol=2e-4, rtol=0)  # ... exactly as peft applies it


def test_each_adapter_merges_against_the_base(base: nn.Module, tmp_path: Path) -> None:
    first, second = peft_pair(base, seed=1), peft_pair(base, seed=2)
    engine = TorchEngine(copy.deepcopy(base), device="cpu", max_len=64, threads=1)
    try:
        asyncio.run(engine.load_adapter(str(save_adapter(first, tmp_path / "a")), 1))
        # the second version as in-memory tensors (the trainer's handoff), not the file
        state = lora.adapter_state(dict(second.named_parameters()))
        d = save_adapter(second, tmp_path / "b")
        asyncio.run(engine.load_adapter(str(d), 2, state))
        got = engine_logprobs(engine)
        weights = dict(engine.model.named_parameters())
        base_q = dict(base.named_parameters())["model.layers.0.self_attn.q_proj.weight"]
    finally:
        asyncio.run(engine.close())
    torch.testing.assert_close(got, logprobs_of(second), atol=2e-4, rtol=0)
    a = state["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = state["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    torch.testing.assert_close(
        weights["model.layers.0.self_attn.q_proj.weight"], base_q + 2.0 * b @ a, atol=1e-6, rtol=0
    )


def test_a_bad_adapter_changes_nothing(base: nn.Module, tmp_path: Path) -> None:
    good = peft_pair(base, seed=3)
    engine = TorchEngine(copy.deepcopy(base), device="cpu", max_len=64, threads=1)
    try:
        asyncio.run(engine.load_adapter(str(save_adapter(good, tmp_path / "a")), 1))
        served = engine_logprobs(engine)
        state = lora.adapter_state(dict(good.named_parameters()))
        key = "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight"
        state[key] = torch.zeros(7, 4)  # not the down_proj's shape
        with pytest.raises(EngineError, match="down_proj"):
            asyncio.run(engine.load_adapter(str(tmp_path / "a"), 2, state))
        assert engine.weight_version == 1
        torch.testing.assert_close(engine_logprobs(engine), served, atol=0, rtol=0)
    finally:
        asyncio.run(engine.close())


def test_sglang_lora_endpoints_against_stacx_serve(base: nn.Module, tmp_path: Path) -> None:
    """SGLangEngine's LoRA requests (/load_lora_adapter, lora_path in /generate,
    /unload_lora_adapter of the previous version) served by `stacx serve`'s SGLang routes."""
    first, second = peft_pair(base, seed=1), peft_pair(base, seed=2)
    dirs = [save_adapter(first, tmp_path / "a"), save_adapter(second, tmp_path / "b")]
    engine = TorchEngine(copy.deepcopy(base), device="cpu", max_len=64, threads=1)
    server = Server(engine)

    async def scenario() -> tuple[list[list[float]], int, dict[str, str]]:
        runner = web.AppRunner(server.app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        client = SGLangEngine(f"http://127.0.0.1:{port}")
        try:
            scores = []
            for version, d in enumerate(dirs, start=1):
                await client.load_adapter(str(d), version)
                scores.append(await client.score(PROMPT, OUTPUT))
            (gen,) = await client.generate([PROMPT], SamplingParams(max_new_tokens=2))
            return scores, gen.weight_version, dict(server.loras)
        finally:
            await client.close()
            await runner.cleanup()
            await engine.close()

    scores, version, loaded = asyncio.run(scenario())
    torch.testing.assert_close(torch.tensor(scores[0]), logprobs_of(first), atol=2e-4, rtol=0)
    torch.testing.assert_close(torch.tensor(scores[1]), logprobs_of(second), atol=2e-4, rtol=0)
    assert version == 2
    assert loaded == {"stacx-v2": str(dirs[1])}  # v1 was unloaded once v2 served
