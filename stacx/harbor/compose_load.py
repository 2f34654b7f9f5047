"""A task's docker-compose.yaml read as the Compose specification defines it: interpolated as
`docker compose` does, validated against the vendored Compose JSON schema, then every form the
schema allows read for the keys STACX honours. An error about the file's content is a TaskError; any
other exception on a file that passed the schema is STACX's own bug.

Design: docs/tasks.md#compose-files
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import yaml
from aiodocker.types import JSONValue

from stacx.errors import TaskError

MAIN = "main"
FILES = ("docker-compose.yaml", "docker-compose.yml")
# compose-spec/compose-spec, schema/compose-spec.json at commit
# a08f8d51631b7127ddac3d2c65537db429d0f1d0 (2025-10-28), vendored unmodified.
SCHEMA_FILE = Path(__file__).with_name("compose_spec.json")
_MAIN_KEYS = {"build", "environment", "depends_on", "image", "container_name", "volumes"}
_KEYS = _MAIN_KEYS | {"command", "entrypoint", "healthcheck", "working_dir", "user"}
_TOP_KEYS = {"services", "version", "name", "volumes"}
_MOUNT_KEYS = {"type", "source", "target", "read_only"}
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", re.DOTALL)
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class Mount(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a service's `volumes:`."""

    source: str  # a named volume's compose name, or an absolute host path under environment/
    target: str
    read_only: bool = False
    volume: bool = False  # a named volume (one per episode), else a bind mount


class Service(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    image: str | None = None
    build_dir: str | None = None  # a build context (absolute)
    dockerfile: str = "Dockerfile"  # relative to build_dir
    build_args: dict[str, str] = msgspec.field(default_factory=dict)  # interpolated
    build_target: str | None = None  # the stage to build (None: the last)
    environment: dict[str, str] = msgspec.field(default_factory=dict)  # interpolated
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    healthcheck: dict[str, JSONValue] | None = None  # Docker API Healthcheck
    depends_on: dict[str, str] = msgspec.field(default_factory=dict)  # name -> condition
    working_dir: str | None = None
    user: str | None = None
    mounts: list[Mount] = msgspec.field(default_factory=list)


# --- 1. interpolation ----------------------------------------------------------------------


def dotenv(path: Path) -> dict[str, str]:
    """The `KEY=VALUE` pairs of a .env file (`export ` and one pair of quotes dropped)."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def interpolate(text: str, env: Mapping[str, str], where: str, notes: list[str]) -> str:
    """`text` with Compose's variable syntax expanded (`$VAR`, `${VAR:-default}`, `$$`, ...)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            end = _closing_brace(text, i + 2, where)
            out.append(_braced(text[i + 2 : end], env, where, notes))
            i = end + 1
        elif (m := _NAME.match(text, i + 1)) is not None:
            out.append(_lookup(m.group(0), env, where, notes))
            i = m.end()
        else:  # a `$` before anything else is kept, as Compose does
            out.append("$")
            i += 1
    return "".join(out)


def _closing_brace(text: str, start: int, where: str) -> int:
    depth = 1
    for j in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j
    raise TaskError(f"{where}: invalid interpolation format in {text!r}: an unclosed '${{'")


def _lookup(name: str, env: Mapping[str, str], where: str, notes: list[str]) -> str:
    if name not in env:
        notes.append(f"{where}: the {name} variable is not set; defaulting to a blank string")
    return env.get(name, "")


def _braced(inner: str, env: Mapping[str, str], where: str, notes: list[str]) -> str:
    m = _BRACED.match(inner)
    if m is None:
        raise TaskError(
            f"{where}: invalid interpolation format ${{{inner}}}: a variable "
            "name, optionally followed by :-, -, :?, ?, :+ or + and a word"
        )
    name, op, arg = m.group(1), m.group(2), m.group(3) or ""
    is_set = name in env
    filled = is_set and env[name] != ""
    present = filled if op is not None and op.startswith(":") else is_set
    if op is None:
        return _lookup(name, env, where, notes)
    if op in (":-", "-"):
        return env[name] if present else interpolate(arg, env, where, notes)
    if op in (":?", "?"):
        if not present:
            raise TaskError(
                f"{where}: required variable {name} is missing a value"
                + (f": {arg}" if arg else "")
            )
        return env[name]
    return interpolate(arg, env, where, notes) if present else ""  # :+ and +


def _interpolate_tree(node: object, env: Mapping[str, str], where: str, notes: list[str]) -> object:
    """Every string value of a YAML tree interpolated (keys are left as written)."""
    if isinstance(node, str):
        return interpolate(node, env, where, notes)
    if isinstance(node, dict):
        sep = "." if not where.endswith(": ") else ""
        return {k: _interpolate_tree(v, env, f"{where}{sep}{k}", notes) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(v, env, f"{where}[{i}]", notes) for i, v in enumerate(node)]
    return node


# --- 2. the schema -------------------------------------------------------------------------


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    return jsonschema.Draft7Validator(schema)


def validate(data: object, name: str) -> None:
    """TaskError naming the key path and the schema's message if `data` is not valid Compose."""
    error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
    if error is None:
        return
    path = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    message = error.message
    known = error.schema.get("properties") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties" and isinstance(known, dict):
        # jsonschema names the extension pattern (^x-) only; say which keys were meant
        extra = sorted(set(error.instance) - set(known))
        close = [m for k in extra for m in difflib.get_close_matches(str(k), known, n=1)]
        message = (
            f"unknown key(s) {extra}"
            + (f" (did you mean {close}?)" if close else "")
            + f"; accepted: {', '.join(sorted(known))} and x-* extensions"
        )
    elif error.validator in ("oneOf", "anyOf") and isinstance(error.validator_value, list):
        message = f"{error.instance!r} is not valid; expected {_expected(error.validator_value)}"
    raise TaskError(f"{name}: {path}: {message} (Compose specification)")


def _expected(options: list[object]) -> str:
    """The JSON types a oneOf / anyOf allows, in words ("a string or an array")."""
    definitions = _validator().schema["definitions"]
    types: list[str] = []
    for option in options:
        if isinstance(option, dict) and "$ref" in option:
            option = definitions.get(str(option["$ref"]).rsplit("/", 1)[-1], {})
        kind = option.get("type", "?") if isinstance(option, dict) else "?"
        for t in kind if isinstance(kind, list) else [kind]:
            word = {"array": "a list", "object": "a mapping", "null": "null"}.get(t, f"a {t}")
            if word not in types:
                types.append(word)
    return " or ".join(types)


# --- 3. the keys STACX honours ---------------------------------------------------------------


def argv(value: object) -> list[str] | None:
    """A command or entrypoint: a string is split as a shell would, a list kept."""
    if value is None:
        return None
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]  # type: ignore[attr-defined]


