"""A STACX run written as a Harbor job directory (reading one back: stacx.harbor.job_import):
config.json, result.json with pass@k, and per trial its result, ATIF v1.7 trajectory (token ids and
logprobs kept) and verifier output. A trial failed for infrastructure is an error, not a 0.

Design: docs/tasks.md#the-export-layout
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
from stacx.events import TurnActor, derive_id
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


def _agent_step(
    t: Json, step_id: int, model_name: str, decode: Callable[[list[int]], str] | None
) -> Json:
    """One model turn as an ATIF agent step (token ids, logprobs; STACX's fields in extra.stacx)."""
    prompt, output = list(t["prompt_ids"]), list(t["output_ids"])  # type: ignore[call-overload]
    model_turn = t.get("actor") in (TurnActor.STUDENT, TurnActor.TEACHER)
    return {
        "step_id": step_id,
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
        "extra": {
            "stacx": {
                "turn": int(t["turn"]),  # type: ignore[call-overload]
                "actor": t.get("actor"),
                "weight_version": t.get("weight_version"),
                "finish_reason": t.get("finish_reason"),
                "engine": t.get("engine"),
                "segment": t.get("segment") or 0,
            }
        },
    }


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
    steps: list[Json] = [
        {
            "step_id": 1,
            "timestamp": _iso(start.get("ts")),
            "source": "user",
            "message": instruction,
        }
    ]
    total_prompt = total_completion = 0
    for t in whole_turns(ev["TurnGenerated"]):
        step = _agent_step(t, len(steps) + 1, model_name, decode)
        total_prompt += step["metrics"]["prompt_tokens"]  # type: ignore[index]
        total_completion += step["metrics"]["completion_tokens"]  # type: ignore[index]
        turn = int(t["turn"])  # type: ignore[call-overload]
        if calls[turn]:
            step["tool_calls"] = [_tool_call(c) for c in calls[turn]]
        if returns[turn]:
            step["observation"] = {"results": [_tool_result(r) for r in returns[turn]]}
        steps.append(step)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": rec.episode_id,
        "trajectory_id": rec.episode_id,
        "agent": {
            "name": str(start.get("agent") or "stacx"),
            "version": "stacx",
            "model_name": model_name,
        },
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": total_prompt,
            "total_completion_tokens": total_completion,
            "total_steps": len(steps),
        },
    }


# what ATIF's tool call and observation result cannot say, kept in their `extra.stacx` (v1.7)
RESULT_EXTRA = ("exit_code", "timed_out", "truncated", "error", "duration_ms")


def _tool_call(c: Json) -> Json:
    raw = str(c.get("arguments_json") or "{}")
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    call: Json = {
        "tool_call_id": c["call_id"],
        "function_name": c["tool"],
        "arguments": arguments if isinstance(arguments, dict) else {},
    }
    if not isinstance(arguments, dict):  # a malformed call: ATIF wants an object; keep the text
        call["extra"] = {"stacx": {"arguments_json": raw}}
    return call


def _tool_result(r: Json) -> Json:
    return {
        "source_call_id": r["call_id"],
        "content": r.get("output") or r.get("error") or "",
        "extra": {"stacx": {k: r.get(k) for k in RESULT_EXTRA}},
    }


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
    with db.connect_run(run_dir) as con:
        row = con.execute("select config_json from run_started order by _seq limit 1").fetchone()
        paths = dict(
            con.execute(
                "select task_id, any_value(task_path) from task_scheduled group by 1"
            ).fetchall()
        )
    config = json.loads(row[0]) if row else {}
    return config, {str(k): str(v) for k, v in paths.items()}


def _instruction(path: str | None) -> str:
    if path and Path(path, "instruction.md").is_file():
        return Path(path, "instruction.md").read_text()
    return ""


def _agent_result(rec: EpisodeRecord, turns: list[Json], finished: Json) -> Json:
    """A trial's agent_result: the tokens its turns read and wrote, how the episode ended."""
    return {
        "n_input_tokens": sum(len(t["prompt_ids"]) for t in turns),  # type: ignore[arg-type,misc]
        "n_cache_tokens": 0,
        "n_output_tokens": sum(len(t["output_ids"]) for t in turns),  # type: ignore[arg-type,misc]
        "cost_usd": None,
        "metadata": {
            "stop_reason": finished.get("stop_reason"),
            "n_turns": finished.get("n_turns"),
            "stacx_episode_id": rec.episode_id,
            "stacx_group_id": rec.group_id,
        },
    }


