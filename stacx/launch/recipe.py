"""The recipe: one frozen, validated Struct tree that describes a whole run (train or eval), with
every key defaulted and unknown keys forbidden; ``cross_check`` rejects, at every construction, what
the chosen path does not honour. The field comments and section docstrings here are the recipe
reference (``tools/gen_docs.py`` builds docs/reference/recipe.md from them).
Design: docs/recipes.md
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

from stacx.agents.scaffold_spec import ScaffoldSpec, checked, resolve
from stacx.errors import ConfigError, TaskError
from stacx.imitation.config import ImitationConfig, TeacherConfig
from stacx.rubric import Rubric, load_rubric
from stacx.train import algorithms
from stacx.train.algorithms import Algorithm, Teacher
from stacx.train.config import TrainerConfig


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every section: frozen, keyword-only, unknown keys are errors."""


Device = Literal["cpu", "cuda", "auto"]
DType = Literal["float32", "bfloat16", "float16", "auto"]


class ModelSection(_Section, frozen=True):
    # "default" (bundled SmolLM2-135M), a local HF dir, or a hub id in the cache
    path: str = "default"
    dtype: DType = "auto"  # auto: float32 on CPU, bfloat16 on GPU


class EngineSection(_Section, frozen=True):
    """An inference backend. ``torch`` runs in the worker's process; ``sglang`` starts (or,
    with ``url``, uses) an SGLang server; ``openai`` calls an OpenAI-compatible server.

    A server the worker starts gets every setting below (SGLang: ``--device``,
    ``--max-running-requests``, ``--context-length``, ``--tp``, ``--mem-fraction-static``, and
    ``model.dtype`` as ``--dtype``); a server at ``url`` was started with its own, so setting
    them beside ``url`` is an error at load (see :func:`cross_check`)."""

    backend: Literal["torch", "sglang", "openai"] = "torch"
    device: Device = "auto"
    url: str = ""  # an already running server (sglang/openai); empty: start one
    max_batch: int = 8  # sequences decoded at once (sglang --max-running-requests)
    max_len: int = 8192  # prompt + output tokens (sglang --context-length)
    tp: int = 1  # tensor parallel degree (sglang only): GPUs per engine
    mem_fraction: float = 0.85  # sglang only: --mem-fraction-static
    # torch only: one cache row of max_len per request, or a pool of blocks shared between
    # prefixes, with admission control and preemption when full (stacx.inference.kv_plan)
    kv_cache: Literal["slots", "paged"] = "slots"


class SandboxSection(_Section, frozen=True):
    # process: image-less tasks in a temp dir with rlimits, no Docker (stacx.sandbox.process)
    # remote: sandboxes held by `stacx sandbox serve` services on NATS (stacx.sandbox.remote)
    backend: Literal["docker", "process", "remote"] = "docker"
    url: str = ""  # remote: the NATS server(s) the services listen on; empty: $STACX_NATS_URL
    warm: int = 0  # ready containers kept per image (hides start latency)
    max_attempts: int = 3  # attempts per sample on infrastructure failures
    concurrency: int = 2  # episodes at once, per rollout worker
    # image alias file (TOML/JSON, see stacx.sandbox.aliases); empty: $STACX_IMAGE_ALIASES
    aliases: str = ""
    # OCI runtime of the docker backend's containers: runc (Docker's) or runsc (gVisor, a
    # kernel of its own; needs it installed and registered with the Docker daemon). remote:
    # each service's `stacx sandbox serve --runtime` decides
    runtime: Literal["runc", "runsc"] = "runc"


class TasksSection(_Section, frozen=True):
    # a bundled set name (recipes/tasks/<name>), a task dir, a dir of tasks, a .jsonl
    path: str = "basic"
    include: list[str] = []  # only these task ids or fnmatch patterns (empty: all)
    exclude: list[str] = []
    difficulty: list[str] = []  # only tasks whose metadata.difficulty is one of these
    limit: int | None = None  # only the first N (after the filters above)
    per_iteration: int = 4  # tasks scheduled per iteration (eval: ignored, every task once)
    group_size: int = 4  # samples per task (GRPO's group; eval's k)
    seed: int = 0  # which tasks each iteration draws (deterministic, so resume redraws the same)
    max_iterations: int = 0  # cap on rollout iterations (0: 4 x trainer.steps); see scheduler


