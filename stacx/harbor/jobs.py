"""Harbor job directories, written: a STACX run as Harbor's job layout (reading them back:
`stacx.harbor.job_import`).

Export (`export_job`) writes::

    JOBDIR/config.json               the job's config (agent, model, dataset, n_attempts)
    JOBDIR/result.json               n_trials, n_errors, mean reward, pass@k, reward stats,
                                     exception stats (one `evals` entry: agent__model__dataset)
    JOBDIR/<task>__<id>/result.json  per trial: verifier_result.rewards, timing per phase
                                     (environment_setup, agent_execution, verifier),
                                     exception_info for an infrastructure failure
    JOBDIR/<task>__<id>/agent/trajectory.json   ATIF v1.7: one agent step per model turn, with
                                     prompt_token_ids, completion_token_ids and logprobs,
                                     llm_call_count 1 on a model's turn (none on a scripted
                                     one: an oracle's text is not an LLM call), each tool
                                     result's exit code, timeout, truncation, error and time
                                     in its `extra.stacx`
    JOBDIR/<task>__<id>/verifier/    reward.json and test-stdout.txt (the verifier's output)

pass@k counts a trial as passed when its reward is >= 1 and uses the unbiased estimator
1 - C(n-c, k) / C(n, k) per task, averaged over tasks, for k = 1, 2, 4, ... <= the fewest
scored trials of a task. A trial that failed for infrastructure is an error, not a 0.

Import: `stacx.harbor.job_import`.

Limits: Harbor's trial config (agent kwargs, environment settings) is not reproduced; ATIF
steps from a "system" or "user" source become prompt context, not turns. Export writes no
`subagent_trajectories`: a STACX episode's gateway segments are rewritten histories of one
agent, not sub-agents, so they stay steps of the one trajectory (`extra.stacx.segment`).
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from stacx.errors import StacxError
from stacx.events import (
    TurnActor,
    derive_id,
)
from stacx.store import db
from stacx.store.episodes_io import EpisodeRecord, read_records, whole_turns

ATIF_VERSION = "ATIF-v1.7"
Json = dict[str, object]


def _iso(ts: object) -> str | None:
    if not isinstance(ts, int | float):
        return None
    return datetime.fromtimestamp(float(ts), UTC).isoformat()



def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


# ---- export -----------------------------------------------------------------------------------


def _by_kind(rec: EpisodeRecord) -> dict[str, list[Json]]:
    out: dict[str, list[Json]] = defaultdict(list)
    for e in rec.events:
        out[str(e["kind"])].append(e)
    return out


def trajectory(
    rec: EpisodeRecord,
    *,
    instruction: str,
    model_name: str,
    decode: Callable[[list[int]], str] | None,
) -> Json:
    """The episode as an ATIF v1.7 trajectory (token ids and logprobs on every agent step)."""
    ev = _by_kind(rec)
    start = ev["EpisodeStarted"][0] if ev["EpisodeStarted"] else {}
    calls: dict[int, list[Json]] = defaultdict(list)
    returns: dict[int, list[Json]] = defaultdict(list)
    for c in ev["ToolCalled"]:
        calls[int(c["turn"])].append(c)  # type: ignore[call-overload]
    for r in ev["ToolReturned"]:
        returns[int(r["turn"])].append(r)  # type: ignore[call-overload]
    steps: list[Json] = [{
        "step_id": 1, "timestamp": _iso(start.get("ts")), "source": "user", "message": instruction,
    }]  # fmt: skip
    total_prompt = total_completion = 0
    for t in whole_turns(ev["TurnGenerated"]):
        turn = int(t["turn"])  # type: ignore[call-overload]
        prompt, output = list(t["prompt_ids"]), list(t["output_ids"])  # type: ignore[call-overload]
        total_prompt += len(prompt)
        total_completion += len(output)
        model_turn = t.get("actor") in (TurnActor.STUDENT, TurnActor.TEACHER)
        step: Json = {
            "step_id": len(steps) + 1,
            "timestamp": _iso(t.get("ts")),
            "source": "agent",
            "model_name": model_name,
            "message": decode(output) if decode else "",
            "llm_call_count": 1 if model_turn else None,
            "metrics": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(output),
                "prompt_token_ids": prompt,
                "completion_token_ids": output,
                "logprobs": t.get("logprobs"),
            },
            "extra": {"stacx": {
                "turn": turn, "actor": t.get("actor"), "weight_version": t.get("weight_version"),
                "finish_reason": t.get("finish_reason"), "engine": t.get("engine"),
                "segment": t.get("segment") or 0,
            }},
        }  # fmt: skip
        if calls[turn]:
            step["tool_calls"] = [_tool_call(c) for c in calls[turn]]
        if returns[turn]:
            step["observation"] = {"results": [_tool_result(r) for r in returns[turn]]}
        steps.append(step)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": rec.episode_id,
        "trajectory_id": rec.episode_id,
        "agent": {"name": str(start.get("agent") or "stacx"), "version": "stacx",
                  "model_name": model_name},
        "steps": steps,
        "final_metrics": {"total_prompt_tokens": total_prompt,
                          "total_completion_tokens": total_completion,
                          "total_steps": len(steps)},
    }  # fmt: skip


# what ATIF's tool call and observation result cannot say, kept in their `extra.stacx` (v1.7)
RESULT_EXTRA = ("exit_code", "timed_out", "truncated", "error", "duration_ms")


def _tool_call(c: Json) -> Json:
    raw = str(c.get("arguments_json") or "{}")
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    call: Json = {"tool_call_id": c["call_id"], "function_name": c["tool"],
                  "arguments": arguments if isinstance(arguments, dict) else {}}  # fmt: skip
    if not isinstance(arguments, dict):  # a malformed call: ATIF wants an object; keep the text
        call["extra"] = {"stacx": {"arguments_json": raw}}
    return call


def _tool_result(r: Json) -> Json:
    return {"source_call_id": r["call_id"], "content": r.get("output") or r.get("error") or "",
            "extra": {"stacx": {k: r.get(k) for k in RESULT_EXTRA}}}  # fmt: skip


def pass_at_k(successes: dict[str, list[bool]]) -> dict[str, float]:
    """Unbiased pass@k averaged over tasks, for k = 1, 2, 4, ... up to the fewest trials."""
    if not successes:
        return {}
    fewest = min(len(v) for v in successes.values())
    out: dict[str, float] = {}
    k = 1
    while k <= fewest:
        per_task = []
        for v in successes.values():
            n, c = len(v), sum(v)
            per_task.append(1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k))
        out[str(k)] = sum(per_task) / len(per_task)
        k *= 2
    return out


def _run_meta(run_dir: Path) -> tuple[Json, dict[str, str]]:
    con = db.connect_run(run_dir)
    try:
        row = con.execute("select config_json from run_started order by _seq limit 1").fetchone()
        paths = dict(con.execute(
            "select task_id, any_value(task_path) from task_scheduled group by 1").fetchall())  # fmt: skip
    finally:
        con.close()
    config = json.loads(row[0]) if row else {}
    return config, {str(k): str(v) for k, v in paths.items()}


def _instruction(path: str | None) -> str:
    if path and Path(path, "instruction.md").is_file():
        return Path(path, "instruction.md").read_text()
    return ""


def _step_results(metrics: dict[str, object], failed: list[Json]) -> list[Json] | None:
    """A multi-step trial's `step_results` (None for a single-step one, as Harbor): each
    verified step's rewards from the ``step.<name>.<key>`` metrics, in order, then the step that
    could not start (a StepFailed event) with its exception_info and no verifier result."""
    per_step: dict[str, dict[str, object]] = {}
    for key, value in metrics.items():
        if key.startswith("step.") and key.count(".") >= 2:
            name, _, metric = key[len("step."):].rpartition(".")
            per_step.setdefault(name, {})[metric] = value
    out: list[Json] = [{"step_name": name, "verifier_result": {"rewards": rewards},
                        "exception_info": None} for name, rewards in per_step.items()]  # fmt: skip
    for f in failed:
        out.append({"step_name": f["step"], "verifier_result": None, "exception_info": {
            "exception_type": str(f.get("exception_type") or ""),
            "exception_message": str(f.get("message") or ""),
            "exception_traceback": "",
            "occurred_at": _iso(f.get("ts")),
        }})  # fmt: skip
    return out or None


def _timing(start: object, end: object) -> Json | None:
    if start is None and end is None:
        return None
    return {"started_at": _iso(start), "finished_at": _iso(end)}


def _copy_artifacts(kept: Path, trial_dir: Path) -> None:
    """The episode's artifacts (<run dir>/artifacts/<episode>) in Harbor's trial layout:
    artifacts/, or a multi-step task's steps/<name>/artifacts/."""
    if not kept.is_dir():
        return
    items = list(kept.iterdir())
    if [i.name for i in items] == ["steps"]:
        shutil.copytree(kept / "steps", trial_dir / "steps", dirs_exist_ok=True)
    else:
        shutil.copytree(kept, trial_dir / "artifacts", dirs_exist_ok=True)


