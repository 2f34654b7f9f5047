"""The event catalog: every fact STACX records, as frozen, tagged msgspec Structs, sent on NATS
under ``stacx.<run_id>.<Kind>`` and recorded to one DuckDB table per kind. Every older log stays
readable (the evolution rules, tests/backbone/test_events.py). No behaviour beyond construction and
encoding.
Design: docs/concepts/events.md#schema-evolution
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeAlias

import msgspec

SCHEMA_VERSION = 1


def new_id() -> str:
    """A fresh random id (32 hex chars)."""
    return uuid.uuid4().hex


_NAMESPACE = uuid.UUID("5f1d3c2a-8e55-4a8e-9a39-7b1f0c2d4e6a")


def derive_id(*parts: object) -> str:
    """A deterministic id from parts, for events that must be idempotent across restarts (a
    re-publish is dropped by JetStream's duplicate window and, at any time, by the recorder)."""
    return uuid.uuid5(_NAMESPACE, "\x1f".join(map(str, parts))).hex


TEXT_CHARS = 4000  # characters of a message or an output an event keeps


def clipped(text: str) -> str:
    """What an event keeps of a message or an output: its first `TEXT_CHARS` characters."""
    return text[:TEXT_CHARS]


class StopReason(StrEnum):
    """Why an episode's agent loop ended (the verifier runs after any of them)."""

    SUBMITTED = "submitted"
    MAX_TURNS = "max_turns"
    CONTEXT_EXHAUSTED = "context_exhausted"
    TIMEOUT = "timeout"  # logs before agent_timeout; no longer produced
    AGENT_TIMEOUT = "agent_timeout"  # the task's agent.timeout_sec (or the recipe's) cut it
    AGENT_DONE = "agent_done"  # scripted agents (oracle, null) that finish by themselves
    ERROR = "error"  # an infrastructure failure stopped it; see InfraFailed
    STEP_FAILED = "step_failed"  # a multi-step task's step could not start; see StepFailed


class FailureKind(StrEnum):
    """Infrastructure failure kinds. An episode with one of these is never scored 0."""

    IMAGE_BUILD = "image_build"
    START = "start"
    EXEC_TRANSPORT = "exec_transport"
    OOM = "oom"
    PIDS_LIMIT = "pids_limit"
    AGENT_TIMEOUT = "agent_timeout"
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_NO_REWARD = "verifier_no_reward"
    VERIFIER_ERROR = "verifier_error"
    ENGINE = "engine"
    NON_DETERMINISM = "non_determinism"
    INTERNAL = "internal"
    TASK_INVALID = "task_invalid"  # the task itself cannot be loaded (bad task.toml, files)
    SANDBOX_HOST_LOST = "sandbox_host_lost"  # the sandbox service holding it died or went silent
    JUDGE = "judge"  # the judge model erred or gave no usable score after its retries (JudgeScored)
    # an installed scaffold exited non-zero before any model call was answered, or its process
    # could not start (its ScaffoldExited has the exit code and stderr; view scaffold_failures)
    SCAFFOLD = "scaffold"


class TurnActor(StrEnum):
    """Who produced a turn's action."""

    STUDENT = "student"
    TEACHER = "teacher"
    ORACLE = "oracle"
    NULL = "null"


class RollIn(StrEnum):
    """Who executes an episode's roll-in (``EpisodeStarted.policy``)."""

    STUDENT = "student"
    TEACHER = "teacher"
    MIXTURE = "mixture"  # DAgger's beta-mixture: the teacher acts a turn with probability beta
    BRANCH = "branch"  # an AggreVaTe branch: exploration action, then the teacher finishes
    ORACLE = "oracle"  # the task's own solution, played through the tools
    NULL = "null"  # submits at once (a floor for the verifier)


class RegradeIssue(StrEnum):
    """Why `stacx regrade` gave an episode no new grade (``EpisodeNotRegraded.issue``)."""

    DIVERGED = "diverged"  # a replayed call's observation differs from the recorded one
    NOT_REPLAYABLE = "not_replayable"  # no recorded actions to replay (installed scaffolds)
    INFRA = "infra"  # the sandbox or the grader failed (an infrastructure failure, never a 0)
    NO_TASK = "no_task"  # the episode's task is not in the task set given to the regrade


class RunStatus(StrEnum):
    """How a run ended (``RunFinished.status``)."""

    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Envelope shared by every kind."""

    run_id: str
    event_id: str = msgspec.field(default_factory=new_id)
    ts: float = msgspec.field(default_factory=time.time)

    @property
    def kind(self) -> str:
        return type(self).__name__


class _Kind(Event, frozen=True, kw_only=True, tag=True):
    """Base for concrete kinds: tagged with the class name."""


# ---- run lifecycle ---------------------------------------------------------------------------


class RunStarted(_Kind, frozen=True, kw_only=True, tag=True):
    recipe: str
    config_json: str  # the fully resolved recipe, as JSON
    stacx_version: str = ""
    host: str = ""
    schema_version: int = SCHEMA_VERSION
    attempt: int = 0  # 0 for a fresh run, n for the n-th resume


class RunFinished(_Kind, frozen=True, kw_only=True, tag=True):
    status: RunStatus
    message: str = ""


# ---- tasks and episodes ----------------------------------------------------------------------


class TaskScheduled(_Kind, frozen=True, kw_only=True, tag=True):
    task_id: str
    task_path: str
    group_id: str
    n_samples: int = 1
    iteration: int = 0
    split: str = "train"
    # sync mode: the weight version its samples must be generated with (the rollout worker
    # waits until its engine serves it); None: whatever the engine serves (async, eval)
    weight_version: int | None = None
    # "eval": a periodic evaluation during training (the recipe's [eval]), at `weight_version`;
    # its episodes are scored like any other and never trained on. "": the run's own groups.
    role: str = ""


class EpisodeStarted(_Kind, frozen=True, kw_only=True, tag=True):
    episode_id: str
    task_id: str
    group_id: str
    sample_index: int = 0
    agent: str = ""
    policy: RollIn = RollIn.STUDENT  # who executes the roll-in
    iteration: int = 0
    attempt: int = 0
    image: str = ""
    beta: float | None = None  # teacher probability per turn in a beta-mixture roll-in


class TurnGenerated(_Kind, frozen=True, kw_only=True, tag=True):
    """One model turn: the exact prompt ids the engine saw and the ids it produced; ``prefix_len`` >
    0: ``prompt_ids`` holds only the ids after the previous turn's prompt + output."""

    episode_id: str
    turn: int
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float] | None = None  # one per output id; None for scripted actors
    weight_version: int | None = None
    finish_reason: str = ""  # "stop" | "length" | "abort"
    actor: TurnActor = TurnActor.STUDENT
    engine: str = ""
    gen_ms: float = 0.0
    queue_ms: float = 0.0
    # Turns recorded by the model gateway (stacx.inference.gateway) for black-box scaffolds:
    # `segment` counts rewrites of the episode's history (a prompt that does not start with an
    # earlier call's prompt + output starts segment + 1); `request_id` is the OpenAI call (its n
    # choices share it, `choice_index` tells them apart); `request_json` holds the request's
    # messages, tools and tool_choice, for reading (training reads the ids, never this text).
    segment: int = 0
    request_id: str = ""
    choice_index: int = 0
    request_json: str = ""
    # imported from text (a Harbor trajectory without token ids): the ids were made by the
    # model's chat template and tokenizer, not recorded from an engine
    retokenized: bool = False
    prefix_len: int = 0  # leading prompt ids left out: the previous turn's prompt + output
    # per-token weight versions of a turn generated across a weight load: the output ids from
    # version_starts[i] up to the next start came from versions[i] (version_starts[0] == 0).
    # Empty (the default, and every older log): all of them came from `weight_version`.
    version_starts: list[int] = msgspec.field(default_factory=list)
    versions: list[int] = msgspec.field(default_factory=list)