PYTHON_AGENTS = ("retool", "mle")  # agents that run ```python blocks (agent.format = "python")


class AgentSection(_Section, frozen=True):
    # retool: math reasoning with Python runs and a \boxed{} answer (stacx.agents.retool)
    # installed: a black-box scaffold from PyPI in the task container, through the model gateway
    # (stacx.agents.installed); which one is `scaffold`
    # mle: tabular ML engineering, Python runs then SUBMIT (stacx.agents.mle)
    name: Literal["swe", "oracle", "null", "retool", "mle", "installed"] = "swe"
    # agent.name = "installed": a shipped scaffold (stacx/agents/scaffolds/) or a spec file (.toml)
    scaffold: str = ""
    # ... or the spec itself, inline: [agent.scaffold_spec] (stacx.agents.scaffold_spec's keys)
    scaffold_spec: ScaffoldSpec | None = None
    max_turns: int = 4
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    # tool_call: <tool_call> JSON, all tools; bash: one prefilled ```bash block per reply
    # (what a 135M model can do); see stacx.agents.formats; python: ```python blocks (retool)
    format: Literal["tool_call", "bash", "python"] = "tool_call"
    context_budget: int = 8192
    episode_timeout_s: float | None = None  # None: each task's agent.timeout_sec
    seed: int | None = None


class EvalSection(_Section, frozen=True):
    """Periodic evaluation during training: every `every` weight versions (and at the last one),
    `samples` samples of each task of the eval set, run by the run's own [agent] on exactly that
    version, recorded in the same log as TaskScheduled.role = "eval" (never trained on; the
    `eval_curve` view, `episodes.role`). The task set is [tasks]'s unless `path` is set; the
    filters apply to it like [tasks]'s."""

    every: int = 0  # weight versions between evals; 0: no periodic eval
    at_start: bool = True  # also evaluate version 0 (the starting weights)
    samples: int = 1
    path: str = ""  # "": tasks.path
    include: list[str] = []
    exclude: list[str] = []
    difficulty: list[str] = []
    limit: int | None = None


class JudgeSection(_Section, frozen=True):
    """The judge model of rubric rewards (``stacx.rubric``, ``stacx.judge``): which Engine scores
    the tasks that declare a rubric (``[verifier.stacx] rubric`` in their task.toml), and
    ``rubric``, a rubric for every task of the set that declares none."""

    # own: the engine this section describes (`path` for torch or sglang, `url` for an
    # OpenAI-compatible or running SGLang server); teacher: an engine of [teacher]'s settings;
    # student: the rollout worker's own engine, on whatever weights it serves; off: rubrics are not
    # scored, the reward is the verifier's alone (what `stacx tasks check` does). No judge (the
    # default: own with neither path nor url): a task with a rubric fails as an infrastructure
    # failure (judge), never silently unjudged
    use: Literal["own", "teacher", "student", "off"] = "own"
    path: str = ""  # "default" (the bundled SmolLM2-135M), a local HF dir, or a hub id
    name: str = "judge"  # recorded in JudgeScored.judge
    backend: Literal["torch", "sglang", "openai"] = "torch"
    device: Device = "auto"
    dtype: DType = "auto"
    url: str = ""
    max_batch: int = 8
    max_len: int = 8192
    # a rubric file for the tasks that declare none: a path, or one relative to the task set
    rubric: str = ""

    @property
    def enabled(self) -> bool:
        return self.use not in ("own", "off") or bool(self.path or self.url)


class AlgorithmSection(_Section, frozen=True):
    """What is trained, and how rollouts and training interleave. DAgger, AggreVaTe and OPD
    read ``[algorithm.imitation]`` (``stacx.imitation.config.ImitationConfig``: beta schedule,
    branches, ...); its ``name`` and ``iterations`` are derived (algorithm.name, trainer.steps)."""

    name: str = "grpo"  # a module of stacx.train.algorithms (grpo, sft, opd, dagger, ...)
    mode: Literal["sync", "async"] = "sync"  # sync: iteration k+1 after version k+1 is published
    max_staleness: int = 1  # async: iterations scheduled at most this many versions ahead
    imitation: ImitationConfig = ImitationConfig()

    def __post_init__(self) -> None:
        algorithms.get(self.name)  # an unknown name fails here, naming the accepted ones

    @property
    def algo(self) -> Algorithm:
        """The algorithm's module object: what it needs of the launcher."""
        return algorithms.get(self.name)


