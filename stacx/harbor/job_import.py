"""Harbor job directories read back as STACX events, one episode per trial (writing them:
stacx.harbor.jobs). Reads ATIF v1.4 to v1.7; text-only steps are re-tokenized and marked so; ids are
derived from the job and trial names, so importing twice changes nothing.

Design: docs/tasks.md#the-import
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Generator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from stacx.errors import StacxError
from stacx.events import (
    EpisodeFinished,
    EpisodeStarted,
    Event,
    FailureKind,
    InfraFailed,
    RewardAssigned,
    RollIn,
    StopReason,
    ToolCalled,
    ToolReturned,
    TurnActor,
    TurnGenerated,
    derive_id,
    prompt_split,
)

ATIF_READS = ("ATIF-v1.4", "ATIF-v1.5", "ATIF-v1.6", "ATIF-v1.7")


def _ts(iso: object, default: float) -> float:
    if not isinstance(iso, str):
        return default
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


class ChatTemplate(Protocol):
    """What re-tokenizing a text trajectory needs from a tokenizer (transformers' has it)."""

    def apply_chat_template(
        self, conversation: list[dict[str, str]], **kwargs: object
    ) -> object: ...


_FAILURES = {
    "VerifierTimeoutError": FailureKind.VERIFIER_TIMEOUT,
    "RewardFileNotFoundError": FailureKind.VERIFIER_NO_REWARD,
    "RewardFileEmptyError": FailureKind.VERIFIER_NO_REWARD,
    "VerifierOutputParseError": FailureKind.VERIFIER_NO_REWARD,
    "EnvironmentStartTimeoutError": FailureKind.START,
}


def trial_dirs(paths: list[Path]) -> list[Path]:
    """The trial directories of Harbor job dirs (or trial dirs given directly), sorted."""
    out: list[Path] = []
    for p in paths:
        if not p.is_dir():
            raise StacxError(f"{p}: not a Harbor job or trial directory")
        if (p / "agent").is_dir() and (p / "result.json").is_file():
            out.append(p)
            continue
        found = sorted(d for d in p.iterdir() if (d / "result.json").is_file() and d.is_dir())
        if not found:
            raise StacxError(f"{p}: no trial directories (<trial>/result.json) in it")
        out += found
    return out


def _ids(tokenizer: ChatTemplate, messages: list[dict[str, str]], **kw: object) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, **kw)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # a BatchEncoding
        ids = ids["input_ids"]  # type: ignore[index]
    return [int(i) for i in ids]  # type: ignore[attr-defined]


_Doc = dict[str, Any]  # a parsed JSON document (trajectory.json), read defensively


