"""The placement plan: which roles a recipe starts (engine, rollout, trainer, teacher), how many,
where, with what resources; the scheduler, recorder, query service, progress and metrics stay in the
launcher. Pure, a function of the recipe only: ``stacx run --dry-run`` prints it on any machine, and
the launcher starts exactly what it printed.
Design: docs/concepts/placement.md
"""

from __future__ import annotations

import msgspec

from stacx.errors import ConfigError
from stacx.launch.recipe import EngineSection, Recipe, Resources
from stacx.train.algorithms import Teacher

ROLES = ("engine", "rollout", "trainer", "teacher")


class RoleSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    builder: str  # "module:function"
    count: int
    resources: Resources
    detail: str = ""  # what runs inside (for the printed plan)


def _engine_detail(engine: EngineSection, model: str, dtype: str) -> str:
    """What the worker starts, with only the settings it passes on."""
    if engine.url:  # a running server: its own settings, none of the recipe's
        return f"{engine.backend} engine at {engine.url} serving {model}"
    where = "in-process" if engine.backend == "torch" else "server started by the worker"
    sglang = engine.backend == "sglang"
    tp = f", tp={engine.tp}, mem_fraction={engine.mem_fraction:g}" if sglang else ""
    return (
        f"{engine.backend} engine ({where}, device={engine.device}, dtype={dtype}, "
        f"max_batch={engine.max_batch}, max_len={engine.max_len}{tp}) serving {model}"
    )


def _teacher_detail(recipe: Recipe) -> str:
    t = recipe.teacher
    kind = "in-process" if t.backend == "torch" else "server"
    where = f"at {t.url}" if t.url else f"{kind}, device={t.device}"
    what = {Teacher.LABEL: "labels visited states", Teacher.SCORE: "scores student tokens"}[
        recipe.algorithm.algo.teacher
    ]
    return f"{t.backend} engine ({where}) serving {t.path or t.url}: {what}"


def _trainer_detail(recipe: Recipe) -> str:
    """What the trainer role runs, with its rank layout (stacx.train.distributed)."""
    t = recipe.trainer
    what = f"{recipe.algorithm.name} on {recipe.model.path}, {t.steps} steps"
    gpus = recipe.placement.trainer.gpus
    on_gpu = gpus > 0 or t.device.startswith("cuda")
    extras = ["activation checkpointing"] if t.activation_checkpointing else []
    extras += ["fp32 master weights"] if t.mixed_precision else []
    if on_gpu and t.fast:
        extras.append(
            "varlen attention" + (" + compile" if t.compile else "") + ", chunked lm_head"
        )
    tail = f"; {', '.join(extras)}" if extras else ""
    if not t.sharded:
        return f"{what}; 1 rank, no FSDP ({'1 GPU' if on_gpu else 'CPU'}){tail}"
    where = "1 GPU each (nccl)" if on_gpu else "CPU (gloo)"
    rank0 = "the trainer actor" + (
        f" in its Ray actor ({gpus:g} GPU{'s' if gpus != 1 else ''}, the ranks' node)"
        if recipe.placement_mode == "ray"
        else ""
    )
    layout = ", ".join(
        [f"rank 0 = {rank0}"]
        + [f"rank {r} = a process it spawns" for r in range(1, min(t.world_size, 3))]
        + ([f"... rank {t.world_size - 1}"] if t.world_size > 3 else [])
    )
    return f"{what}; FSDP2 world_size {t.world_size}, {where}: {layout}{tail}"


def roles_for(recipe: Recipe) -> list[RoleSpec]:
    p = recipe.placement
    engine = (
        f"no engine (scripted agent; the tokenizer of {recipe.model.path} frames its turns)"
        if recipe.scripted_agent
        else _engine_detail(recipe.engine, recipe.model.path, recipe.model.dtype)
    )
    rollout_detail = f"{engine}; {recipe.sandbox.backend} sandboxes x{recipe.sandbox.concurrency}; agent {recipe.agent.name}"
    algo = recipe.algorithm.algo
    if algo.roll_in:
        rollout_detail += (
            f"; beta-mixture roll-in with teacher {recipe.teacher.path or recipe.teacher.url}"
        )
    if algo.branches:
        rollout_detail += "; AggreVaTe branches (replay, explore, teacher finishes, verify)"
    unknown = sorted(set(p.builders) - set(ROLES))
    if unknown:
        raise ConfigError(
            f"placement.builders: unknown role {unknown[0]!r}; accepted: " + ", ".join(ROLES)
        )

    def role(name: str, count: int, resources: Resources, detail: str) -> RoleSpec:
        builder = p.builders.get(name, f"stacx.launch.roles:{name}")
        return RoleSpec(name=name, builder=builder, count=count, resources=resources, detail=detail)

    roles = []
    if served_engine(recipe):
        roles.append(role("engine", 1, p.engine, f"{engine}; HTTP (SGLang's /generate)"))
        rollout_detail = rollout_detail.replace(engine, "a client of the engine role")
    roles.append(role("rollout", p.rollout_workers, p.rollout, rollout_detail))
    if not recipe.is_eval:
        roles.append(role("trainer", 1, p.trainer, _trainer_detail(recipe)))
    if algo.teacher_role:  # else (AggreVaTe) the teacher works in the rollout role
        roles.append(role("teacher", 1, p.teacher, _teacher_detail(recipe)))
    return roles


def served_engine(recipe: Recipe) -> bool:
    """Whether the student engine is a role of its own (``processes`` or ``ray`` placement, the
    torch engine, a model that generates), served to the rollout workers over HTTP."""
    return (
        recipe.placement_mode in ("processes", "ray")
        and recipe.engine.backend == "torch"
        and not recipe.scripted_agent
    )


def describe(recipe: Recipe, roles: list[RoleSpec]) -> list[tuple[str, str, str, str, str]]:
    """Rows (role, count, cpus each, gpus each, what runs) of the printed plan, control plane first."""
    p = recipe.placement
    where = {
        "local": "launcher process",
        "processes": "a process of its own",
        "ray": f"Ray actor ({p.ray_address or 'local cluster'})",
    }[recipe.placement_mode]
    service = ", SQL query service for the roles' processes" if where != "launcher process" else ""
    control = f"launcher process: NATS, DuckDB recorder, scheduler, progress, metrics{service}"
    rows = [("scheduler+recorder", "1", "-", "-", control)]
    rows += [
        (
            r.name,
            str(r.count),
            f"{r.resources.cpus:g}",
            f"{r.resources.gpus:g}",
            f"{where}: {r.detail}",
        )
        for r in roles
    ]
    cpus = sum(r.count * r.resources.cpus for r in roles)
    gpus = sum(r.count * r.resources.gpus for r in roles)
    rows.append(("total", "", f"{cpus:g}", f"{gpus:g}", ""))
    return rows
