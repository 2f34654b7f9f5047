"""Gateway benchmark: a chat call through the model gateway vs the same call straight to the engine.

In one process, with one engine (the bundled SmolLM2-135M on CPU by default) and one prompt:
  1. baseline: ``engine.generate`` on the chat template's ids of the request (what the gateway
     sends the engine), greedy, ``--new-tokens`` tokens;
  2. STACX: ``POST /v1/chat/completions`` with the same messages over HTTP (the official
     ``openai`` client on loopback TCP) with an episode credential, so each call is templated,
     parsed, recorded as a TurnGenerated (into memory here: the NATS publish of a real run is
     not in this figure) and answered.
Per-call latency (p50, p99) of each, sequential; overhead = gateway p50 - direct p50. Then calls/s
with ``--clients`` concurrent callers on each side. Each side gets untimed warm-up calls first.
Streaming: ``--stream-calls`` interleaved pairs of a ``--stream-tokens`` reply, non-streamed (the
baseline: its first text arrives with the whole reply) and ``stream=True`` (time to the first
content chunk, and to the last); ttft_ratio = streamed first chunk p50 / non-streamed p50.

Prints the machine and versions, then ONE JSON line last:
{direct_p50_ms, direct_p99_ms, gateway_p50_ms, gateway_p99_ms, overhead_p50_ms, direct_calls_s,
 gateway_calls_s, ratio_calls_s, unstreamed_p50_ms, stream_first_p50_ms, stream_last_p50_ms,
 ttft_ratio, ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MESSAGES = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Hi!"}]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def timed(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def throughput(call: Callable[[], Awaitable[object]], clients: int, per_client: int) -> float:
    async def worker() -> None:
        for _ in range(per_client):
            await call()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return clients * per_client / (time.perf_counter() - t0)


async def main(args: argparse.Namespace) -> dict[str, object]:
    import openai
    import torch
    import transformers

    from stacx.inference.gateway import Gateway, serve_tcp
    from stacx.inference.torch_engine import TorchEngine
    from stacx.ports import SamplingParams

    engine = await asyncio.to_thread(
        TorchEngine, args.model, device=args.device, max_len=2048, threads=args.threads
    )
    tok = engine.tokenizer
    assert tok is not None
    gateway = Gateway(engine, tok, model_name="student", max_len=2048)  # type: ignore[arg-type]
    prompt = list(
        tok.encode(
            tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
    )
    # ignore_eos: both sides generate exactly --new-tokens tokens
    params = SamplingParams(
        max_new_tokens=args.new_tokens,
        temperature=0.0,
        stop_token_ids=gateway.stop_ids,
        ignore_eos=True,
    )
    recorded: list[object] = []

    async def emit(event: object) -> None:
        recorded.append(event)

    async def direct() -> object:
        return await engine.generate([prompt], params)

    out: dict[str, object] = {}
    async with (
        serve_tcp(gateway) as url,
        gateway.episode(
            run_id="bench",
            episode_id="bench",
            emit=emit,  # type: ignore[arg-type]
        ) as ep,
    ):
        client = openai.AsyncOpenAI(base_url=url, api_key=ep.credential, max_retries=0)

        async def through() -> object:
            return await client.chat.completions.create(
                model="student",
                messages=MESSAGES,
                temperature=0,  # type: ignore[arg-type]
                max_tokens=args.new_tokens,
                extra_body={"ignore_eos": True},
            )

        for fn in (direct, through):
            await timed(fn, args.warmup)
        # interleave the sides, so load drift on a shared machine hits both alike
        d_ms, g_ms = [], []
        for _ in range(args.calls):
            d_ms += await timed(direct, 1)
            g_ms += await timed(through, 1)
        d_cps = await throughput(direct, args.clients, args.per_client)
        g_cps = await throughput(through, args.clients, args.per_client)
        long = {
            "model": "student",
            "messages": MESSAGES,
            "temperature": 0,
            "max_tokens": args.stream_tokens,
            "extra_body": {"ignore_eos": True},
        }
        whole_ms, first_ms, last_ms = [], [], []
        for _ in range(args.stream_calls):
            t0 = time.perf_counter()
            await client.chat.completions.create(**long)  # type: ignore[call-overload]
            whole_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            first = None
            async for chunk in await client.chat.completions.create(**long, stream=True):  # type: ignore[call-overload]
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = (time.perf_counter() - t0) * 1000
            last_ms.append((time.perf_counter() - t0) * 1000)
            assert first is not None, "the stream sent no content"
            first_ms.append(first)
        await client.close()
    await engine.close()
    assert len(recorded) >= args.calls, "the gateway recorded fewer turns than calls"
    out.update(
        direct_p50_ms=round(statistics.median(d_ms), 2),
        direct_p99_ms=round(pct(d_ms, 0.99), 2),
        gateway_p50_ms=round(statistics.median(g_ms), 2),
        gateway_p99_ms=round(pct(g_ms, 0.99), 2),
        overhead_p50_ms=round(statistics.median(g_ms) - statistics.median(d_ms), 2),
        overhead_p50_paired_ms=round(
            statistics.median([g - d for g, d in zip(g_ms, d_ms, strict=True)]), 2
        ),
        direct_calls_s=round(d_cps, 2),
        gateway_calls_s=round(g_cps, 2),
        ratio_calls_s=round(g_cps / d_cps, 3),
        unstreamed_p50_ms=round(statistics.median(whole_ms), 2),
        stream_first_p50_ms=round(statistics.median(first_ms), 2),
        stream_last_p50_ms=round(statistics.median(last_ms), 2),
        ttft_ratio=round(statistics.median(first_ms) / statistics.median(whole_ms), 4),
        stream_tokens=args.stream_tokens,
        calls=args.calls,
        clients=args.clients,
        new_tokens=args.new_tokens,
        prompt_tokens=len(prompt),
        model=args.model,
        device=args.device,
        torch=torch.__version__,
        transformers=transformers.__version__,
        openai=openai.__version__,
    )
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--per-client", type=int, default=8)
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--stream-calls", type=int, default=5)
    args = p.parse_args()
    print(
        f"machine: {platform.node()} {platform.machine()} cpus={os.cpu_count()} "
        f"load={os.getloadavg()[0]:.2f} python {platform.python_version()}"
    )
    result = asyncio.run(main(args))
    print(json.dumps(result))