def duration_ns(value: object, default_s: float, where: str) -> int:
    """A Compose duration ("5s", "1m30s", "250ms", "1h"; Go's syntax) in nanoseconds."""
    if value is None:
        return int(default_s * 1e9)
    if isinstance(value, int | float):  # not in the schema (a string), but YAML users write it
        return int(value * 1e9)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise TaskError(f"{where}: duration {value!r} is not like '30s', '1m30s' or '250ms'")
    return int(sum(float(n) * _UNITS_S[u] for n, u in parts) * 1e9)


def _truthy(value: object) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def healthcheck(raw: object, where: str) -> dict[str, JSONValue] | None:
    """The Docker API Healthcheck of a compose `healthcheck:` (None: the image's own)."""
    if not isinstance(raw, dict):
        return None
    if _truthy(raw.get("disable", False)):
        return {"Test": ["NONE"]}
    test = raw.get("test")
    if test is None:  # only timings: the image's test with these timings is not supported
        raise TaskError(
            f"{where}.healthcheck.test: required (STACX does not merge the "
            "image's HEALTHCHECK with compose timings)"
        )
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if not test or test[0] not in ("CMD", "CMD-SHELL", "NONE"):
        raise TaskError(
            f"{where}.healthcheck.test: a list must start with CMD, CMD-SHELL or "
            f"NONE (got {test!r})"
        )
    if test[0] == "NONE":
        return {"Test": ["NONE"]}
    at = f"{where}.healthcheck"
    return {
        "Test": [str(t) for t in test],
        "Interval": duration_ns(raw.get("interval"), 30, f"{at}.interval"),
        "Timeout": duration_ns(raw.get("timeout"), 30, f"{at}.timeout"),
        "Retries": int(raw.get("retries", 3)),
        "StartPeriod": duration_ns(raw.get("start_period"), 0, f"{at}.start_period"),
        "StartInterval": duration_ns(raw.get("start_interval"), 5, f"{at}.start_interval"),
    }


