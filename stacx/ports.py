"""The ports: the in-memory vocabulary engines share, beside `stacx.events` (the vocabulary on the
bus). An engine never imports another engine: it names a port here (frozen Structs for data,
structural Protocols for capabilities, `InfraFailure` the one exception that crosses a port) and
`stacx.launch` wires the adapter in. Importing it loads neither torch nor Docker nor NATS.
Design: docs/concepts/layers.md
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

import msgspec

from stacx.errors import ConfigCausedError, plain_text
from stacx.events import (
    Emit,
    FailureKind,
    StopReason,
    TurnActor,
    TurnGenerated,
    derive_id,
    prompt_split,
)
from stacx.harbor.model import Task as Task  # re-exported: the ports speak it

if TYPE_CHECKING:
    import torch

# ---- rollout engine ---------------------------------------------------------------------------


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False  # keep generating past EOS (stop_token_ids still stop); benchmarks
    # constrained decoding: an llguidance grammar (Lark form, e.g. `start: %json {...}`) the
    # output must match; "" none. An engine that cannot honour it raises EngineError (the torch
    # engine can: stacx.inference.guided; an engine that can has a true `grammars` attribute)
    grammar: str = ""


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """One reply to one prompt, engine-made or scripted (policies and replays make them too): what
    the turn's log needs (`turn_generated` makes the event)."""

    output_ids: list[int]
    logprobs: list[float] | None  # log p(token) under the sampling distribution's model, one per id
    finish_reason: str  # "stop" (EOS or a stop token) | "length" | "abort"
    weight_version: int | None  # None: no model made it (a scripted reply)
    gen_ms: float = 0.0
    queue_ms: float = 0.0
    # a generation that spans a weight load: output_ids[version_starts[i]:version_starts[i+1]]
    # came from versions[i] (version_starts[0] == 0); empty: every token is `weight_version`'s
    version_starts: list[int] = msgspec.field(default_factory=list)
    versions: list[int] = msgspec.field(default_factory=list)
    engine: str = ""  # who produced it: an engine's name, "script", "replay"


def turn_generated(
    gen: Generation,
    *,
    run_id: str,
    episode_id: str,
    turn: int,
    prompt: list[int],
    previous_end: list[int],
    actor: TurnActor = TurnActor.STUDENT,
    engine: str | None = None,
    segment: int = 0,
    request_id: str = "",
    choice_index: int = 0,
    request_json: str = "",
) -> TurnGenerated:
    """The one constructor of a turn's event: `gen` answered the whole `prompt`, stored after
    `previous_end` when it extends it; the id derives from (episode_id, turn): a redo is the same.
    """
    prefix_len, new_ids = prompt_split(prompt, previous_end)
    return TurnGenerated(
        run_id=run_id,
        event_id=derive_id(episode_id, "turn", turn),
        episode_id=episode_id,
        turn=turn,
        prompt_ids=new_ids,
        prefix_len=prefix_len,
        output_ids=gen.output_ids,
        logprobs=gen.logprobs,
        weight_version=gen.weight_version,
        finish_reason=gen.finish_reason,
        actor=actor,
        engine=gen.engine if engine is None else engine,
        gen_ms=gen.gen_ms,
        queue_ms=gen.queue_ms,
        version_starts=gen.version_starts,
        versions=gen.versions,
        segment=segment,
        request_id=request_id,
        choice_index=choice_index,
        request_json=request_json,
    )