class Resources(_Section, frozen=True):
    """What one actor of a role asks of the placement (Ray's num_cpus / num_gpus)."""

    cpus: float = 1.0
    gpus: float = 0.0


class PlacementSection(_Section, frozen=True):
    # auto: "processes" when the engine or the trainer is on a GPU (nothing forks a CUDA
    # process; the engine serves every rollout worker), else "local" (one process: the CPU
    # quickstart's fastest); see stacx.launch.placement
    mode: Literal["auto", "local", "processes", "ray"] = "auto"
    ray_address: str = ""  # empty: start a local Ray cluster; "auto" or an address: join one
    ray_num_cpus: int | None = None  # a local cluster's size (None: Ray's default)
    rollout_workers: int = 1
    rollout: Resources = Resources(cpus=1.0)  # each rollout worker
    engine: Resources = Resources(cpus=1.0)  # the engine role (mode "processes")
    trainer: Resources = Resources(cpus=1.0)  # the trainer role
    teacher: Resources = Resources(cpus=1.0)  # the teacher role
    # The memory split of one GPU shared by the torch engine and the trainer (stacx.launch.memory):
    # the engine's KV cache in GiB (it sizes its cache to it) and the trainer's share in GiB
    # (checked, not enforced: one process, one caching allocator); 0: no declared split
    engine_cache_gib: float = 0.0
    trainer_gib: float = 0.0
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
    # the student checkpoint (every engine of the student loads it)
    model: ModelSection = ModelSection()
    engine: EngineSection = EngineSection()  # the student's inference backend and where it runs
    sandbox: SandboxSection = SandboxSection()  # the environment engine (Docker)
    # the task set, tasks per iteration and group size (GRPO's n)
    tasks: TasksSection = TasksSection()
    agent: AgentSection = AgentSection()  # the SWE agent loop's limits and sampling
    # what is trained (a module of ``stacx.train.algorithms``: sft, grpo, rloo, opd, dagger,
    # aggrevate) or ``eval``; sync/async
    algorithm: AlgorithmSection = AlgorithmSection()
    # periodic evaluation during training (every N weight versions, a task set)
    eval: EvalSection = EvalSection()
    trainer: TrainerConfig = TrainerConfig()  # the trainer actor's own config (see loader.derive)
    teacher: TeacherConfig = TeacherConfig()  # the imitation engine's own config
    # the judge model that scores rubrics (``stacx.rubric``), and a task set's rubric
    judge: JudgeSection = JudgeSection()
    # local (asyncio, one process) or ray; workers and resources per actor
    placement: PlacementSection = PlacementSection()
    logging: LoggingSection = LoggingSection()  # progress display, TensorBoard, Weights & Biases

    def __post_init__(self) -> None:
        cross_check(self)

    @property
    def is_eval(self) -> bool:
        return not self.algorithm.algo.trains

    @property
    def placement_mode(self) -> Literal["local", "processes", "ray"]:
        """``placement.mode`` with "auto" resolved: "processes" when the engine or the trainer runs
        on a GPU (named, or "auto" on a machine with an NVIDIA device), else "local"."""
        mode = self.placement.mode
        if mode != "auto":
            return mode
        devices = [self.engine.device] + ([] if self.is_eval else [self.trainer.device])
        named = any(d.startswith("cuda") for d in devices)
        auto = any(d == "auto" for d in devices) and _nvidia_device()
        gpus = self.placement.trainer.gpus > 0 and not self.is_eval
        return "processes" if named or auto or gpus else "local"

    @property
    def needs_teacher(self) -> bool:
        return self.algorithm.algo.teacher != Teacher.NONE

    @property
    def scripted_agent(self) -> bool:
        """The agent is a script (oracle, null): no model generates, so no engine is started."""
        return self.agent.name in SCRIPTED_AGENTS


SCRIPTED_AGENTS = ("oracle", "null")


def _without(flag: str) -> str:
    """The algorithms whose `flag` is off (what an error suggests instead)."""
    return ", ".join(n for n, a in algorithms.ALGORITHMS.items() if not getattr(a, flag))