def prompt_split(prompt: list[int], previous_end: list[int]) -> tuple[int, list[int]]:
    """``(prefix_len, new prompt ids)``: the prompt minus ``previous_end`` (the previous turn's
    prompt + output) when it starts with it token-exactly, else ``(0, prompt)``."""
    n = len(previous_end)
    if n and len(prompt) >= n and prompt[:n] == previous_end:
        return n, prompt[n:]
    return 0, prompt


def full_prompts(turns: list[tuple[int, int, list[int], list[int]]]) -> list[list[int]]:
    """Whole prompts of one episode's turns, in turn order (the ``turns`` view's rule); ValueError
    when a ``prefix_len`` does not match the previous turn (a missing turn, a corrupt log)."""
    out: list[list[int]] = []
    end: list[int] = []
    last = None
    for turn, prefix_len, prompt, output in turns:
        if prefix_len:
            if last != turn - 1 or prefix_len != len(end):
                raise ValueError(
                    f"turn {turn}: prefix_len {prefix_len} does not match turn {turn - 1}'s "
                    f"prompt + output ({len(end) if last == turn - 1 else 'missing'})"
                )
            prompt = end + list(prompt)
        out.append(list(prompt))
        end = out[-1] + list(output)
        last = turn
    return out


class ToolCalled(_Kind, frozen=True, kw_only=True, tag=True):
    episode_id: str
    turn: int
    call_id: str
    tool: str
    arguments_json: str = "{}"