def export_job(
    run_dir: Path, job_dir: Path, *, decode: Callable[[list[int]], str] | None = None
) -> int:
    """Write the run's episodes as a Harbor job directory; returns the number of trials."""
    records = read_records(run_dir)
    if not records:
        raise StacxError(f"{run_dir}: no episodes to export")
    config, task_paths = _run_meta(run_dir)
    model = config.get("model")
    model_name = str(model.get("path") if isinstance(model, dict) else model or "unknown")
    agent = config.get("agent")
    agent_name = str(agent.get("name") if isinstance(agent, dict) else agent or "stacx")
    tasks_cfg = config.get("tasks")
    dataset = str(tasks_cfg.get("path") if isinstance(tasks_cfg, dict) else "") or "tasks"
    run_id = records[0].run_id
    job_dir.mkdir(parents=True, exist_ok=True)
    successes: dict[str, list[bool]] = defaultdict(list)
    reward_stats: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    exception_stats: dict[str, list[str]] = defaultdict(list)
    rewards: list[float] = []
    starts: list[float] = []
    ends: list[float] = []
    for rec in records:
        ev = _by_kind(rec)
        trial = f"{rec.task_id}__{rec.episode_id[:8]}"
        tdir = job_dir / trial
        start = ev["EpisodeStarted"][0] if ev["EpisodeStarted"] else {}
        sandbox = ev["SandboxStarted"][0] if ev["SandboxStarted"] else {}
        finished = ev["EpisodeFinished"][-1] if ev["EpisodeFinished"] else {}
        reward = ev["RewardAssigned"][-1] if ev["RewardAssigned"] else None
        failure = next((f for f in reversed(ev["InfraFailed"]) if f.get("turn") is None), None)
        verifier_result = None
        if reward is not None:
            metrics = json.loads(str(reward.get("metrics_json") or "{}"))
            metrics.setdefault("reward", reward["reward"])
            verifier_result = {"rewards": metrics}
            value = float(metrics["reward"])
            rewards.append(value)
            successes[rec.task_id].append(value >= 1.0)
            reward_stats["reward"][f"{value:g}"].append(trial)
            _write(tdir / "verifier" / "reward.json", metrics)
            (tdir / "verifier" / "test-stdout.txt").write_text(
                str(reward.get("verifier_output") or ""))  # fmt: skip
        step_results = _step_results(
            json.loads(str(reward.get("metrics_json") or "{}")) if reward else {},
            ev["StepFailed"],
        )
        exception_info = None
        if failure is not None and reward is None:
            exception_info = {
                "exception_type": str(failure["failure_kind"]),
                "exception_message": str(failure.get("message") or ""),
                "exception_traceback": "",
                "occurred_at": _iso(failure.get("ts")),
            }
            exception_stats[str(failure["failure_kind"])].append(trial)
        event_ts = [float(e["ts"]) for e in rec.events if isinstance(e.get("ts"), int | float)]  # type: ignore[arg-type]
        if event_ts:
            starts.append(min(event_ts))
            ends.append(max(event_ts))
        turns = whole_turns(ev["TurnGenerated"])
        n_in = sum(len(t["prompt_ids"]) for t in turns)  # type: ignore[arg-type,misc]
        n_out = sum(len(t["output_ids"]) for t in turns)  # type: ignore[arg-type,misc]
        task_path = task_paths.get(rec.task_id)
        result = {
            "id": str(uuid.UUID(hex=derive_id(run_id, rec.episode_id))),
            "task_name": rec.task_id,
            "trial_name": trial,
            "trial_uri": tdir.resolve().as_uri(),
            "task_id": {"path": task_path or rec.task_id},
            "source": dataset,
            "task_checksum": "",
            "config": {"task": {"path": task_path}, "trial_name": trial, "job_id": run_id,
                       "agent": {"name": agent_name, "model_name": model_name}},
            "agent_info": {"name": agent_name, "version": "stacx",
                           "model_info": {"name": model_name, "provider": "stacx"}},
            "agent_result": {"n_input_tokens": n_in, "n_cache_tokens": 0,
                             "n_output_tokens": n_out, "cost_usd": None,
                             "metadata": {"stop_reason": finished.get("stop_reason"),
                                          "n_turns": finished.get("n_turns"),
                                          "stacx_episode_id": rec.episode_id,
                                          "stacx_group_id": rec.group_id}},
            "verifier_result": verifier_result,
            "step_results": step_results,
            "exception_info": exception_info,
            "started_at": _iso(min(event_ts) if event_ts else None),
            "finished_at": _iso(max(event_ts) if event_ts else None),
            "environment_setup": _timing(start.get("ts"), sandbox.get("ts") or start.get("ts")),
            "agent_setup": None,
            "agent_execution": _timing(sandbox.get("ts") or start.get("ts"), finished.get("ts")),
            "verifier": _timing(finished.get("ts"), reward.get("ts") if reward else None)
            if finished else None,
        }  # fmt: skip
        _write(tdir / "result.json", result)
        _write(tdir / "config.json", result["config"])
        _copy_artifacts(run_dir / "artifacts" / rec.episode_id, tdir)
        _write(tdir / "agent" / "trajectory.json", trajectory(
            rec, instruction=_instruction(task_path), model_name=model_name, decode=decode))  # fmt: skip
    n_errors = sum(len(v) for v in exception_stats.values())
    key = f"{agent_name}__{Path(model_name).name}__{Path(dataset).name}"
    _write(job_dir / "config.json", {
        "job_name": job_dir.name, "jobs_dir": str(job_dir.parent),
        "n_attempts": int(tasks_cfg.get("group_size", 1)) if isinstance(tasks_cfg, dict) else 1,
        "agents": [{"name": agent_name, "model_name": model_name}],
        "datasets": [{"path": dataset}], "tasks": [],
        "stacx": {"run_id": run_id, "run_dir": str(run_dir.resolve()), "recipe": config},
    })  # fmt: skip
    _write(job_dir / "result.json", {
        "id": str(uuid.UUID(hex=derive_id("job", run_id))),
        "started_at": _iso(min(starts) if starts else None),
        "finished_at": _iso(max(ends) if ends else None),
        "n_total_trials": len(records),
        "stats": {"n_trials": len(records), "n_errors": n_errors, "evals": {key: {
            "n_trials": len(records), "n_errors": n_errors,
            "metrics": [{"mean": sum(rewards) / len(rewards) if rewards else 0.0}],
            "pass_at_k": pass_at_k(successes),
            "reward_stats": {k: dict(v) for k, v in reward_stats.items()},
            "exception_stats": dict(exception_stats),
        }}},
    })  # fmt: skip
    return len(records)


# ---- import -----------------------------------------------------------------------------------