def _eval_problems(r: Recipe) -> Iterator[str]:
    ev = r.eval
    if ev.every < 0 or ev.samples < 1:
        yield (
            f"eval.every = {ev.every}, eval.samples = {ev.samples}: need every >= 0, samples >= 1"
        )
    if ev.every == 0:
        if ev != EvalSection():
            yield "[eval]: set eval.every (weight versions between evals) to evaluate"
        return
    if r.is_eval:
        yield (
            "eval.every: periodic eval is for training runs (algorithm.name = 'eval' "
            "already evaluates every task)"
        )
    if r.algorithm.algo.roll_in:
        yield (
            f"eval.every with algorithm.name = {r.algorithm.name!r}: not supported (its roll-in "
            f"workers mix teacher turns into every episode); use {_without('roll_in')}"
        )


def _installed_problems(r: Recipe) -> Iterator[str]:
    """What an installed scaffold honours: its name, the docker backend, some [agent] keys."""
    a = r.agent
    if a.name != "installed":
        if a.scaffold or a.scaffold_spec is not None:
            key = "agent.scaffold" + ("" if a.scaffold else "_spec")
            yield f"{key}: used by agent.name = 'installed' only"
        return
    try:
        scaffold_of(a)  # a shipped name, a spec file or an inline spec, read and checked
    except ConfigError as exc:
        yield str(exc)
    if r.sandbox.backend != "docker":
        yield (
            f"sandbox.backend = {r.sandbox.backend!r}: an installed scaffold runs in a local "
            "Docker container (its gateway socket is bind-mounted); use 'docker'"
        )
    if not r.algorithm.algo.installed_agents:
        accepted = ", ".join(n for n, a in algorithms.ALGORITHMS.items() if a.installed_agents)
        yield (
            f"algorithm.name = {r.algorithm.name!r} with agent.name = 'installed': accepted: "
            f"{accepted}"
        )
    if a.format != AgentSection().format or a.seed is not None:
        yield (
            "agent.format / agent.seed: not used by an installed scaffold (it writes its own "
            "prompts and calls); remove them"
        )


def _judge_problems(r: Recipe) -> Iterator[str]:
    """What [judge] needs: an engine for a rubric, the engine it names, a rubric that parses."""
    j = r.judge
    if j.use != "own" and (j.path or j.url):
        yield f"judge.path / judge.url: not used with judge.use = {j.use!r}; remove them"
    if j.use == "teacher" and not (r.teacher.path or r.teacher.url):
        yield "judge.use = 'teacher': needs teacher.path or teacher.url"
    if j.use == "student" and r.scripted_agent:
        yield f"judge.use = 'student': agent.name = {r.agent.name!r} runs no model"
    if j.use == "own" and j.enabled:
        if j.backend == "openai" and not (j.path and j.url):
            yield (
                "judge.path, judge.url: backend 'openai' needs both (the model, whose "
                "tokenizer frames the prompt, and the server)"
            )
        if j.backend == "torch" and j.url:
            yield "judge.url: backend 'torch' runs in the worker's process; set judge.path"
        if j.backend == "sglang" and not j.path:
            yield "judge.path: backend 'sglang' needs the model (its tokenizer)"
    if j.enabled and r.algorithm.algo.roll_in:
        yield (
            f"[judge] with algorithm.name = {r.algorithm.name!r}: not supported (its "
            f"roll-in and branch episodes are not judged); use {_without('roll_in')}"
        )
    if j.rubric and not j.enabled:
        yield "judge.rubric: needs a judge model: set judge.path, judge.url or judge.use"
    try:
        recipe_rubric(r)
    except ConfigError as exc:
        yield str(exc)


def scaffold_of(agent: AgentSection) -> ScaffoldSpec:
    """The installed scaffold's spec: `agent.scaffold_spec`, or `agent.scaffold` (name or file)."""
    if agent.scaffold_spec is None:
        return resolve(agent.scaffold)
    if agent.scaffold:
        raise ConfigError(
            f"agent.scaffold = {agent.scaffold!r} and agent.scaffold_spec: one "
            "or the other; remove one"
        )
    return checked(agent.scaffold_spec, "agent.scaffold_spec")