class ToolReturned(_Kind, frozen=True, kw_only=True, tag=True):
    episode_id: str
    turn: int
    call_id: str
    tool: str
    output: str = ""  # what the agent saw (possibly truncated, visibly)
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    error: str = ""  # a malformed call or a tool error, as told to the model
    duration_ms: float = 0.0


class EpisodeFinished(_Kind, frozen=True, kw_only=True, tag=True):
    episode_id: str
    stop_reason: StopReason
    n_turns: int = 0
    duration_ms: float = 0.0


class RewardAssigned(_Kind, frozen=True, kw_only=True, tag=True):
    episode_id: str
    reward: float
    metrics_json: str = "{}"  # every numeric metric the verifier wrote, `reward` included
    verifier_ms: float = 0.0
    verifier_output: str = ""  # the tail of the verifier's own stdout+stderr
    # who produced this reward: "" for the episode's own verifier at rollout time (and every
    # log older than the field); `stacx regrade` names its grader (e.g. "verifier:<tests
    # dir>@<content digest>"). An episode may have several; views take the latest by ts.
    grader: str = ""


class InfraFailed(_Kind, frozen=True, kw_only=True, tag=True):
    """An infrastructure failure: recorded, retried by policy, never scored as reward 0."""

    failure_kind: FailureKind
    message: str = ""
    episode_id: str | None = None
    task_id: str | None = None
    attempt: int = 0
    will_retry: bool = False
    # set when the failure concerns one visited state of an intact episode (a teacher's label
    # or score that could not be made), not the episode itself
    turn: int | None = None


class EpisodeWarned(_Kind, frozen=True, kw_only=True, tag=True):
    """Something about an episode's environment not faithful to the task as written (a base image
    mapped onto another), recorded, not fatal."""

    episode_id: str
    task_id: str = ""
    message: str = ""


class StepFailed(_Kind, frozen=True, kw_only=True, tag=True):
    """A step of a multi-step task that could not start (Harbor's step exception): later steps did
    not run; the episode is scored from the steps that ran (reward 0 with none verified)."""

    episode_id: str
    step: str
    exception_type: str = ""  # as Harbor names it: RuntimeError (setup.sh) | HealthcheckError
    message: str = ""


class SandboxStarted(_Kind, frozen=True, kw_only=True, tag=True):
    sandbox_id: str
    image: str
    episode_id: str | None = None
    start_ms: float = 0.0
    warm: bool = False
    host: str = ""  # the sandbox service that holds it (remote backend); "" when local


class SandboxStopped(_Kind, frozen=True, kw_only=True, tag=True):
    sandbox_id: str
    episode_id: str | None = None
    reason: str = ""


