"""tools/bench/engine_agentic.py end to end at its smallest size: the real script on the real
default model (CPU), its JSON line, the engine reusing each episode's previous turn, the
memory-bandwidth bound of every pass and the profile of a warm one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.decode_bound import reply_kv_tokens
from tools.bench.engine_agentic import make_workload

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kv_cache", ["slots", "paged"])
def test_tiny_agentic_bench_reports_reuse_and_its_bound(kv_cache: str, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "tools/bench/engine_agentic.py"),
        "--tiny",
        "--episodes",
        "2",
        "--turns",
        "2",
        "--start",
        "32",
        "--obs",
        "32,32",
        "--reply",
        "4,8",
        "--skip-hf",
        "--kv-cache",
        kv_cache,
        "--kv-block",
        "16",
    ]
    trace = tmp_path / "trace.json"
    if kv_cache == "slots":  # the profile once: it runs the warm pass again
        cmd += ["--profile", str(trace)]
    else:  # groups of 2 through 2 rows: more samples than rows, with holds and without
        cmd += ["--group", "2", "--max-batch", "2", "--group-fifo"]
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
    # the bound: every reply's decode steps read its context (prompt + the reply so far)
    wl = make_workload(2, 2, 32, (32, 32), (4, 8), 1000, 0)
    kv = 0
    for e in range(2):
        n = 32
        for t in range(2):
            n += 32
            kv += reply_kv_tokens(n, wl.replies[e][t])
            n += wl.replies[e][t]
    assert (
        result["copy_gb_s"] > 0
        and result["weight_gib"] > 0.1
        and result["kv_kib_per_token"] == 45.0
    )
    for name in ("stacx_cold", "stacx_warm", "stacx_no_reuse"):
        r = result[name]
        assert r["decode_kv_tokens"] == kv and r["generated"] == sum(map(sum, wl.replies))
        assert 0 < r["fraction_of_bound"] == pytest.approx(r["tok_s"] / r["bound_tok_s"], rel=0.01)
        # every turn is admitted in some round; the rounds take part of the pass
        assert 0 < r["admit_rounds"] <= 4 and 0 < r["prefill_s"] < r["wall_s"]
        assert r["fraction_of_bound_outside_prefill"] > r["fraction_of_bound"]
    assert warm["ttft_ms_p50_after_first"] == warm["ttft_ms_p50_per_turn"][1]
    if kv_cache == "slots":
        prof = result["profile"]
        assert prof["decode_steps"] > 0 and prof["ms_per_step"]["gemm"] > 0
        assert set(prof["ms_per_step"]) == {"attention", "gemm", "sampling", "other", "host_gaps"}
        top = [ms for _, ms, _ in prof["top"]]  # the costliest ops: [name, ms, launches] a step
        assert 0 < len(top) <= 10 and top == sorted(top, reverse=True)
        busy = sum(v for k, v in prof["ms_per_step"].items() if k != "host_gaps")
        assert sum(top) <= busy + 0.01
        assert json.loads(trace.read_text())["traceEvents"]
    if kv_cache == "paged":
        for name in ("stacx_group", "stacx_group_fifo"):
            g = result[name]
            assert (
                g["generated"] == 2 * warm["generated"] and g["ttft_ms_p50_after_first"] is not None
            )
            assert g["fraction_of_bound"] > 0
