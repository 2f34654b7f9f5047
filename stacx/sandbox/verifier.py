"""The verifier, as Harbor runs it: tests/ to /tests, `bash /tests/test.sh`, then reward.json or
reward.txt. A reward is only ever a number the script wrote; every other ending is a failure kind
(no reward, timeout, OOM, pids limit, transport), never a reward of 0.

Design: docs/sandboxes.md#the-verifier
"""

from __future__ import annotations

import json
import math
import shlex
import time

import msgspec

from stacx.errors import SandboxError, TaskError
from stacx.events import FailureKind
from stacx.harbor.tasks import resolve_env
from stacx.ports import InfraFailure, Sandbox, Task, Verdict

REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"


class RewardParseError(ValueError):
    """A reward file exists but does not hold a usable reward; the message says why."""


class VerifierResult(msgspec.Struct, frozen=True, kw_only=True):
    reward: float
    metrics: dict[str, float]  # every metric the verifier wrote, `reward` included
    duration_ms: float = 0.0
    output: str = ""  # tail of test.sh's stdout+stderr


class VerifierFailure(msgspec.Struct, frozen=True, kw_only=True):
    kind: FailureKind
    reason: str
    duration_ms: float = 0.0
    output: str = ""


VerifierOutcome = VerifierResult | VerifierFailure


def _number(value: object, where: str) -> float:
    # bool is an int in Python, but `true` is not a score.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardParseError(f"{where}: {value!r} is not a number")
    f = float(value)
    if not math.isfinite(f):
        raise RewardParseError(f"{where}: {value!r} is not finite")
    return f


def parse_reward_text(text: str) -> dict[str, float]:
    """reward.txt: one bare number (whitespace around it allowed) -> {"reward": x}."""
    stripped = text.strip()
    if not stripped:
        raise RewardParseError("reward.txt is empty")
    try:
        value = float(stripped)
    except ValueError:
        raise RewardParseError(f"reward.txt does not hold a number: {stripped[:80]!r}") from None
    return {"reward": _number(value, "reward.txt")}


def parse_reward_json(text: str) -> dict[str, float]:
    """reward.json: a flat object of numbers; needs `reward` unless it has exactly one metric."""
    if not text.strip():
        raise RewardParseError("reward.json is empty")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RewardParseError(f"reward.json is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise RewardParseError("reward.json must be a non-empty object of numeric metrics")
    metrics = {str(k): _number(v, f"reward.json key {k!r}") for k, v in data.items()}
    if "reward" not in metrics:
        if len(metrics) != 1:
            raise RewardParseError(
                f"reward.json has no `reward` key and several metrics: {sorted(metrics)}"
            )
        metrics["reward"] = next(iter(metrics.values()))
    return metrics


def parse_reward_files(reward_txt: str | None, reward_json: str | None) -> dict[str, float]:
    """Harbor's precedence: reward.json if it exists, else reward.txt; neither is an error."""
    if reward_json is not None:
        return parse_reward_json(reward_json)
    if reward_txt is not None:
        return parse_reward_text(reward_txt)
    raise RewardParseError("test.sh wrote neither /logs/verifier/reward.txt nor reward.json")


async def _read_optional(sandbox: Sandbox, path: str) -> str | None:
    try:
        return (await sandbox.read_file(path)).decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError):
        return None


def _tail(text: str, n: int = 2000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


async def _stage_tests(sandbox: Sandbox, task: Task) -> str:
    """The tests in /tests, an empty /logs/verifier, as root from /; what failed ("": nothing)."""
    workdir = getattr(sandbox, "workdir", "")
    remake = f"mkdir -p {shlex.quote(workdir)} && " if workdir else ""
    wiped = await sandbox.exec(
        f"{remake}rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier"
        " && chmod 777 /logs/verifier",
        user="0",
        cwd="/",
    )
    if wiped.exit_code != 0:
        return (
            f"cannot prepare /tests (exit {wiped.exit_code}): "
            f"{(wiped.stderr or wiped.stdout).strip()[:500]}"
        )
    # A step's tests go over the task's shared tests/ (helpers next to its test.sh)
    shared = task.dir / "tests"
    if task.step and task.tests_dir != shared and shared.is_dir():
        await sandbox.upload_dir(str(shared), "/tests")
    await sandbox.upload_dir(str(task.tests_dir), "/tests")
    return ""


async def run_verifier(sandbox: Sandbox, task: Task) -> VerifierOutcome:
    """Run the task's tests in the sandbox and read the reward (no events)."""
    cfg = task.config.verifier
    t0 = time.perf_counter()

    def ms() -> float:
        return (time.perf_counter() - t0) * 1000

    def failed(kind: FailureKind, reason: str, output: str = "") -> VerifierFailure:
        return VerifierFailure(kind=kind, reason=reason, duration_ms=ms(), output=output)

    try:
        env = resolve_env(cfg.env, where=f"{task.path}/task.toml: verifier.env")
    except TaskError as exc:
        return VerifierFailure(kind=FailureKind.VERIFIER_ERROR, reason=str(exc))
    try:
        staged = await _stage_tests(sandbox, task)
        if staged:
            return failed(FailureKind.VERIFIER_ERROR, staged)
        result = await sandbox.exec(
            ["bash", "/tests/test.sh"],
            timeout=cfg.timeout_sec,
            env=env or None,
            user=None if cfg.user is None else str(cfg.user),
        )
        output = _tail(result.stdout + result.stderr)
        if result.timed_out:
            late = f"test.sh ran past verifier.timeout_sec={cfg.timeout_sec:g}"
            return failed(FailureKind.VERIFIER_TIMEOUT, late, output)
        reward_json = await _read_optional(sandbox, REWARD_JSON)
        reward_txt = None if reward_json is not None else await _read_optional(sandbox, REWARD_TXT)
    except SandboxError as exc:
        return failed(FailureKind.EXEC_TRANSPORT, str(exc))
    # A limit hit by the script's own processes (a child OOM-killed, a fork refused) is the
    # task's business, as under Harbor: a script that still wrote its reward is scored, with
    # the hit noted in its output; one that wrote none fails with the limit as the reason.
    hit = ""
    if result.oom_killed:
        hit = f"the OOM killer fired during test.sh (memory_mb={task.config.environment.memory_mb})"
    elif result.pids_limited:
        hit = "test.sh hit the sandbox's pids limit (a fork bomb?) and was killed"
    try:
        metrics = parse_reward_files(reward_txt, reward_json)
    except RewardParseError as exc:
        if hit:
            kind = FailureKind.OOM if result.oom_killed else FailureKind.PIDS_LIMIT
            return failed(kind, hit, output)
        why = f"{exc} (test.sh exit code {result.exit_code})"
        return failed(FailureKind.VERIFIER_NO_REWARD, why, output)
    if hit:
        output = f"{output}\n[stacx: {hit}; its reward is kept]"
    return VerifierResult(
        reward=metrics["reward"], metrics=metrics, duration_ms=ms(), output=output
    )


def verdict(outcome: VerifierOutcome) -> Verdict:
    """The `Environments` port's answer: a Verdict, or InfraFailure with the failure's kind."""
    if isinstance(outcome, VerifierFailure):
        detail = f"{outcome.reason}\n{outcome.output}" if outcome.output else outcome.reason
        raise InfraFailure(outcome.kind, detail)
    metrics = {k: v for k, v in outcome.metrics.items() if k != "reward"}
    return Verdict(
        reward=outcome.reward,
        metrics=metrics,
        verifier_ms=outcome.duration_ms,
        output=outcome.output,
    )