class JudgeScored(_Kind, frozen=True, kw_only=True, tag=True):
    """One question to a judge about an episode's answer: prompt and output ids, the reply,
    criterion -> score in [0, 1]; `error` says why a call gave no usable score. Every call is
    recorded; `score` is set on the one that completed the judgement (RewardAssigned combines it
    with the verifier's)."""

    episode_id: str
    call: int = 0  # 0 in batched mode; the criterion's index in individual mode
    attempt: int = 0  # 0, then 1.. for re-asks
    judge: str = ""  # the judge engine's name (the recipe's judge.name)
    rubric: str = ""  # the rubric file
    criteria: list[str] = msgspec.field(default_factory=list)
    prompt_ids: list[int] = msgspec.field(default_factory=list)
    output_ids: list[int] = msgspec.field(default_factory=list)
    reply: str = ""
    scores_json: str = "{}"
    score: float | None = None
    error: str = ""
    gen_ms: float = 0.0


# ---- imitation and distillation --------------------------------------------------------------


class TeacherLabeled(_Kind, frozen=True, kw_only=True, tag=True):
    """DAgger: the teacher's own action on the student's exact prompt ids at a visited state."""

    episode_id: str
    turn: int
    prompt_ids: list[int]
    label_ids: list[int]
    teacher: str = ""
    iteration: int = 0
    logprobs: list[float] | None = None


class TeacherScored(_Kind, frozen=True, kw_only=True, tag=True):
    """OPD: teacher logprobs of the student's sampled output ids, on identical prompt ids."""

    episode_id: str
    turn: int
    teacher_logprobs: list[float]
    teacher: str = ""


class BranchCreated(_Kind, frozen=True, kw_only=True, tag=True):
    """AggreVaTe: a branch of a learner episode at `turn`, explored with action `action_index`."""

    branch_id: str
    parent_episode_id: str
    turn: int
    action_index: int
    episode_id: str  # the branch's own episode (its turns are recorded under it)
    iteration: int = 0


class CostToGoEstimated(_Kind, frozen=True, kw_only=True, tag=True):
    branch_id: str
    parent_episode_id: str
    turn: int
    action_index: int
    cost: float  # 1 - reward
    reward: float
    iteration: int = 0


# ---- training and weights --------------------------------------------------------------------


class TrainStepFinished(_Kind, frozen=True, kw_only=True, tag=True):
    step: int
    algorithm: str
    loss: float
    weight_version: int  # the version these updated weights will be published as
    reward_mean: float | None = None
    n_samples: int = 0
    n_tokens: int = 0
    duration_ms: float = 0.0
    metrics_json: str = "{}"
    episode_ids: list[str] = msgspec.field(default_factory=list)  # lineage: what it trained on
    world_size: int = 1  # trainer ranks that took the step (stacx.train.distributed)


class WeightsPublished(_Kind, frozen=True, kw_only=True, tag=True):
    version: int
    path: str  # where its checkpoint is (durable) or will be (not durable yet: see CheckpointSaved)
    sha256: str  # the checkpoint's digest; "" while the version is not durable
    step: int = 0
    # whether the checkpoint at `path` was complete when this was published; False: the weights
    # were handed over from memory and the file comes later (CheckpointSaved) or never
    # (trainer.checkpoint_every); old logs: always durable
    durable: bool = True
    # size of the weights file at `path` (with [trainer.lora]: the adapter); not durable: the
    # tensor bytes held for it; 0 in old logs
    bytes: int = 0


class WeightsLoaded(_Kind, frozen=True, kw_only=True, tag=True):
    version: int
    engine: str
    latency_ms: float = 0.0
    # how the weights reached the engine: "memory" (the trainer's process), "shared" (another
    # process of the node: CUDA IPC or shared memory), "file" (the checkpoint); "" in old logs
    transport: str = ""
    # what moved into the engine: tensor bytes handed over, or the file's size; 0 in old logs
    bytes: int = 0
    # the load itself (take or read, copy or LoRA merge, until the engine serves it); latency_ms
    # adds bus delivery and queueing; 0 in old logs
    load_ms: float = 0.0
    # the version was a LoRA adapter ([trainer.lora]): merged at load into the torch engine's
    # weights, or loaded through SGLang's LoRA endpoint
    adapter: bool = False


