"""Every Triton kernel of the Triton step builds for an H100 (sm_90) here, with no GPU: the CPU
interpreter (test_triton_kernels.py) checks what the kernels compute, not that Triton's compiler
accepts them (a dot's shape, a loop bound, a layout) nor that they fit an H100's shared memory.
sm90_build.py runs the engine's prefill and decode steps behind a driver that only builds, and
reads each build's registers and spills with cuobjdump."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

BUILD = Path(__file__).with_name("sm90_build.py")
STEP_KERNELS = {
    "_add_rmsnorm_kernel",
    "_rope_cache_kernel",
    "_gemv_kernel",
    "_gemm_kernel",
    "_silu_mul_kernel",
    "_decode_attn_kernel",
    "_combine_kernel",
    "_prefill_attn_kernel",
    "_pick_partial_kernel",
    "_pick_combine_kernel",
}


def _build(arg: str) -> dict:
    """`sm90_build.py ARG` in a subprocess without TRITON_INTERPRET: its JSON line."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(BUILD.parents[2]), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(BUILD), arg], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_every_step_kernel_builds_for_sm90(family: str) -> None:
    result = _build(family)
    # the kernels launch under programmatic dependent launch on an sm90 with a CUDA 12.3+
    # driver, not with an older one (its graph capture drops programmatic edges)
    assert (result["pdl"], result["pdl_on_12_2"]) == (True, False)
    built = result["built"]
    assert {k["kernel"] for k in built} == STEP_KERNELS
    # no kernel spills registers to local memory (a spill costs bandwidth on every step)
    assert [k for k in built if k["local"]] == []


def test_decode_steps_build_per_kernel_shape_not_per_batch_and_key_length() -> None:
    """The 90 (batch bucket, key-length bucket) decode steps a cold engine meets up to 6,144
    keys, and the token pick after prefills of 1 to 64 rows: the attention's split count and key range, the combine's split count and a GEMM's row
    count are runtime arguments, so the attention and the combine build once and each Triton GEMM
    once per row tile (16/32/64) and projection (as specialized arguments: 31 attention and 20
    GEMM builds; the combine built once per power of two of its split count, 7 here)."""
    grid = _build("--decode-grid")
    assert grid["shapes"] == 90
    builds = grid["builds"]
    assert builds["_decode_attn_kernel"] == 1, builds
    assert builds["_gemm_kernel"] == 3 * 4, builds  # row tiles x (qkv, o, gate_up, down)
    assert builds["_combine_kernel"] == 1, builds  # its split count too (was one per power of 2)
    # the pick's vocabulary split is a power of two: 1 to 64 rows, one count (was seven)
    assert builds["_pick_partial_kernel"] == builds["_pick_combine_kernel"] == 1, builds
    assert sum(builds.values()) <= 31, builds
