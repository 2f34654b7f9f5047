"""Realistic synthetic events for benchmarks and tests (a mix of kinds; 256-token turns)."""

from __future__ import annotations

import random

from stacx import events as ev


def episode_events(
    run_id: str,
    n_episodes: int,
    *,
    turns: int = 3,
    tokens: int = 256,
    seed: int = 0,
    group_size: int = 4,
) -> list[ev.Event]:
    rng = random.Random(seed)
    out: list[ev.Event] = []
    for i in range(n_episodes):
        ep = f"ep{seed}-{i}"
        group = f"g{seed}-{i // group_size}"
        out.append(
            ev.EpisodeStarted(
                run_id=run_id,
                event_id=ev.derive_id(run_id, ep, "start"),
                episode_id=ep,
                task_id=f"task{i // group_size}",
                group_id=group,
                sample_index=i % group_size,
            )
        )
        prompt = [rng.randrange(49152) for _ in range(tokens)]
        for t in range(turns):
            out_ids = [rng.randrange(49152) for _ in range(tokens)]
            out.append(
                ev.TurnGenerated(
                    run_id=run_id,
                    event_id=ev.derive_id(run_id, ep, "turn", t),
                    episode_id=ep,
                    turn=t,
                    prompt_ids=prompt,
                    output_ids=out_ids,
                    logprobs=[-rng.random() for _ in out_ids],
                    weight_version=t // 2,
                    finish_reason="stop",
                    gen_ms=12.5,
                )
            )
            call = f"{ep}-c{t}"
            out.append(
                ev.ToolCalled(
                    run_id=run_id,
                    event_id=ev.derive_id(run_id, call, "call"),
                    episode_id=ep,
                    turn=t,
                    call_id=call,
                    tool="bash",
                    arguments_json='{"cmd": "ls -la /app"}',
                )
            )
            out.append(
                ev.ToolReturned(
                    run_id=run_id,
                    event_id=ev.derive_id(run_id, call, "ret"),
                    episode_id=ep,
                    turn=t,
                    call_id=call,
                    tool="bash",
                    output="total 8\ndrwxr-xr-x 2 root root 4096 .\n",
                    exit_code=0,
                )
            )
            prompt = prompt + out_ids + [rng.randrange(49152) for _ in range(16)]
        out.append(
            ev.EpisodeFinished(
                run_id=run_id,
                event_id=ev.derive_id(run_id, ep, "fin"),
                episode_id=ep,
                stop_reason=ev.StopReason.SUBMITTED,
                n_turns=turns,
            )
        )
        out.append(
            ev.RewardAssigned(
                run_id=run_id,
                event_id=ev.derive_id(run_id, ep, "rew"),
                episode_id=ep,
                reward=float(rng.random() < 0.5),
            )
        )
    return out
