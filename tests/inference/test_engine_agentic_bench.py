"""tools/bench/engine_agentic.py end to end at its smallest size: the real script on the real
default model (CPU), its JSON line, and the engine reusing each episode's previous turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kv_cache", ["slots", "paged"])
def test_tiny_agentic_bench_reports_reuse(kv_cache: str) -> None:
    cmd = [sys.executable, str(ROOT / "tools/bench/engine_agentic.py"), "--tiny", "--episodes", "2",
           "--turns", "2", "--start", "32", "--obs", "32,32", "--reply", "4,8", "--skip-hf",
           "--kv-cache", kv_cache, "--kv-block", "16"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    warm, off = result["stacx_warm"], result["stacx_no_reuse"]
    assert result["stacx_cold"]["generated"] == warm["generated"] == off["generated"] > 0
    # turn 2 extends turn 1's prompt + reply: everything but the reply's last id is reused
    assert warm["reuse_rate_after_first"] == warm["reuse_ideal_after_first"] > 0.5
    assert warm["prefill_tokens"] + warm["reused_tokens"] == warm["submitted_prompt_tokens"]
    assert off["reused_tokens"] == 0 and off["prefill_tokens"] == off["submitted_prompt_tokens"]
    assert len(warm["ttft_ms_p50_per_turn"]) == 2 and warm["ttft_ms_p99"] is not None
    assert result["kv_cache"] == kv_cache and warm["preempted"] == 0
    # slots hold whole rows (grown on demand on CPU); paged, the blocks the episodes' tokens need
    assert warm["kv_peak_tokens"] > 0
    if kv_cache == "paged":
        assert warm["kv_peak_tokens"] <= 2 * -(-result["max_context"] // 16) * 16
