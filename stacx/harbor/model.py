"""The Harbor task model: task.toml (schema 1.x) as frozen Structs, and `Task`, one loaded task.
Data only (no I/O but `Path` arithmetic) and nothing heavy to import, so stacx.ports can speak it.
Loading is stacx.harbor.tasks; running is stacx.sandbox's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import msgspec

from stacx.errors import TaskError
from stacx.rubric import Rubric


class Healthcheck(msgspec.Struct, kw_only=True, frozen=True):
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class MCPServer(msgspec.Struct, kw_only=True, frozen=True):
    """[[environment.mcp_servers]]: kept and reported (no STACX agent talks MCP)."""

    name: str
    transport: str = "sse"  # "stdio" | "sse" | "streamable-http"
    url: str | None = None
    command: str | None = None
    args: list[str] = msgspec.field(default_factory=list)


class ArtifactConfig(msgspec.Struct, kw_only=True, frozen=True):
    """An `artifacts` entry: a path in the agent's container, copied out after the agent."""

    source: str
    destination: str | None = None
    exclude: list[str] = msgspec.field(default_factory=list)
    service: str | None = None


class StacxVerifier(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """``[verifier.stacx]``, a STACX extension: ``rubric``, a rubric file (stacx.rubric) relative
    to the task directory, scored by the recipe's judge and combined with the verifier's reward."""

    rubric: str | None = None


class VerifierConfig(msgspec.Struct, kw_only=True, frozen=True):
    timeout_sec: float = 600.0
    env: dict[str, str] = msgspec.field(default_factory=dict)
    user: str | int | None = None
    network_mode: str | None = None  # a phase override of environment.network_mode
    allowed_hosts: list[str] | None = None
    environment_mode: str | None = None  # "shared" | "separate"; None: separate iff environment
    environment: EnvironmentConfig | None = None  # the separate verifier's own environment
    stacx: StacxVerifier = msgspec.field(default_factory=StacxVerifier)


class AgentConfig(msgspec.Struct, kw_only=True, frozen=True):
    """task.toml's [agent] table (not the agent loop's settings: stacx.agents.loop.AgentConfig)."""

    timeout_sec: float | None = None
    user: str | int | None = None
    network_mode: str | None = None  # a phase override of environment.network_mode
    allowed_hosts: list[str] | None = None


class SolutionConfig(msgspec.Struct, kw_only=True, frozen=True):
    env: dict[str, str] = msgspec.field(default_factory=dict)


class StacxEnvironment(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """``[environment.stacx]``, a STACX extension: a task asks for more privilege than the
    hardened sandbox gives, or less (`stacx tasks check` lists those asking for more)."""

    cap_add: list[str] = msgspec.field(default_factory=list)  # e.g. ["NET_RAW"] for ping
    new_privileges: bool = False  # true: setuid binaries such as sudo work for a non-root user
    read_only_root: bool = False  # true: the container's root filesystem is read-only


class EnvironmentConfig(msgspec.Struct, kw_only=True, frozen=True):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    gpus: int = 0
    gpu_types: list[str] | None = None
    allow_internet: bool = True
    env: dict[str, str] = msgspec.field(default_factory=dict)
    healthcheck: Healthcheck | None = None
    skills_dir: str | None = None
    # "public" | "no-network" | "allowlist"; None: from the deprecated allow_internet
    network_mode: str | None = None
    allowed_hosts: list[str] | None = None
    workdir: str | None = None  # overrides the image's WORKDIR for every command
    os: str = "linux"
    mcp_servers: list[MCPServer] = msgspec.field(default_factory=list)
    tpu: dict[str, object] | None = None
    stacx: StacxEnvironment = msgspec.field(default_factory=StacxEnvironment)


class PackageInfo(msgspec.Struct, kw_only=True, frozen=True):
    name: str = ""
    description: str = ""
    keywords: list[str] = msgspec.field(default_factory=list)
    version: str | None = None
    authors: list[dict[str, object]] = msgspec.field(default_factory=list)


class StepConfig(msgspec.Struct, kw_only=True, frozen=True):
    """One [[steps]] entry of a multi-step task (files under steps/<name>/)."""

    name: str
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    verifier: VerifierConfig = msgspec.field(default_factory=VerifierConfig)
    min_reward: float | dict[str, float] | None = None
    healthcheck: Healthcheck | None = None
    artifacts: list[str | ArtifactConfig] = msgspec.field(default_factory=list)


class TaskConfig(msgspec.Struct, kw_only=True, frozen=True):
    schema_version: str = "1.0"
    task: PackageInfo | None = None
    metadata: dict[str, object] = msgspec.field(default_factory=dict)
    verifier: VerifierConfig = msgspec.field(default_factory=VerifierConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    environment: EnvironmentConfig = msgspec.field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = msgspec.field(default_factory=SolutionConfig)
    source: str | None = None
    multi_step_reward_strategy: str | None = None  # "mean" (default) | "final"
    steps: list[StepConfig] | None = None
    artifacts: list[str | ArtifactConfig] = msgspec.field(default_factory=list)


class Task(msgspec.Struct, kw_only=True, frozen=True):
    """One Harbor task, as `stacx tasks prepare` writes it. A multi-step task's step is a Task
    too (`step` set, the step's instruction, tests and solution under steps/<step>/)."""

    task_id: str
    path: str  # absolute path of the task directory
    instruction: str
    config: TaskConfig
    unknown: dict[str, object] = msgspec.field(default_factory=dict)  # dotted key -> value
    has_solution: bool = False
    step: str | None = None  # set on the view of one step of a multi-step task
    notes: list[str] = msgspec.field(default_factory=list)  # keys reported as not honoured
    step_tasks: list[Task] = msgspec.field(default_factory=list)  # a multi-step task's steps
    rubric: Rubric | None = None  # [verifier.stacx] rubric, parsed at load (stacx.rubric)

    @property
    def dir(self) -> Path:
        return Path(self.path)

    @property
    def _files(self) -> Path:
        return self.dir / "steps" / self.step if self.step else self.dir

    @property
    def environment_dir(self) -> Path:
        return self.dir / "environment"

    @property
    def tests_dir(self) -> Path:
        own = self._files / "tests"
        return own if not self.step or own.is_dir() else self.dir / "tests"

    @property
    def solution_dir(self) -> Path:
        return self._files / "solution"

    def step_passes(self, name: str, verdict: Scored) -> bool:
        """Whether the steps after step `name` run: its min_reward (a float gates `reward`, a
        table each key it names; a missing key fails)."""
        config = next(s for s in self.config.steps or [] if s.name == name)
        gate = config.min_reward
        if gate is None:
            return True
        got = {"reward": verdict.reward, **verdict.metrics}
        gates = {"reward": gate} if isinstance(gate, int | float) else gate
        return all(got.get(k, float("-inf")) >= x for k, x in gates.items())


class Scored(Protocol):
    """What a step's gate reads of a verdict (`stacx.ports.Verdict`)."""

    @property
    def reward(self) -> float: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


ALL_CAPS = frozenset(
    {
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "AUDIT_WRITE",
        "BLOCK_SUSPEND",
        "BPF",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "IPC_LOCK",
        "IPC_OWNER",
        "KILL",
        "LEASE",
        "LINUX_IMMUTABLE",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "MKNOD",
        "NET_ADMIN",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_RAW",
        "PERFMON",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYSLOG",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_CHROOT",
        "SYS_MODULE",
        "SYS_NICE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "WAKE_ALARM",
    }
)


def check_request(env: StacxEnvironment, where: str) -> None:
    """TaskError naming the key and the accepted values for an unknown capability name."""
    bad = [c for c in env.cap_add if c.upper().removeprefix("CAP_") not in ALL_CAPS]
    if bad:
        raise TaskError(
            f"{where}: environment.stacx.cap_add: {bad} are not Linux capabilities; "
            f"accepted: {', '.join(sorted(ALL_CAPS))}"
        )