class _Steps:
    """An ATIF step list (a trial's, or a sub-agent's) as an episode's turn and tool events."""

    def __init__(
        self, run_id: str, episode: str, path: Path, tokenizer: ChatTemplate | None
    ) -> None:
        self.run_id, self.episode, self.path, self.tokenizer = run_id, episode, path, tokenizer

    def eid(self, *parts: object) -> str:
        return derive_id(self.run_id, self.episode, *parts)

    def events(
        self, steps: list[_Doc], *, turn: int, segment: int, ts: float
    ) -> Generator[Event, None, tuple[int, float]]:
        """Yields the events; returns ``(next turn, last timestamp)``."""
        messages: list[dict[str, str]] = []
        seen: list[int] = []  # the previous step's prompt + output: stored once (prefix_len)
        for step in steps:
            ts = _ts(step.get("timestamp"), ts)
            text = _text(step.get("message"))
            if step.get("source") != "agent":
                role = "system" if step.get("source") == "system" else "user"
                messages.append({"role": role, "content": text})
                continue
            whole, out_ids, logprobs = self._ids(step, messages, text)
            prefix_len, new_ids = prompt_split(whole, seen)
            seen = whole + out_ids
            extra = (step.get("extra") or {}).get("stacx") or {}
            yield TurnGenerated(
                run_id=self.run_id,
                event_id=self.eid("turn", turn),
                ts=ts,
                episode_id=self.episode,
                turn=turn,
                prompt_ids=new_ids,
                prefix_len=prefix_len,
                output_ids=out_ids,
                logprobs=logprobs,
                weight_version=extra.get("weight_version"),
                finish_reason=str(extra.get("finish_reason") or "stop"),
                actor=TurnActor(extra.get("actor") or TurnActor.STUDENT),
                engine=f"harbor:{step.get('model_name') or ''}",
                retokenized=not _has_ids(step),
                segment=segment,
            )
            messages.append({"role": "assistant", "content": text})
            results = {
                r.get("source_call_id"): r
                for r in (step.get("observation") or {}).get("results", [])
            }
            for i, call in enumerate(step.get("tool_calls") or []):
                yield from self._tool(turn, i, call, results, ts)
            for r in results.values():
                messages.append({"role": "user", "content": _text(r.get("content"))})
            turn += 1
        return turn, ts

    def _ids(
        self, step: _Doc, messages: list[dict[str, str]], text: str
    ) -> tuple[list[int], list[int], list[float] | None]:
        """The step's prompt and output ids (recorded, or made by the chat template) and logprobs."""
        metrics = step.get("metrics") or {}
        if _has_ids(step):
            logprobs = metrics.get("logprobs")
            return (
                [int(i) for i in metrics["prompt_token_ids"]],
                [int(i) for i in metrics["completion_token_ids"]],
                [float(x) for x in logprobs] if logprobs is not None else None,
            )
        if self.tokenizer is None:
            raise StacxError(
                f"{self.path}: step {step.get('step_id')} has no token ids; give --tokenizer "
                "to re-tokenize its text through the model's chat template"
            )
        prompt = _ids(
            self.tokenizer,
            messages or [{"role": "user", "content": ""}],
            add_generation_prompt=True,
        )
        full = _ids(self.tokenizer, [*messages, {"role": "assistant", "content": text}])
        return prompt, full[len(prompt) :] if full[: len(prompt)] == prompt else full[-1:], None

    def _tool(
        self, turn: int, i: int, call: _Doc, results: dict[object, _Doc], ts: float
    ) -> Iterator[Event]:
        call_id = str(call.get("tool_call_id") or f"{turn}-{i}")
        tool = str(call.get("function_name") or "")
        raw = ((call.get("extra") or {}).get("stacx") or {}).get("arguments_json")
        common: dict[str, Any] = dict(
            run_id=self.run_id,
            ts=ts,
            episode_id=self.episode,
            turn=turn,
            call_id=call_id,
            tool=tool,
        )
        yield ToolCalled(
            **common,
            event_id=self.eid("call", turn, i),
            arguments_json=raw or json.dumps(call.get("arguments") or {}),
        )
        result = results.get(call_id) or {}
        kept = (result.get("extra") or {}).get("stacx") or {}  # what export kept (v1.7 `extra`)
        error, content = str(kept.get("error") or ""), _text(result.get("content"))
        yield ToolReturned(
            **common,
            event_id=self.eid("return", turn, i),
            output="" if error and content == error else content,
            exit_code=kept.get("exit_code"),
            timed_out=bool(kept.get("timed_out")),
            truncated=bool(kept.get("truncated")),
            error=error,
            duration_ms=float(kept.get("duration_ms") or 0.0),
        )


def _has_ids(step: _Doc) -> bool:
    m = step.get("metrics") or {}
    return m.get("prompt_token_ids") is not None and m.get("completion_token_ids") is not None


