"""Harbor tasks: task.toml (the full schema; unknown keys kept in `Task.unknown`, never fatal),
instruction.md, and task sets (directories, tasks.jsonl, answer-task .jsonl). A wrong type is a
TaskError naming the file and key path; a task that does not load fails alone (`Unloadable`).

Design: docs/tasks.md#the-task-directory
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path

import msgspec

from stacx.errors import TaskError, strict
from stacx.harbor.compose_load import compose_file, load_compose
from stacx.harbor.jsonl_tasks import read_jsonl
from stacx.harbor.model import Task, TaskConfig, VerifierConfig, check_request
from stacx.harbor.task_network import check_allowlist
from stacx.rubric import task_rubric

_SIZE = re.compile(r"^\s*([0-9.]+)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_SCALE_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024, "": 1 / (1024 * 1024)}


def parse_size_mb(value: str, *, where: str) -> int:
    """`"2G"` -> 2048, `"512M"` -> 512 (Harbor's deprecated memory/storage spellings)."""
    m = _SIZE.match(value)
    if not m:
        raise TaskError(f"{where}: size {value!r} is not like '512M' or '2G'")
    return int(float(m.group(1)) * _SCALE_MB[m.group(2).upper()])


def _nested_struct(tp: object) -> type[msgspec.Struct] | None:
    """The Struct a field holds (directly, optionally, or as list items), else None."""
    for t in (tp, *getattr(tp, "__args__", ())):
        if isinstance(t, type) and issubclass(t, msgspec.Struct):
            return t
        inner = getattr(t, "__args__", ())
        if getattr(t, "__origin__", None) is list:
            for item in inner:
                found = _nested_struct(item)
                if found is not None:
                    return found
    return None


def _known_fields(struct: type[msgspec.Struct]) -> dict[str, type[msgspec.Struct] | None]:
    """field name -> nested Struct type (or None for a leaf)."""
    return {f.name: _nested_struct(f.type) for f in msgspec.structs.fields(struct)}


def did_you_mean(path: str) -> str | None:
    """The known key nearest to an unknown dotted `path`'s last part, at the same level, or None."""
    *parents, last = re.sub(r"\[\d+\]", "", path).split(".")
    struct: type[msgspec.Struct] | None = TaskConfig
    for part in parents:
        struct = _known_fields(struct).get(part) if struct is not None else None
    if struct is None:
        return None
    close = difflib.get_close_matches(last, list(_known_fields(struct)), n=1, cutoff=0.7)
    return close[0] if close else None


def _split_unknown(
    raw: dict[str, object], struct: type[msgspec.Struct], prefix: str, unknown: dict[str, object]
) -> dict[str, object]:
    """The part of `raw` that `struct` knows; the rest goes to `unknown` under dotted paths."""
    known = _known_fields(struct)
    kept: dict[str, object] = {}
    for key, value in raw.items():
        nested = known.get(key)
        if key not in known:
            unknown[prefix + key] = value
        elif nested is not None and isinstance(value, dict):
            kept[key] = _split_unknown(value, nested, f"{prefix}{key}.", unknown)
        elif nested is not None and isinstance(value, list):
            kept[key] = [
                _split_unknown(v, nested, f"{prefix}{key}[{i}].", unknown)
                if isinstance(v, dict)
                else v
                for i, v in enumerate(value)
            ]
        else:
            kept[key] = value
    return kept


def parse_task_config(
    text: str, *, where: str = "task.toml"
) -> tuple[TaskConfig, dict[str, object]]:
    """Parse task.toml text; returns the config and the unknown keys (dotted path -> value)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{where}: not valid TOML: {exc}") from exc
    if "version" in raw:
        raw.setdefault("schema_version", str(raw.pop("version")))
    envs = [raw.get("environment"), (raw.get("verifier") or {}).get("environment")]
    for env in envs:
        if isinstance(env, dict):
            for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if isinstance(env.get(old), str):
                    env[new] = parse_size_mb(env.pop(old), where=f"{where}: environment.{old}")
    unknown: dict[str, object] = {}
    known = _split_unknown(raw, TaskConfig, "", unknown)
    try:
        config = msgspec.convert(known, TaskConfig, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec says e.g. "Expected `int`, got `str` - at `$.environment.memory_mb`".
        raise TaskError(f"{where}: {exc}") from exc
    _check_values(config, where)
    check_request(config.environment.stacx, where)  # capability names (stacx.harbor.model)
    return config, unknown


NETWORK_MODES = ("public", "no-network", "allowlist")
STRATEGIES = ("mean", "final")


def _check_values(config: TaskConfig, where: str) -> None:
    """Enumerated values, with the accepted ones in the error (msgspec sees plain strings)."""
    phases: list[tuple[str, str | None, list[str] | None]] = [
        ("environment", config.environment.network_mode, config.environment.allowed_hosts),
        ("agent", config.agent.network_mode, config.agent.allowed_hosts),
        ("verifier", config.verifier.network_mode, config.verifier.allowed_hosts),
    ]
    for i, step in enumerate(config.steps or []):
        phases += [
            (f"steps[{i}].agent", step.agent.network_mode, step.agent.allowed_hosts),
            (f"steps[{i}].verifier", step.verifier.network_mode, step.verifier.allowed_hosts),
        ]
    for table, mode, hosts in phases:
        if mode is not None and mode not in NETWORK_MODES:
            raise TaskError(
                f"{where}: {table}.network_mode = {mode!r}; accepted: {', '.join(NETWORK_MODES)}"
            )
        if hosts and mode != "allowlist":
            raise TaskError(
                f"{where}: {table}.allowed_hosts is only valid with network_mode = 'allowlist'"
            )
    strategy = config.multi_step_reward_strategy
    if strategy is not None and strategy not in STRATEGIES:
        raise TaskError(
            f"{where}: multi_step_reward_strategy = {strategy!r}; accepted: {', '.join(STRATEGIES)}"
        )
    mode = config.verifier.environment_mode
    if mode not in (None, "shared", "separate"):
        raise TaskError(
            f"{where}: verifier.environment_mode = {mode!r}; accepted: shared, separate"
        )
    if mode == "shared" and config.verifier.environment is not None:
        raise TaskError(
            f"{where}: verifier.environment_mode = 'shared' conflicts with [verifier.environment]"
        )


def step_verifier(task: VerifierConfig, step: VerifierConfig) -> VerifierConfig:
    """A step's [steps.verifier] over the task's [verifier], with the mode as Harbor resolves it."""
    own_mode = step.environment_mode or ("separate" if step.environment is not None else None)
    phase = step if step.network_mode is not None else task
    return msgspec.structs.replace(
        task,
        timeout_sec=task.timeout_sec
        if step.timeout_sec == VerifierConfig().timeout_sec
        else step.timeout_sec,
        env={**task.env, **step.env},
        user=task.user if step.user is None else step.user,
        network_mode=phase.network_mode,
        allowed_hosts=phase.allowed_hosts,
        environment_mode=own_mode or task.environment_mode,
        environment=step.environment
        if step.environment is not None
        else None
        if own_mode == "shared"
        else task.environment,
    )


def verifier_separate(config: TaskConfig) -> bool:
    """Harbor's rule: 'separate' when set so, or when [verifier.environment] is given."""
    mode = config.verifier.environment_mode
    return mode == "separate" or (mode is None and config.verifier.environment is not None)


def task_notes(task_dir: Path, config: TaskConfig, unknown: dict[str, object]) -> list[str]:
    """The task.toml keys (and files) not honoured, one line each."""
    notes = [
        f"{key}: unknown key, ignored" + (f" (did you mean {near!r}?)" if near else "")
        for key in sorted(unknown)
        for near in [did_you_mean(key)]
    ]
    env = config.environment
    for key, cond, why in (
        ("environment.gpus", env.gpus > 0, "no GPUs are given to sandboxes"),
        ("environment.gpu_types", bool(env.gpu_types), "no GPUs are given to sandboxes"),
        ("environment.tpu", env.tpu is not None, "no TPUs"),
        ("environment.skills_dir", env.skills_dir is not None, "no STACX agent reads skills"),
        (
            "environment.mcp_servers",
            bool(env.mcp_servers),
            f"{[m.name for m in env.mcp_servers]} not started (no STACX agent talks MCP)",
        ),
    ):
        if cond:
            notes.append(f"{key}: ignored ({why})")
    for a in config.artifacts:
        if not isinstance(a, str) and a.service not in (None, "main"):
            notes.append(f"artifacts: service {a.service!r} ignored (no compose services)")
    compose = compose_file(task_dir / "environment")
    if compose is not None:
        notes += load_compose(compose)[1]
    return notes


def load_task(task_dir: str | Path) -> Task:
    """Load one Harbor task directory; TaskError naming the missing or bad file. Any other
    exception is a STACX bug: raised under STACX_STRICT, else a TaskError saying so."""
    try:
        return _load_task(task_dir)
    except TaskError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{task_dir}: cannot read a task file: {exc}") from exc
    except Exception as exc:
        if strict():
            raise
        raise TaskError(
            f"{task_dir}: STACX failed while loading this task, a STACX bug, not the task's "
            f"({type(exc).__name__}: {exc}; STACX_STRICT=1 shows the traceback)"
        ) from exc


def _load_task(task_dir: str | Path) -> Task:
    file, sep, task_id = str(task_dir).rpartition("#")
    if sep and file.endswith(".jsonl"):  # an answer task: <file>#<id>
        found = [t for t in read_jsonl(file) if t.task_id == task_id]
        if not found:
            raise TaskError(f"{file}: no task with id {task_id!r}")
        return found[0]
    task_dir = Path(task_dir).resolve()
    if not task_dir.is_dir():
        raise TaskError(f"{task_dir}: not a directory")
    toml_path = task_dir / "task.toml"
    if not toml_path.is_file():
        raise TaskError(f"{task_dir}: missing task.toml (not a Harbor task)")
    config, unknown = parse_task_config(toml_path.read_text(), where=str(toml_path))
    if config.environment.os.lower() != "linux":  # its tests are test.bat: nothing to run
        raise TaskError(
            f"{toml_path}: environment.os = {config.environment.os!r}: only linux containers "
            "run here"
        )
    notes = task_notes(task_dir, config, unknown)
    typos = [k for k in unknown if k.startswith("verifier.stacx.")]  # STACX's own keys: no typo
    if typos:
        raise TaskError(f"{toml_path}: {typos[0]}: unknown key; accepted: verifier.stacx.rubric")
    rubric = task_rubric(task_dir, config.verifier.stacx.rubric, where=str(toml_path))
    if config.steps:
        if rubric is not None:
            raise TaskError(f"{toml_path}: verifier.stacx.rubric: not supported with [[steps]]")
        task = _multi_step_task(task_dir, config, unknown, notes)
    else:
        instruction_path = task_dir / "instruction.md"
        if not instruction_path.is_file():
            raise TaskError(f"{task_dir}: missing instruction.md")
        # No environment/Dockerfile and no environment.docker_image: an image-less task (the
        # process backend runs it; the Docker backend reports it when it builds, as IMAGE_BUILD).
        if not (task_dir / "tests" / "test.sh").is_file():
            raise TaskError(f"{task_dir}: missing tests/test.sh")
        task = Task(
            task_id=task_dir.name,
            path=str(task_dir),
            instruction=instruction_path.read_text(),
            config=config,
            unknown=unknown,
            has_solution=(task_dir / "solution" / "solve.sh").is_file(),
            notes=notes,
            rubric=rubric,
        )
    check_allowlist(task, toml_path)
    return task


def _multi_step_task(
    task_dir: Path, config: TaskConfig, unknown: dict[str, object], notes: list[str]
) -> Task:
    """A task with [[steps]]: each needs an instruction.md and a tests/test.sh (or the task's)."""
    names = [s.name for s in config.steps or []]
    if len(set(names)) != len(names):
        raise TaskError(f"{task_dir}/task.toml: step names repeat: {names}")
    steps: list[Task] = []
    for step in config.steps or []:
        sdir = task_dir / "steps" / step.name
        instruction = sdir / "instruction.md"
        if not instruction.is_file():
            raise TaskError(f"{task_dir}: step {step.name!r}: missing {instruction}")
        view = Task(
            task_id=task_dir.name, path=str(task_dir), instruction="", config=config, step=step.name
        )
        if (
            not (view.tests_dir / "test.sh").is_file()
            and not (task_dir / "tests" / "test.sh").is_file()
        ):
            raise TaskError(
                f"{task_dir}: step {step.name!r}: missing steps/{step.name}/tests/test.sh "
                "(and the task has no tests/test.sh)"
            )
        verifier = step_verifier(config.verifier, step.verifier)
        agent = msgspec.structs.replace(
            step.agent,
            timeout_sec=step.agent.timeout_sec or config.agent.timeout_sec,
            user=step.agent.user if step.agent.user is not None else config.agent.user,
            network_mode=step.agent.network_mode or config.agent.network_mode,
            allowed_hosts=(
                step.agent.allowed_hosts if step.agent.network_mode else config.agent.allowed_hosts
            ),
        )
        steps.append(
            msgspec.structs.replace(
                view,
                instruction=instruction.read_text(),
                config=msgspec.structs.replace(config, agent=agent, verifier=verifier, steps=None),
                has_solution=(view.solution_dir / "solve.sh").is_file(),
            )
        )
    top = task_dir / "instruction.md"
    return Task(
        task_id=task_dir.name,
        path=str(task_dir),
        instruction=top.read_text() if top.is_file() else steps[0].instruction,
        config=config,
        unknown=unknown,
        has_solution=all(s.has_solution for s in steps),
        notes=notes,
        step_tasks=steps,
    )


class Unloadable(msgspec.Struct, frozen=True, kw_only=True):
    """A task directory of a set that did not load: reported as that task's failure."""

    task_id: str
    path: str
    reason: str


def discover(tasks_dir: str | Path) -> list[Task]:
    """Every task under `tasks_dir` (maybe one task), sorted by id; one that fails: TaskError."""
    tasks, broken = discover_all(tasks_dir)
    if broken:
        raise TaskError(broken[0].reason)
    return tasks


def discover_all(tasks_dir: str | Path) -> tuple[list[Task], list[Unloadable]]:
    """The tasks that load and those that do not (with the reason), each sorted by id."""
    root = Path(tasks_dir)
    if not root.is_dir():
        raise TaskError(f"{root}: not a directory")
    if (root / "task.toml").is_file():
        return [load_task(root)], []
    # A steps/<name>/ folder is part of its task, never a task of its own.
    dirs = sorted(
        {p.parent for p in root.rglob("task.toml")}
        - {p.parent for p in root.rglob("steps/*/task.toml")}
    )
    jsonl = sorted(root.glob("*.jsonl"))
    if not dirs and not jsonl:
        raise TaskError(f"{root}: no task.toml found below it, nor a .jsonl (not a task set)")
    tasks: list[Task] = []
    broken: list[Unloadable] = []
    if dirs:
        for d in dirs:
            try:
                tasks.append(load_task(d))
            except TaskError as exc:
                broken.append(Unloadable(task_id=d.name, path=str(d.resolve()), reason=str(exc)))
    else:
        tasks = [t for f in jsonl for t in read_jsonl(f)]
    seen: dict[str, str] = {}
    for task_id, path in [(t.task_id, t.path) for t in tasks] + [
        (b.task_id, b.path) for b in broken
    ]:
        if task_id in seen:
            raise TaskError(f"duplicate task id {task_id!r}: {seen[task_id]} and {path}")
        seen[task_id] = path
    return sorted(tasks, key=lambda t: t.task_id), sorted(broken, key=lambda t: t.task_id)


def load_tasks(source: str | Path) -> list[Task]:
    """Tasks from a task dir, a dir of tasks or .jsonl files, a tasks.jsonl, or answer records."""
    source = Path(source)
    if source.is_file():
        return read_jsonl(source)
    return discover(source)


def load_task_set(source: str | Path) -> tuple[list[Task], list[Unloadable]]:
    """`load_tasks`, keeping the task directories that do not load as `Unloadable`."""
    source = Path(source)
    if source.is_file():
        return read_jsonl(source), []
    return discover_all(source)


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(env: dict[str, str], *, where: str) -> dict[str, str]:
    """Expand `${VAR}` / `${VAR:-default}` from the host; an unset `${VAR}` is a TaskError."""
    out: dict[str, str] = {}
    for key, value in env.items():

        def sub(m: re.Match[str], key: str = key) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise TaskError(f"{where}.{key}: ${{{name}}} is not set on the host")

        out[key] = _TEMPLATE.sub(sub, value)
    return out


def select(
    tasks: list[Task],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    difficulty: Sequence[str] = (),
    limit: int | None = None,
    where: str = "tasks",
) -> list[Task]:
    """`tasks` sorted by id, narrowed by ids or fnmatch patterns, difficulty and `limit`; a
    pattern that matches nothing, or nothing left, is a ConfigError naming `where`."""
    from fnmatch import fnmatchcase

    tasks = sorted(tasks, key=lambda t: t.task_id)
    known = [t.task_id for t in tasks]
    for key, patterns in (("include", include), ("exclude", exclude)):
        missing = [p for p in patterns if not any(fnmatchcase(i, p) for i in known)]
        if missing:
            raise TaskError(
                f"{where}.{key}: {missing} match no task id; accepted: {', '.join(known)}"
            )
    if include:
        tasks = [t for t in tasks if any(fnmatchcase(t.task_id, p) for p in include)]
    tasks = [t for t in tasks if not any(fnmatchcase(t.task_id, p) for p in exclude)]
    if difficulty:
        levels = sorted({str(t.config.metadata.get("difficulty", "")) for t in tasks} - {""})
        unknown = [d for d in difficulty if d not in levels]
        if unknown:
            raise TaskError(
                f"{where}.difficulty: {unknown} is no task's metadata.difficulty; "
                f"accepted: {', '.join(levels) or '(no task sets one)'}"
            )
        tasks = [t for t in tasks if str(t.config.metadata.get("difficulty", "")) in difficulty]
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise TaskError(f"{where}: no task left after include/exclude/difficulty/limit")
    return tasks