class CheckpointSaved(_Kind, frozen=True, kw_only=True, tag=True):
    """A version written in the background became durable: a rerun may resume from it."""

    version: int
    path: str
    sha256: str
    duration_ms: float = 0.0  # the write, from the snapshot to the atomic rename
    nbytes: int = 0  # the files written


class TrainerResumed(_Kind, frozen=True, kw_only=True, tag=True):
    """The trainer (re)started at ``version`` from ``durable_version``, redoing ``redo_steps``."""

    version: int
    durable_version: int
    redo_steps: list[int] = msgspec.field(default_factory=list)


# ---- replay ----------------------------------------------------------------------------------


class EventImported(_Kind, frozen=True, kw_only=True, tag=True):
    """Provenance of a replayed event: `event_id` of this run came from a source run."""

    imported_event_id: str
    source_run_id: str
    source_event_id: str
    source_path: str = ""
    origin_run_id: str = (
        ""  # the run that first recorded it, across replay generations (A -> B -> C)
    )


class ScaffoldExited(_Kind, frozen=True, kw_only=True, tag=True):
    """An installed scaffold's process ended: exit code (None: timed out) and the tail of stderr."""

    episode_id: str
    scaffold: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    stderr_tail: str = ""


class GatewayRefused(_Kind, frozen=True, kw_only=True, tag=True):
    """The model gateway answered a call with an error: route, HTTP status, the error as sent."""

    episode_id: str
    route: str = ""
    status: int = 0
    error_type: str = ""
    code: str = ""
    param: str = ""
    message: str = ""


# ---- processes ------------------------------------------------------------------------------


class ProcessLoad(_Kind, frozen=True, kw_only=True, tag=True):
    """One process's load over a window (``stacx.actors.load``): event-loop lag (ms) and CPU (cores
    busy); a lag of tens of ms means the process is saturated."""

    process: str  # "launcher", "engine-0", "rollout-1", "trainer-0"
    pid: int
    window_s: float
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    cpu_share: float
    rss_mb: float = 0.0
    forks: int = 0  # os.fork / subprocess with preexec_fn in the window (each copies the process)


# ---- regrading ------------------------------------------------------------------------------


class EpisodeNotRegraded(_Kind, frozen=True, kw_only=True, tag=True):
    """`stacx regrade` replayed an episode for `grader` and did not grade it (`issue`); a divergence
    names the first differing call (turn, tool, both sides' exit codes and outputs)."""

    episode_id: str
    grader: str
    issue: RegradeIssue
    message: str = ""
    turn: int | None = None
    tool: str = ""
    recorded_exit_code: int | None = None
    replayed_exit_code: int | None = None
    recorded_output: str = ""
    replayed_output: str = ""


AnyEvent: TypeAlias = (
    RunStarted
    | RunFinished
    | TaskScheduled
    | EpisodeStarted
    | TurnGenerated
    | ToolCalled
    | ToolReturned
    | EpisodeFinished
    | RewardAssigned
    | InfraFailed
    | EpisodeWarned
    | StepFailed
    | SandboxStarted
    | SandboxStopped
    | JudgeScored
    | TeacherLabeled
    | TeacherScored
    | BranchCreated
    | CostToGoEstimated
    | TrainStepFinished
    | WeightsPublished
    | WeightsLoaded
    | CheckpointSaved
    | TrainerResumed
    | EventImported
    | ScaffoldExited
    | GatewayRefused
    | EpisodeNotRegraded
    | ProcessLoad
)

KINDS: dict[str, type[Event]] = {cls.__name__: cls for cls in AnyEvent.__args__}  # type: ignore[attr-defined]

Emit: TypeAlias = Callable[[Event], Awaitable[None]]
"""How engines publish: an async callable that returns once the event is acknowledged."""


def subject(run_id: str, kind: str) -> str:
    """The NATS subject of one kind of one run."""
    return f"stacx.{run_id}.{kind}"


def stream_name(run_id: str) -> str:
    return f"STACX_{run_id}".replace("-", "_")