def _text(content: object) -> str:
    """A message or result's text (ATIF allows a list of content parts: their text is kept)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def trial_events(
    trial: Path, run_id: str, *, index: int, tokenizer: ChatTemplate | None
) -> Iterator[Event]:
    """The events of one Harbor trial as one STACX episode."""
    result = json.loads((trial / "result.json").read_text())
    traj_path = trial / "agent" / "trajectory.json"
    traj = _trajectory(traj_path)
    job = str((result.get("config") or {}).get("job_id") or trial.parent.name)
    trial_name = str(result.get("trial_name") or trial.name)
    task = str(result.get("task_name") or trial_name.split("__")[0])
    episode = derive_id("harbor", job, trial_name)
    t0 = _ts(result.get("started_at"), 0.0)
    agent_info = result.get("agent_info") or {}
    yield EpisodeStarted(
        run_id=run_id,
        event_id=derive_id(run_id, episode, "start"),
        ts=t0,
        episode_id=episode,
        task_id=task,
        group_id=derive_id("harbor", job, task),
        sample_index=index,
        agent=str(agent_info.get("name") or "harbor"),
        policy=RollIn.STUDENT,
    )
    steps = _Steps(run_id, episode, traj_path, tokenizer)
    turn, last_ts = yield from steps.events(traj.get("steps", []), turn=0, segment=0, ts=t0)
    for i, sub in enumerate(traj.get("subagent_trajectories") or []):  # ATIF v1.7
        turn, last_ts = yield from steps.events(
            sub.get("steps", []), turn=turn, segment=i + 1, ts=last_ts
        )
    end = _ts(result.get("finished_at"), last_ts)
    meta = (result.get("agent_result") or {}).get("metadata") or {}
    stop = meta.get("stop_reason") or StopReason.AGENT_DONE
    yield EpisodeFinished(
        run_id=run_id,
        event_id=derive_id(run_id, episode, "finish"),
        ts=end,
        episode_id=episode,
        stop_reason=StopReason(stop)
        if stop in StopReason._value2member_map_
        else StopReason.AGENT_DONE,
        n_turns=turn,
    )
    yield _outcome(trial, result, run_id, episode, task, end)


def _trajectory(path: Path) -> _Doc:
    """The trial's ATIF trajectory (none: no steps); StacxError on a schema version not read."""
    if not path.is_file():
        return {"steps": []}
    traj = json.loads(path.read_text())
    version = traj.get("schema_version")
    if version not in ATIF_READS:
        raise StacxError(f"{path}: schema_version {version!r}: accepted: {', '.join(ATIF_READS)}")
    return traj


def _outcome(
    trial: Path, result: _Doc, run_id: str, episode: str, task: str, ts: float
) -> RewardAssigned | InfraFailed:
    """The trial's reward (the verifier's ``reward``, else its first), or with none its failure."""
    verifier = result.get("verifier_result") or {}
    rewards = {
        str(k): float(v)
        for k, v in (verifier.get("rewards") or {}).items()
        if isinstance(v, int | float)
    }
    ids: dict[str, Any] = {"run_id": run_id, "ts": ts, "episode_id": episode}
    if rewards:
        reward = rewards.get("reward", next(iter(rewards.values())))
        stdout = trial / "verifier" / "test-stdout.txt"
        return RewardAssigned(
            **ids,
            event_id=derive_id(run_id, episode, "reward"),
            reward=reward,
            metrics_json=json.dumps({"reward": reward, **rewards}, sort_keys=True),
            verifier_output=stdout.read_text()[-2000:] if stdout.is_file() else "",
        )
    exc = result.get("exception_info") or {}
    kind = str(exc.get("exception_type") or "")
    return InfraFailed(
        **ids,
        event_id=derive_id(run_id, episode, "failed"),
        task_id=task,
        failure_kind=FailureKind(kind)
        if kind in FailureKind._value2member_map_
        else _FAILURES.get(kind, FailureKind.INTERNAL),
        message=f"{kind}: {exc.get('exception_message') or 'no verifier result'}",
    )


def needs_tokenizer(paths: list[Path]) -> bool:
    """Whether some agent step of the trials (or their sub-agents) has text but no token ids."""
    for trial in trial_dirs(paths):
        traj = trial / "agent" / "trajectory.json"
        if traj.is_file():
            doc = json.loads(traj.read_text())
            for t in [doc, *(doc.get("subagent_trajectories") or [])]:
                if any(s.get("source") == "agent" and not _has_ids(s) for s in t.get("steps", [])):
                    return True
    return False


def job_events(
    paths: list[Path], run_id: str, *, tokenizer: ChatTemplate | None
) -> Iterator[Event]:
    """The events of every trial of the job dirs, trials of a task numbered as its samples."""
    per_task: dict[str, int] = defaultdict(int)
    for trial in trial_dirs(paths):
        name = trial.name.split("__")[0]
        yield from trial_events(trial, run_id, index=per_task[name], tokenizer=tokenizer)
        per_task[name] += 1
