"""``tools/bench/gemv_configs.py``: a configuration names the launch of the kernel it sweeps
(GemvLaunch's six fields, or GemmLaunch's seven with ``--kernel gemm``), a wrong one is refused
naming the fields, and on a machine without CUDA the script still prints its one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "bench" / "gemv_configs.py"

pytest.importorskip("triton")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


def test_a_configuration_is_the_launch_of_the_kernel_swept() -> None:
    from stacx.inference.triton_kernels import GEMM_LAUNCH, GEMV_LAUNCH, GemmLaunch
    from tools.bench.gemv_configs import GEMM_GRID, GRID, parse

    assert parse(GRID[0], "gemv") == GEMV_LAUNCH  # each grid starts at the engine's default
    assert parse(GEMM_GRID[0], "gemm") == GEMM_LAUNCH
    assert parse("264/64/16/64/64/4/4", "gemm") == GemmLaunch(264, 64, 16, 64, 64, 4, 4)
    wrong = _run("--kernel", "gemm", "--configs", "4/4/1/4096/16384/8")
    assert wrong.returncode != 0
    assert "programs/wide/narrow/block_k/split_block_k/stages/warps" in wrong.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: no CUDA device")
def test_without_cuda_the_sweep_says_why_in_its_json_line() -> None:
    done = _run("--kernel", "gemm")
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (line["kernel"], line["batch"]) == ("gemm", 64)
    assert "needs a CUDA device" in line["error"]