def _step_results(metrics: dict[str, object], failed: list[Json]) -> list[Json] | None:
    """A multi-step trial's `step_results` (None for one step): verified steps, a failed one."""
    per_step: dict[str, dict[str, object]] = {}
    for key, value in metrics.items():
        if key.startswith("step.") and key.count(".") >= 2:
            name, _, metric = key[len("step.") :].rpartition(".")
            per_step.setdefault(name, {})[metric] = value
    out: list[Json] = [
        {"step_name": name, "verifier_result": {"rewards": rewards}, "exception_info": None}
        for name, rewards in per_step.items()
    ]
    for f in failed:
        info = _exception_info(f.get("exception_type"), f)
        out.append({"step_name": f["step"], "verifier_result": None, "exception_info": info})
    return out or None


def _exception_info(kind: object, event: Json) -> Json:
    """Harbor's exception_info of a failure `kind` that `event` (with its message) records."""
    return {
        "exception_type": str(kind or ""),
        "exception_message": str(event.get("message") or ""),
        "exception_traceback": "",
        "occurred_at": _iso(event.get("ts")),
    }


def _timing(start: object, end: object) -> Json | None:
    if start is None and end is None:
        return None
    return {"started_at": _iso(start), "finished_at": _iso(end)}


def _copy_artifacts(kept: Path, trial_dir: Path) -> None:
    """The episode's artifacts in Harbor's trial layout (artifacts/, or steps/<name>/artifacts/)."""
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
    job_dir.mkdir(parents=True, exist_ok=True)
    job = _JobWriter(run_dir, job_dir, config, task_paths, records[0].run_id, decode)
    for rec in records:
        job.trial(rec)
    job.finish(len(records))
    return len(records)