def cross_check(recipe: Recipe) -> None:
    """Reject what the path does not honour, or a combination that cannot work. Pure; every problem
    (``key.path = value: why``) is reported at once."""
    problems = list(_problems(recipe))
    if problems:
        raise ConfigError("; ".join(problems))


def _problems(r: Recipe) -> Iterator[str]:
    algo = r.algorithm.name
    try:
        algorithms.algorithm_for(r.trainer)  # the trainer keys whose values the algorithm decides
    except ConfigError as e:
        yield str(e)
    gpus, world = r.placement.trainer.gpus, r.trainer.world_size
    if gpus > 0 and gpus != world:
        yield (
            f"placement.trainer.gpus = {gpus:g} with trainer.world_size = {world}: the trainer "
            f"runs one rank per GPU (stacx.train.distributed); set both to the same number "
            "(gpus = 0: ranks on CPU or on the launcher's GPUs)"
        )
    if r.trainer.background_checkpoint and (
        r.placement_mode == "ray" or r.engine.backend != "torch"
    ):
        yield (
            "trainer.background_checkpoint = true: needs placement.mode 'local' or 'processes' "
            "and engine.backend = 'torch' (the engine must take each version from the "
            "trainer's memory, or the node's shared memory, before its file exists; here "
            f"placement.mode = {r.placement_mode!r}, engine.backend = {r.engine.backend!r})"
        )
    yield from _split_problems(r)
    if _sglang_partial_sync(r):
        yield (
            f"trainer.trainable = {r.trainer.trainable!r} with engine.backend = 'sglang': "
            "checkpoints would hold only the trained tensors, and SGLang's "
            "update_weights_from_disk loads full model directories (train every parameter)"
        )
    # a scripted agent's episodes serve demonstrations (sft) and floors/checks (eval); the
    # others learn from the student's own samples, so an oracle or null agent would starve them
    if r.scripted_agent and not r.algorithm.algo.scripted_agents:
        yield (
            f"agent.name = {r.agent.name!r}: a scripted agent's episodes serve sft "
            f"(demonstrations) or eval only; {algo} learns from the student's own samples, "
            "so its trainer would starve (use agent.name = 'swe')"
        )
    yield from _agent_problems(r)
    yield from _installed_problems(r)
    yield from _eval_problems(r)
    yield from _judge_problems(r)
    if r.needs_teacher and not (r.teacher.path or r.teacher.url):
        yield f"teacher.path: algorithm.name = {algo!r} needs teacher.path or teacher.url"
    yield from _engine_problems(r)
    yield from _sandbox_problems(r)


def _agent_problems(r: Recipe) -> Iterator[str]:
    """The agent's format against its name, and retool with the imitation algorithms."""
    algo = r.algorithm.name
    a = r.agent
    if a.format == "python" and a.name not in PYTHON_AGENTS:
        yield "agent.format = 'python': the retool and mle agents' format (use tool_call or bash)"
    if a.name in PYTHON_AGENTS and a.format == "bash":
        yield f"agent.format = 'bash': the {a.name} agent runs python (use python or tool_call)"
    if a.name in PYTHON_AGENTS and r.algorithm.algo.roll_in:
        yield (
            f"agent.name = {a.name!r} with algorithm.name = {algo!r}: the imitation roll-ins "
            f"run the SWE agent only (use {_without('roll_in')})"
        )


def _engine_problems(r: Recipe) -> Iterator[str]:
    """The engine's backend against its keys (sglang-only keys, a server's own settings)."""
    algo = r.algorithm.name
    e, defaults = r.engine, EngineSection()
    if e.backend == "openai" and not e.url:
        yield "engine.url: backend 'openai' needs the url of an OpenAI-compatible server"
    if e.backend == "openai" and not r.is_eval and not r.scripted_agent:
        yield (
            f"engine.backend = 'openai' with algorithm.name = {algo!r}: an OpenAI-compatible "
            "server cannot load trained weights; use backend 'torch' or 'sglang'"
        )
    if e.backend == "torch":
        for key in ("tp", "mem_fraction"):
            if getattr(e, key) != getattr(defaults, key):
                yield (
                    f"engine.{key} = {getattr(e, key)!r}: sglang only (the torch engine runs "
                    "on one device of the worker's process)"
                )
    elif e.kv_cache != defaults.kv_cache:
        yield f"engine.kv_cache = {e.kv_cache!r}: torch only (an SGLang server pages its own cache)"
    if e.backend != "torch" and (e.url or e.backend == "openai"):
        fixed = {f"engine.{k}": (getattr(e, k), getattr(defaults, k)) for k in _SERVER_KEYS}
        fixed["model.dtype"] = (r.model.dtype, ModelSection().dtype)
        for key, (value, default) in fixed.items():
            if value != default:
                yield (
                    f"{key} = {value!r}: not used with engine.url (the server there was "
                    "started with its own settings); remove it"
                )