@runtime_checkable
class Engine(Protocol):
    """A generator of token ids: ids in, ids + logprobs + weight version out. Every backend passes
    tests/inference/test_engine_contract.py; implementations must be safe to call concurrently."""

    name: str

    async def generate(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[Generation]: ...

    async def score(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """Logprob of each of `output_ids` given `prompt_ids` (teacher scoring, OPD)."""

    async def load_weights(self, path: str, version: int) -> None:
        """Load a safetensors checkpoint; later tokens carry `version`."""

    @property
    def weight_version(self) -> int: ...

    async def close(self) -> None: ...


@runtime_checkable
class LoadsState(Protocol):
    """An Engine capability: load weights from an in-memory state dict (no file read)."""

    async def load_state(self, state: Mapping[str, torch.Tensor], version: int) -> None: ...


@runtime_checkable
class LoadsAdapter(Protocol):
    """An Engine capability: serve the base model + a LoRA adapter (a PEFT adapter directory;
    `state`, when given, its tensors in memory). Each load replaces the previous adapter."""

    async def load_adapter(
        self, path: str, version: int, state: Mapping[str, torch.Tensor] | None = None
    ) -> None: ...


class ChatTokenizer(Protocol):
    """What STACX needs of a (Hugging Face) tokenizer: its chat template (rendered to text), EOS id,
    encode, decode, and a call that can split special-token text."""

    chat_template: str | None
    eos_token_id: int | None

    def apply_chat_template(
        self, conversation: Sequence[Mapping[str, object]], **kwargs: object
    ) -> str: ...

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...

    def __call__(
        self, text: str, *, add_special_tokens: bool = ..., split_special_tokens: bool = ...
    ) -> dict[str, list[int]]: ...


class GenerationDelta(msgspec.Struct, frozen=True, kw_only=True):
    """Part of a streamed generation: prompt `index`'s ids since its previous delta; the last delta
    also carries the whole `generation`."""

    index: int
    output_ids: list[int]
    logprobs: list[float] | None = None
    generation: Generation | None = None


@runtime_checkable
class StreamsGenerations(Protocol):
    """An Engine capability: `generate` with each prompt's new ids handed over as produced, same
    results; leaving the iterator early aborts the unfinished prompts."""

    def generate_stream(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> AsyncGenerator[GenerationDelta, None]: ...


class WeightOffer(Protocol):
    """The trainer's side of the in-process weight handoff: a snapshot it will never modify."""

    def offer(self, path: str, sha256: str, state: Mapping[str, torch.Tensor]) -> None: ...


# ---- environment engine -----------------------------------------------------------------------


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None  # None when the command was killed (timeout) before it exited
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_ms: float = 0.0
    truncated: bool = False  # output was longer than the cap; the kept part ends with a marker
    oom_killed: bool = False
    pids_limited: bool = False  # a fork was refused by the pids limit (the command was killed)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """A sandbox's limits (the task's [environment], STACX's pids), enforced by every backend."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 1024
    allow_internet: bool = True
    storage_mb: int | None = None  # applied only where the storage driver supports quotas
    env: dict[str, str] = msgspec.field(default_factory=dict)
    workdir: str | None = None  # every command's default cwd; None: the image's WORKDIR
    # host directory -> container directory, bind-mounted read-write (an installed scaffold's
    # gateway socket, stacx.sandbox.layers); also a compose volume: Docker volume name or host
    # path -> container directory, ":ro" appended when read-only (Docker's Binds form); Docker only
    mounts: dict[str, str] = msgspec.field(default_factory=dict)
    # Privileges beyond the hardened default (stacx.sandbox.docker): from a task's
    # [environment.stacx] (StacxEnvironment); Docker only (compose services get the default)
    cap_add: list[str] = msgspec.field(default_factory=list)
    new_privileges: bool = False  # setuid binaries (sudo) work: no `no-new-privileges`
    read_only_root: bool = False  # the root filesystem is read-only (/tmp, /logs stay writable)


class Sandbox(Protocol):
    """A place where an agent's actions run, with limits; backends pass
    tests/sandbox/test_sandbox_contract.py. Not a security boundary against a determined attacker on
    a shared kernel: it contains the failures an agent causes by accident (fork bombs, runaway
    memory, loops, output floods, forbidden network use)."""

    id: str

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None: ...

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None: ...

    async def close(self) -> None: ...


# ---- rollout ----------------------------------------------------------------------------------


class InfraFailure(Exception):
    """An infrastructure failure of one attempt (never a score), recorded as InfraFailed; not
    `retryable` when `final` or caused by a ConfigCausedError."""

    def __init__(self, kind: FailureKind, message: str, *, final: bool = False) -> None:
        message = plain_text(message)
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.final = final

    @property
    def retryable(self) -> bool:
        return not self.final and not isinstance(self.__cause__, ConfigCausedError)

    def signature(self) -> str:
        """What two image builds that failed the same way share: the message's first line with its
        ids blanked; "" for other kinds (they keep their retries)."""
        if self.kind != FailureKind.IMAGE_BUILD:
            return ""
        first = self.message.strip().split("\n", 1)[0]
        return f"{self.kind}: " + _HEX_ID.sub("<id>", first)


_HEX_ID = re.compile(r"\b[0-9a-f]{12,64}\b")


class StepFailed(InfraFailure):
    """A step of a multi-step task could not start (setup.sh, healthcheck): no later step runs,
    those that ran are scored; `verified`: the previous step's verdict. Else a START InfraFailure.
    """

    def __init__(
        self, step: str, exception_type: str, message: str, verified: Verdict | None = None
    ) -> None:
        super().__init__(FailureKind.START, f"step {step!r}: {message}")
        self.step = step
        self.exception_type = exception_type
        self.step_message = message
        self.verified = verified


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    reward: float
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    verifier_ms: float = 0.0
    output: str = ""  # the tail of the verifier's own stdout+stderr


class Environments(Protocol):
    """Where episodes run. Adapters raise InfraFailure with the right FailureKind."""

    def task(self, path: str) -> Task:
        """The task at `path` (as TaskScheduled.task_path names it); a TaskError if unreadable."""

    def sandbox(self, task: Task, *, episode_id: str) -> AbstractAsyncContextManager[Sandbox]:
        """A started sandbox for `task`, released (or recycled) on exit."""

    async def verify(self, sandbox: Sandbox, task: Task, *, episode_id: str) -> Verdict:
        """Run the task's verifier in `sandbox` after the agent finished."""


class AgentResult(msgspec.Struct, frozen=True, kw_only=True):
    stop_reason: StopReason
    n_turns: int
    transcript_ids: list[int]  # the last prompt (or prompt + output when the episode ended)


class Agent(Protocol):
    """One episode's agent, acting in a started sandbox until it stops; what raises is
    infrastructure, its own failures are a StopReason or an observation."""

    async def run(
        self, *, run_id: str, episode_id: str, instruction: str, sandbox: Sandbox, emit: Emit
    ) -> AgentResult: ...


MakeAgent = Callable[[Task, int], Agent]
"""(task, sample_index) -> the agent of one episode (fresh per episode: scripts are stateful)."""