class _JobWriter:
    """One Harbor job directory being written: the run's identity and the job-level totals."""

    def __init__(
        self,
        run_dir: Path,
        job_dir: Path,
        config: dict[str, object],
        task_paths: dict[str, str],
        run_id: str,
        decode: Callable[[list[int]], str] | None,
    ) -> None:
        self.run_dir, self.job_dir, self.config = run_dir, job_dir, config
        self.task_paths, self.run_id, self.decode = task_paths, run_id, decode
        model = config.get("model")
        self.model_name = str(model.get("path") if isinstance(model, dict) else model or "unknown")
        agent = config.get("agent")
        self.agent_name = str(agent.get("name") if isinstance(agent, dict) else agent or "stacx")
        self.tasks_cfg = tasks_cfg = config.get("tasks")
        self.dataset = str(tasks_cfg.get("path") if isinstance(tasks_cfg, dict) else "") or "tasks"
        self.successes: dict[str, list[bool]] = defaultdict(list)
        self.reward_stats: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        self.exception_stats: dict[str, list[str]] = defaultdict(list)
        self.rewards: list[float] = []
        self.starts: list[float] = []
        self.ends: list[float] = []

    def trial(self, rec: EpisodeRecord) -> None:
        """Write one episode as a trial directory and count it in the job's totals."""
        ev = _by_kind(rec)
        trial = f"{rec.task_id}__{rec.episode_id[:8]}"
        tdir = self.job_dir / trial
        reward = ev["RewardAssigned"][-1] if ev["RewardAssigned"] else None
        verifier_result = self._verifier(reward, rec.task_id, trial, tdir)
        exception_info = None if reward is not None else self._exception(ev, trial)
        event_ts = [float(e["ts"]) for e in rec.events if isinstance(e.get("ts"), int | float)]  # type: ignore[arg-type]
        if event_ts:
            self.starts.append(min(event_ts))
            self.ends.append(max(event_ts))
        task_path = self.task_paths.get(rec.task_id)
        result = self._result(rec, ev, trial, tdir, task_path, event_ts)
        result["verifier_result"] = verifier_result
        result["exception_info"] = exception_info
        _write(tdir / "result.json", result)
        _write(tdir / "config.json", result["config"])
        _copy_artifacts(self.run_dir / "artifacts" / rec.episode_id, tdir)
        _write(
            tdir / "agent" / "trajectory.json",
            trajectory(
                rec,
                instruction=_instruction(task_path),
                model_name=self.model_name,
                decode=self.decode,
            ),
        )

    def _verifier(self, reward: Json | None, task_id: str, trial: str, tdir: Path) -> Json | None:
        """The trial's verifier result (and its verifier/ files); None without a reward."""
        if reward is None:
            return None
        metrics = json.loads(str(reward.get("metrics_json") or "{}"))
        metrics.setdefault("reward", reward["reward"])
        value = float(metrics["reward"])
        self.rewards.append(value)
        self.successes[task_id].append(value >= 1.0)
        self.reward_stats["reward"][f"{value:g}"].append(trial)
        _write(tdir / "verifier" / "reward.json", metrics)
        (tdir / "verifier" / "test-stdout.txt").write_text(str(reward.get("verifier_output") or ""))
        return {"rewards": metrics}

    def _exception(self, ev: dict[str, list[Json]], trial: str) -> Json | None:
        """An unscored trial's exception info: its last episode-level InfraFailed, if any."""
        failure = next((f for f in reversed(ev["InfraFailed"]) if f.get("turn") is None), None)
        if failure is None:
            return None
        self.exception_stats[str(failure["failure_kind"])].append(trial)
        return _exception_info(failure["failure_kind"], failure)

    def _result(
        self,
        rec: EpisodeRecord,
        ev: dict[str, list[Json]],
        trial: str,
        tdir: Path,
        task_path: str | None,
        event_ts: list[float],
    ) -> Json:
        """A trial's result.json (verifier_result and exception_info are set by the caller)."""
        start = ev["EpisodeStarted"][0] if ev["EpisodeStarted"] else {}
        sandbox = ev["SandboxStarted"][0] if ev["SandboxStarted"] else {}
        finished = ev["EpisodeFinished"][-1] if ev["EpisodeFinished"] else {}
        reward = ev["RewardAssigned"][-1] if ev["RewardAssigned"] else None
        step_results = _step_results(
            json.loads(str(reward.get("metrics_json") or "{}")) if reward else {},
            ev["StepFailed"],
        )
        model_name, agent_name = self.model_name, self.agent_name
        return {
            "id": str(uuid.UUID(hex=derive_id(self.run_id, rec.episode_id))),
            "task_name": rec.task_id,
            "trial_name": trial,
            "trial_uri": tdir.resolve().as_uri(),
            "task_id": {"path": task_path or rec.task_id},
            "source": self.dataset,
            "task_checksum": "",
            "config": {
                "task": {"path": task_path},
                "trial_name": trial,
                "job_id": self.run_id,
                "agent": {"name": agent_name, "model_name": model_name},
            },
            "agent_info": {
                "name": agent_name,
                "version": "stacx",
                "model_info": {"name": model_name, "provider": "stacx"},
            },
            "agent_result": _agent_result(rec, whole_turns(ev["TurnGenerated"]), finished),
            "verifier_result": None,
            "step_results": step_results,
            "exception_info": None,
            "started_at": _iso(min(event_ts) if event_ts else None),
            "finished_at": _iso(max(event_ts) if event_ts else None),
            "environment_setup": _timing(start.get("ts"), sandbox.get("ts") or start.get("ts")),
            "agent_setup": None,
            "agent_execution": _timing(sandbox.get("ts") or start.get("ts"), finished.get("ts")),
            "verifier": _timing(finished.get("ts"), reward.get("ts") if reward else None)
            if finished
            else None,
        }

    def finish(self, n_trials: int) -> None:
        """The job's config.json and result.json (totals over every trial written)."""
        n_errors = sum(len(v) for v in self.exception_stats.values())
        key = f"{self.agent_name}__{Path(self.model_name).name}__{Path(self.dataset).name}"
        tasks_cfg = self.tasks_cfg
        _write(
            self.job_dir / "config.json",
            {
                "job_name": self.job_dir.name,
                "jobs_dir": str(self.job_dir.parent),
                "n_attempts": int(tasks_cfg.get("group_size", 1))
                if isinstance(tasks_cfg, dict)
                else 1,
                "agents": [{"name": self.agent_name, "model_name": self.model_name}],
                "datasets": [{"path": self.dataset}],
                "tasks": [],
                "stacx": {
                    "run_id": self.run_id,
                    "run_dir": str(self.run_dir.resolve()),
                    "recipe": self.config,
                },
            },
        )
        rewards = self.rewards
        _write(
            self.job_dir / "result.json",
            {
                "id": str(uuid.UUID(hex=derive_id("job", self.run_id))),
                "started_at": _iso(min(self.starts) if self.starts else None),
                "finished_at": _iso(max(self.ends) if self.ends else None),
                "n_total_trials": n_trials,
                "stats": {
                    "n_trials": n_trials,
                    "n_errors": n_errors,
                    "evals": {
                        key: {
                            "n_trials": n_trials,
                            "n_errors": n_errors,
                            "metrics": [{"mean": sum(rewards) / len(rewards) if rewards else 0.0}],
                            "pass_at_k": pass_at_k(self.successes),
                            "reward_stats": {k: dict(v) for k, v in self.reward_stats.items()},
                            "exception_stats": dict(self.exception_stats),
                        }
                    },
                },
            },
        )