def _sandbox_problems(r: Recipe) -> Iterator[str]:
    """The sandbox keys that only the remote backend uses, or that it ignores."""
    sb = r.sandbox
    if sb.url and sb.backend != "remote":
        yield f"sandbox.url: used by backend 'remote' only (backend is {sb.backend!r})"
    if sb.backend == "remote" and sb.aliases:
        yield (
            "sandbox.aliases: not used with backend 'remote' (each `stacx sandbox serve` "
            "builds with its own --aliases); remove it"
        )


def _split_problems(r: Recipe) -> Iterator[str]:
    p = r.placement
    for key in ("engine_cache_gib", "trainer_gib"):
        if getattr(p, key) < 0:
            yield f"placement.{key} = {getattr(p, key)!r}: accepted values are GiB >= 0"
    if p.engine_cache_gib > 0 and (r.engine.backend != "torch" or r.engine.device == "cpu"):
        yield (
            f"placement.engine_cache_gib = {p.engine_cache_gib!r}: the torch engine's KV cache "
            f"on a GPU (here engine.backend = {r.engine.backend!r}, engine.device = "
            f"{r.engine.device!r}; SGLang takes engine.mem_fraction)"
        )
    if p.trainer_gib > 0 and (r.is_eval or r.trainer.device == "cpu"):
        yield (
            f"placement.trainer_gib = {p.trainer_gib!r}: the trainer's share of a GPU (here "
            + ("an eval recipe: no trainer)" if r.is_eval else "trainer.device = 'cpu')")
        )


def _sglang_partial_sync(r: Recipe) -> bool:
    lora = r.trainer.lora is not None  # a LoRA version is an adapter: SGLang loads those
    return r.engine.backend == "sglang" and not r.is_eval and bool(r.trainer.trainable) and not lora


_SERVER_KEYS = ("device", "max_batch", "max_len", "tp", "mem_fraction")


def _nvidia_device() -> bool:
    """Whether this machine has an NVIDIA GPU (from its device nodes: no CUDA context is made)."""
    return os.path.exists("/dev/nvidiactl") or bool(glob.glob("/dev/nvidia[0-9]*"))


BUNDLED_TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"


def resolve_tasks(spec: str, *, where: str = "tasks.path") -> Path:
    """A task path (dir, dir of tasks, .jsonl) or a bundled set's name; `where` names it."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    bundled = BUNDLED_TASKS / spec
    if "/" not in spec and bundled.is_dir():
        return bundled
    sets = sorted(p.name for p in BUNDLED_TASKS.glob("*/"))  # "*/": directories only
    raise ConfigError(
        f"{where} {spec!r}: no such file or directory, and not a bundled set "
        f"(bundled: {', '.join(sets) or 'none'})"
    )


def rubric_path(recipe: Recipe) -> Path | None:
    """Where ``judge.rubric`` is: the path as given if it exists, else relative to the task set;
    None when the recipe names none."""
    spec = recipe.judge.rubric
    if not spec:
        return None
    path = Path(spec).expanduser()
    if path.exists():
        return path
    try:
        tasks = resolve_tasks(recipe.tasks.path)
    except ConfigError:
        return path  # the tasks' own error is reported by their check
    beside = (tasks if tasks.is_dir() else tasks.parent) / spec
    return beside if beside.exists() else path


def recipe_rubric(recipe: Recipe) -> Rubric | None:
    """The recipe's rubric, parsed; a ConfigError naming judge.rubric, the file and the key."""
    path = rubric_path(recipe)
    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(f"judge.rubric = {recipe.judge.rubric!r}: no such file")
    try:
        return load_rubric(path)
    except TaskError as exc:
        raise ConfigError(f"judge.rubric: {exc}") from exc