def environment(raw: object, env: Mapping[str, str]) -> dict[str, str]:
    """A service's `environment:`, list or map; a bare key takes the host's value, if any."""
    pairs: list[tuple[str, object]] = []
    if isinstance(raw, list):
        for entry in raw:
            name, eq, text = str(entry).partition("=")
            pairs.append((name, text if eq else None))
    elif isinstance(raw, dict):
        pairs = [(str(k), v) for k, v in raw.items()]
    out: dict[str, str] = {}
    for key, value in pairs:
        if value is None:
            if key in env:
                out[key] = env[key]
        else:
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def depends_on(raw: object, where: str, names: set[str], notes: list[str]) -> dict[str, str]:
    """`depends_on:` as a list (each started) or a map (condition, required)."""
    if isinstance(raw, list):
        raw = {str(d): {} for d in raw}
    out: dict[str, str] = {}
    for dep, spec in (raw or {}).items():  # type: ignore[attr-defined]
        spec = spec or {}
        condition = str(spec.get("condition", "service_started"))
        if condition not in CONDITIONS:
            raise TaskError(
                f"{where}.depends_on.{dep}.condition = {condition!r}; accepted: "
                f"{', '.join(CONDITIONS)}"
            )
        if dep not in names:
            if not _truthy(spec.get("required", True)):
                notes.append(f"{where}.depends_on.{dep}: optional service absent, skipped")
                continue
            raise TaskError(f"{where}.depends_on: no service {dep!r}")
        out[str(dep)] = condition
    return out


