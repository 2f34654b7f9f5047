"""tools/bench/decode_bound.py: the bytes a decode must read, counted against brute force and
against the model's real parameters, and the kernel kinds of its profile."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from tools.bench.decode_bound import (
    Bound,
    copy_bandwidth,
    kind_of,
    kv_token_bytes,
    reply_kv_tokens,
    weight_bytes,
)

SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    vocab_size=300,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def test_reply_kv_tokens_counts_the_keys_each_decode_step_reads() -> None:
    for prompt, reply in [(1, 1), (5, 2), (100, 17), (7, 0)]:
        # token 1 comes from the prefill; token j > 1 from a step fed token j-1 at position
        # prompt + j - 2, attending to positions [0, prompt + j - 1)
        brute = sum(prompt + j - 1 for j in range(2, reply + 1))
        assert reply_kv_tokens(prompt, reply) == brute


def test_weight_bytes_reads_a_tied_head_once_and_skips_an_untied_embedding() -> None:
    for tied in (True, False):
        torch.manual_seed(0)
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(**SMALL, tie_word_embeddings=tied)
        )
        every = {p.data_ptr(): p.numel() * 4 for p in model.parameters()}
        embed = model.get_input_embeddings().weight
        expected = sum(every.values()) - (0 if tied else embed.numel() * 4)
        assert weight_bytes(model) == expected
    # keys and values, 2 layers x 2 kv heads x 16 dims, bf16
    assert kv_token_bytes(model, torch.bfloat16) == 2 * 2 * 2 * 16 * 2


def test_the_bound_is_bytes_over_the_measured_bandwidth() -> None:
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL))
    bound = Bound(model, torch.float32, torch.device("cpu"))
    assert bound.copy_bytes_per_s > 1e8  # any machine copies faster than 100 MB/s
    of = bound.of(generated=100, tok_s=50.0, steps=10, kv_tokens=1000)
    read = 10 * bound.weight_bytes + 1000 * bound.kv_token_bytes
    assert of["bound_tok_s"] == round(100 * bound.copy_bytes_per_s / read, 1)
    assert of["fraction_of_bound"] == round(50.0 / (100 * bound.copy_bytes_per_s / read), 4)
    assert copy_bandwidth(torch.device("cpu"), mib=8, reps=2) > 1e8


def test_kernel_kinds_of_the_triton_step_cublas_and_cpu_ops() -> None:
    names = {
        "_decode_attn_kernel": "attention",
        "_combine_kernel": "attention",
        "_pick_partial_kernel": "sampling",
        "_pick_combine_kernel": "sampling",
        "_gemm_kernel": "gemm",
        "_gemv_kernel": "gemm",
        "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTT": "gemm",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64": "gemm",
        "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>": "attention",
        "_add_rmsnorm_kernel": "other",
        "_rope_cache_kernel": "other",
        "aten::addmm": "gemm",
        "aten::mm": "gemm",
        "aten::bmm": "attention",
        "aten::_softmax": "attention",
        "aten::_log_softmax": "sampling",
        "aten::argmax": "sampling",
        "aten::mul": "other",
    }
    assert {n: kind_of(n) for n in names} == names


@pytest.mark.skipif(
    not torch.cuda.is_available() and importlib.util.find_spec("triton") is None, reason="no triton"
)
def test_decode_attention_bench_checks_every_split_against_a_reference() -> None:
    """tools/bench/decode_attention.py --tiny (Triton's interpreter without a GPU): the engine's
    split rule, a forced split and another launch configuration (16 keys per tile, 64 target
    programs), over slots and over shuffled paged blocks, each checked against float32 attention
    (the script raises past its tolerance)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    cmd = [
        sys.executable,
        str(root / "tools/bench/decode_attention.py"),
        "--tiny",
        "--splits",
        "auto,3",
        "--configs",
        "16x4x2x64",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["auto_splits"] > 1  # 3 rows: the keys are split across programs
    for name in ("slots_auto", "slots_3", "paged_auto", "paged_3", "paged_16x4x2x64"):
        assert result[name]["rel_err"] < 1e-4
