"""The recipe: one frozen, validated Struct tree that describes a whole run (train or eval).

A recipe file is TOML whose tables are the sections below; every key has a default, so a recipe
states only what differs. ``stacx.launch.loader`` reads the file, applies ``--set`` overrides and
converts it into :class:`Recipe` with unknown keys forbidden, so a typo or a wrong type fails at
load with the key path and what is accepted there.

The resolved recipe (``msgspec.to_builtins(recipe)``) is the run's identity: it is printed,
recorded in ``RunStarted.config_json``, and compared on resume (a different recipe on an
existing run directory is refused with the diff).

Sections and who reads them:

- ``model``      the student checkpoint (every engine of the student loads it)
- ``engine``     the student's inference backend and where it runs
- ``sandbox``    the environment engine (Docker)
- ``tasks``      the task set, tasks per iteration and group size (GRPO's n)
- ``agent``      the SWE agent loop's limits and sampling
- ``algorithm``  what is trained (sft, grpo, dagger, aggrevate, opd) or ``eval``; sync/async
- ``trainer``    optimizer, steps, batches, checkpoints: ``stacx.train.config.TrainerConfig``;
  its algorithm, model, mode and max_staleness are derived from the sections above
- ``teacher``    the frozen teacher (DAgger, AggreVaTe, OPD), its checkpoint and engine
- ``placement``  local (asyncio, one process) or ray; workers and resources per actor
- ``logging``    progress display, TensorBoard, Weights & Biases
"""

from __future__ import annotations

from typing import Literal

import msgspec

from stacx.imitation.config import ImitationConfig, TeacherConfig
from stacx.train.config import TrainerConfig


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every section: frozen, keyword-only, unknown keys are errors."""


Device = Literal["cpu", "cuda", "auto"]
DType = Literal["float32", "bfloat16", "float16", "auto"]


class ModelSection(_Section, frozen=True):
    path: str = (
        "default"  # "default" (bundled SmolLM2-135M), a local HF dir, or a hub id in the cache
    )
    dtype: DType = "auto"  # auto: float32 on CPU, bfloat16 on GPU


class EngineSection(_Section, frozen=True):
    """An inference backend. ``torch`` runs in the worker's process; ``sglang`` starts (or,
    with ``url``, uses) an SGLang server; ``openai`` calls an OpenAI-compatible server."""

    backend: Literal["torch", "sglang", "openai"] = "torch"
    device: Device = "auto"
    url: str = ""  # an already running server (sglang/openai); empty: start one
    max_batch: int = 8
    max_len: int = 8192
    tp: int = 1  # tensor parallel degree (sglang): GPUs per engine
    mem_fraction: float = 0.85  # sglang --mem-fraction-static


class SandboxSection(_Section, frozen=True):
    backend: Literal["docker"] = "docker"
    warm: int = 0  # ready containers kept per image (hides start latency)
    max_attempts: int = 3  # attempts per sample on infrastructure failures
    concurrency: int = 2  # episodes at once, per rollout worker


class TasksSection(_Section, frozen=True):
    path: str = (
        "basic"  # a bundled set name (recipes/tasks/<name>), a task dir, a dir of tasks, a .jsonl
    )
    include: list[str] = []  # only these task ids or fnmatch patterns (empty: all)
    exclude: list[str] = []
    difficulty: list[str] = []  # only tasks whose metadata.difficulty is one of these
    limit: int | None = None  # only the first N (after the filters above)
    per_iteration: int = 4  # tasks scheduled per iteration (eval: ignored, every task once)
    group_size: int = 4  # samples per task (GRPO's group; eval's k)
    seed: int = 0  # which tasks each iteration draws (deterministic, so resume redraws the same)
    max_iterations: int = 0  # cap on rollout iterations (0: 4 x trainer.steps); see scheduler


class AgentSection(_Section, frozen=True):
    name: Literal["swe", "oracle", "null"] = "swe"
    max_turns: int = 4
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    # tool_call: <tool_call> JSON, all tools; bash: one prefilled ```bash block per reply
    # (what a 135M model can do); see stacx.agents.formats
    format: Literal["tool_call", "bash"] = "tool_call"
    context_budget: int = 8192
    episode_timeout_s: float | None = None  # None: each task's agent.timeout_sec
    seed: int | None = None


class AlgorithmSection(_Section, frozen=True):
    """What is trained, and how rollouts and training interleave. DAgger, AggreVaTe and OPD
    read ``[algorithm.imitation]`` (``stacx.imitation.config.ImitationConfig``: beta schedule,
    branches, ...); its ``name`` and ``iterations`` are derived (algorithm.name, trainer.steps)."""

    name: Literal["grpo", "sft", "dagger", "aggrevate", "opd", "eval"] = "grpo"
    mode: Literal["sync", "async"] = "sync"  # sync: iteration k+1 after version k+1 is published
    max_staleness: int = 1  # async: iterations scheduled at most this many versions ahead
    imitation: ImitationConfig = ImitationConfig()


class Resources(_Section, frozen=True):
    """What one actor of a role asks of the placement (Ray's num_cpus / num_gpus)."""

    cpus: float = 1.0
    gpus: float = 0.0


class PlacementSection(_Section, frozen=True):
    mode: Literal["local", "ray"] = "local"
    ray_address: str = ""  # empty: start a local Ray cluster; "auto" or an address: join one
    ray_num_cpus: int | None = None  # a local cluster's size (None: Ray's default)
    rollout_workers: int = 1
    rollout: Resources = Resources(cpus=1.0)
    trainer: Resources = Resources(cpus=1.0)
    teacher: Resources = Resources(cpus=1.0)
    # role -> "module:function" replacing a role's builder (see stacx.launch.plan): the hook for
    # custom rollout workers, trainers or teachers, and for tests' stand-in actors.
    builders: dict[str, str] = {}


class LoggingSection(_Section, frozen=True):
    progress: Literal["auto", "rich", "plain", "off"] = "auto"  # auto: rich on a TTY
    interval_s: float = 2.0  # progress and metrics refresh
    tensorboard: bool = True  # <run_dir>/tb/
    wandb_project: str = "stacx"  # used only when WANDB_API_KEY is set
    plot: bool = True  # write <run_dir>/curves.png at the end


class Recipe(_Section, frozen=True):
    name: str
    description: str = ""
    model: ModelSection = ModelSection()
    engine: EngineSection = EngineSection()
    sandbox: SandboxSection = SandboxSection()
    tasks: TasksSection = TasksSection()
    agent: AgentSection = AgentSection()
    algorithm: AlgorithmSection = AlgorithmSection()
    trainer: TrainerConfig = TrainerConfig()  # the trainer actor's own config (see loader.derive)
    teacher: TeacherConfig = TeacherConfig()  # the imitation engine's own config
    placement: PlacementSection = PlacementSection()
    logging: LoggingSection = LoggingSection()

    @property
    def is_eval(self) -> bool:
        return self.algorithm.name == "eval"

    @property
    def needs_teacher(self) -> bool:
        return self.algorithm.name in ("dagger", "aggrevate", "opd")