def build_spec(raw: object, where: str, env_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """`build:` (string or map) as the Service fields build_dir (absolute), dockerfile (in it),
    build_args and build_target; {} without one."""
    if raw is None:
        return {}
    spec: dict[str, object] = {"context": raw} if isinstance(raw, str) else dict(raw)  # type: ignore[call-overload]
    context = (env_dir / str(spec.get("context", "."))).resolve()
    if not context.is_dir():
        raise TaskError(
            f"{where}.build.context = {str(spec.get('context'))!r}: no such directory ({context})"
        )
    dockerfile = str(spec.get("dockerfile") or "Dockerfile")
    path = (context / dockerfile).resolve()
    if not path.is_file() or not path.is_relative_to(context):
        raise TaskError(
            f"{where}.build.dockerfile = {dockerfile!r}: no such file in the build "
            f"context {context}"
        )
    target = spec.get("target")
    return {
        "build_dir": str(context),
        "dockerfile": path.relative_to(context).as_posix(),
        "build_args": environment(spec.get("args"), env),
        "build_target": None if target is None else str(target),
    }


def read_file(path: Path) -> tuple[dict[str, object], dict[str, str], list[str]]:
    """The compose file interpolated and validated, the variables used, and the notes so far."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: not valid YAML: {exc}") from exc
    notes: list[str] = []
    env = {**dotenv(path.parent / ".env"), **os.environ}
    data = _interpolate_tree(raw, env, f"{path.name}: ", notes)
    validate(data, path.name)
    assert isinstance(data, dict)  # the schema's top level is an object
    if not isinstance(data.get("services"), dict):
        raise TaskError(f"{path}: no `services:` table")
    notes += [
        f"{path.name}: top-level {k!r} ignored"
        for k in data
        if k not in _TOP_KEYS and not str(k).startswith("x-")
    ]
    return data, env, notes


def _mounts(raw: object, where: str, env_dir: Path, declared: dict[str, object]) -> list[Mount]:
    """A service's `volumes:` list, checked (TaskError naming the entry if refused)."""
    if not isinstance(raw, list):
        raise TaskError(f"{where}.volumes: a list is required")
    out: list[Mount] = []
    for i, entry in enumerate(raw):
        at = f"{where}.volumes[{i}]"
        if isinstance(entry, str):
            parts = entry.split(":")
            if len(parts) < 2 or len(parts) > 3:
                raise TaskError(
                    f"{at} = {entry!r}: SOURCE:TARGET[:ro|rw] is required "
                    "(anonymous volumes are not supported)"
                )
            source, target, mode = parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"
            if mode not in ("ro", "rw"):
                raise TaskError(f"{at} = {entry!r}: mode {mode!r}; accepted: ro, rw")
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            read_only = mode == "ro"
        elif isinstance(entry, dict):
            extra = sorted(set(entry) - _MOUNT_KEYS)
            if extra:
                raise TaskError(
                    f"{at}.{extra[0]}: not supported; accepted keys: "
                    f"{', '.join(sorted(_MOUNT_KEYS))}"
                )
            kind = str(entry.get("type", "volume"))
            if kind not in ("volume", "bind"):
                raise TaskError(f"{at}.type = {kind!r}; accepted: bind, volume")
            source, target = str(entry.get("source") or ""), str(entry.get("target") or "")
            read_only = bool(entry.get("read_only", False))
        else:
            raise TaskError(f"{at}: a string or a table is required")
        if not target.startswith("/"):
            raise TaskError(f"{at}: target {target!r} is not an absolute container path")
        if kind == "volume":
            if source not in declared:
                raise TaskError(
                    f"{at}: volume {source!r} is not declared under the top-level `volumes:`"
                )
            out.append(Mount(source=source, target=target, read_only=read_only, volume=True))
            continue
        host = (env_dir / source).resolve()
        if source.startswith("~") or not host.is_relative_to(env_dir.resolve()):
            raise TaskError(
                f"{at}: host path {source!r} is outside the task's environment dir "
                f"({env_dir}): refused"
            )
        if not host.exists():
            raise TaskError(f"{at}: host path {source!r} does not exist under {env_dir}")
        out.append(Mount(source=str(host), target=target, read_only=read_only))
    return out


def _declared_volumes(raw: object, name: str) -> dict[str, object]:
    """The top-level `volumes:`; a volume with options (driver, external, ...) is refused."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TaskError(f"{name}: volumes: a table of volume names is required")
    for volume, options in raw.items():
        if options:
            key = next(iter(options)) if isinstance(options, dict) else ""
            raise TaskError(
                f"{name}: volumes.{volume}.{key}: volume options are not "
                "supported (a volume is created empty for each episode)"
            )
    return dict(raw)


def compose_file(env_dir: Path) -> Path | None:
    return next((env_dir / f for f in FILES if (env_dir / f).is_file()), None)


def load_compose(path: Path) -> tuple[dict[str, Service], list[str]]:
    """A compose file's services and notes on what is not honoured; TaskError if refused."""
    data, env, notes = read_file(path)
    declared = _declared_volumes(data.get("volumes"), path.name)
    services_raw: dict[str, dict[str, object]] = {
        str(k): v or {}
        for k, v in data["services"].items()  # type: ignore[attr-defined]
    }
    services: dict[str, Service] = {}
    for name, spec in services_raw.items():
        where = f"{path.name}: services.{name}"
        keys = _MAIN_KEYS if name == MAIN else _KEYS
        notes += [f"{where}.{k}: ignored" for k in spec if k not in keys and not k.startswith("x-")]
        build = build_spec(spec.get("build"), where, path.parent, env) if name != MAIN else {}
        if name != MAIN and not build and not spec.get("image"):
            raise TaskError(f"{where}: neither image nor build")
        services[name] = Service(
            name=name,
            image=None if spec.get("image") is None else str(spec["image"]),
            **build,
            environment=environment(spec.get("environment"), env),
            command=argv(spec.get("command")),
            entrypoint=argv(spec.get("entrypoint")),
            healthcheck=healthcheck(spec.get("healthcheck"), where),
            depends_on=depends_on(spec.get("depends_on"), where, set(services_raw), notes),
            working_dir=None if spec.get("working_dir") is None else str(spec["working_dir"]),
            user=None if spec.get("user") is None else str(spec.get("user")),
            mounts=_mounts(spec["volumes"], where, path.parent, declared)
            if "volumes" in spec
            else [],
        )
    if MAIN not in services:
        services[MAIN] = Service(name=MAIN)
    return services, notes
