"""Reading recipes: TOML file + ``--set key.path=value`` overrides -> a validated :class:`Recipe`,
with the trainer keys that other sections decide derived. Guarantees: every error is a
:class:`ConfigError` naming the file, the key path and what is accepted there; an override is
applied before validation, so a ``--set`` typo fails like one in the file.
Design: docs/recipes.md
"""

from __future__ import annotations

import json
import re
import tomllib
import typing
from pathlib import Path

import msgspec

from stacx.errors import ConfigError
from stacx.launch.recipe import Recipe
from stacx.train import algorithms
from stacx.train.algorithms import Teacher

ConfigDict = dict[str, object]


def parse_value(text: str) -> object:
    """A ``--set`` value: a TOML literal if it parses as one, else the string itself."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: ConfigDict, overrides: list[str]) -> ConfigDict:
    """A copy of `data` with each ``key.path=value`` set (intermediate tables are created)."""
    out: ConfigDict = json.loads(json.dumps(data))  # deep copy of plain TOML data
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", key):
            raise ConfigError(f"--set {item!r}: expected key.path=value, e.g. trainer.steps=2")
        *parents, leaf = key.split(".")
        node = out
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError(f"--set {key}: {where} is a value, not a table")
            node = child
        node[leaf] = parse_value(raw)
    return out


def read_toml(path: Path) -> ConfigDict:
    if not path.is_file():
        raise ConfigError(f"{path}: no such recipe file")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def load_recipe(path: Path | str, overrides: list[str] | None = None) -> Recipe:
    """Read, override, validate (``name`` defaults to the file's stem); an error at a key that a
    ``--set`` gave is reported against that ``--set``."""
    path = Path(path)
    data = apply_overrides(read_toml(path), overrides or [])
    data.setdefault("name", path.stem)
    try:
        return convert(data, source=str(path))
    except ConfigError as exc:
        message = str(exc).removeprefix(f"{path}: ")
        culprit = _override_named(message, overrides or [])
        if culprit is None:
            raise
        raise ConfigError(f"--set {culprit}: {message} (recipe {path})") from None


_ERROR_AT = re.compile(r"^(?:unknown key |missing required key )?([A-Za-z0-9_.]+)")


def _override_named(message: str, overrides: list[str]) -> str | None:
    """The last ``--set`` whose key (or a table above or below it) is where the error is."""
    m = _ERROR_AT.match(re.sub(r"\[\d+\]", "", message))
    if m is None:
        return None
    at = m.group(1)
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if at == key or at.startswith(key + ".") or key.startswith(at + "."):
            return item
    return None


def convert(data: ConfigDict, *, source: str = "recipe") -> Recipe:
    try:
        return msgspec.convert(derive(data, source=source), Recipe)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {explain(str(exc))}") from exc
    except ConfigError as exc:  # a value check of an embedded config (e.g. TrainerConfig)
        raise ConfigError(f"{source}: {exc}") from exc


def _get(data: ConfigDict, path: str, default: object) -> object:
    node: object = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def derive(data: ConfigDict, *, source: str = "recipe") -> ConfigDict:
    """Fill the trainer's keys that other sections decide (docs/recipes.md#derived-keys); a recipe
    may repeat a derived key only with the same value, so a printed resolved recipe loads back."""
    algo = _get(data, "algorithm.name", "grpo")
    trainer = data.get("trainer", {})
    if not isinstance(algo, str) or not isinstance(trainer, dict):
        return data
    if not algorithms.get(algo).trains:
        return data
    data = _derive_imitation(data, algo, trainer.get("steps", 1))
    per_iteration = _get(data, "tasks.per_iteration", 4)
    group_size = _get(data, "tasks.group_size", 4)
    fixed = _trainer_keys(data, algo)
    out = dict(trainer)
    for key, (value, origin) in fixed.items():
        if key in trainer and trainer[key] != value:
            raise ConfigError(
                f"trainer.{key} = {trainer[key]!r} contradicts {origin} = {value!r}; "
                f"the trainer's is derived from {origin.split(' ')[0]}: remove trainer.{key}"
            )
        out[key] = value
    if isinstance(per_iteration, int) and isinstance(group_size, int):
        out.setdefault("batch_groups", per_iteration)
        out.setdefault("batch_episodes", per_iteration * group_size)
    return {**data, "trainer": out}


def _derive_imitation(data: ConfigDict, algo: object, steps: object) -> ConfigDict:
    """algorithm.imitation's name and iterations from algorithm.name and trainer.steps."""
    algorithm = data.get("algorithm", {})
    imitation = _get(data, "algorithm.imitation", {})
    if not (
        algorithms.get(str(algo)).teacher != Teacher.NONE
        and isinstance(algorithm, dict)
        and isinstance(imitation, dict)
    ):
        return data
    for key, value, origin in (
        ("name", algo, "algorithm.name"),
        ("iterations", steps, "trainer.steps"),
    ):
        if key in imitation and imitation[key] != value:
            raise ConfigError(
                f"algorithm.imitation.{key} = {imitation[key]!r} contradicts "
                f"{origin} = {value!r}; remove algorithm.imitation.{key}"
            )
    return {
        **data,
        "algorithm": {**algorithm, "imitation": {**imitation, "name": algo, "iterations": steps}},
    }


def _trainer_keys(data: ConfigDict, algo: object) -> dict[str, tuple[object, str]]:
    """The trainer keys that other sections decide: key -> (value, the key it comes from)."""
    mode = _get(data, "algorithm.mode", "sync")
    fixed: dict[str, tuple[object, str]] = {
        "algorithm": (algo, "algorithm.name"),
        "model": (_get(data, "model.path", "default"), "model.path"),
        "mode": (mode, "algorithm.mode"),
        "max_staleness": (
            _get(data, "algorithm.max_staleness", 1) if mode == "async" else 0,
            "algorithm.max_staleness (0 in sync mode)",
        ),
    }
    # the keys the algorithm derives (DAgger's label_actors, OPD's knobs, ...)
    fixed.update(
        algorithms.get(str(algo)).trainer_keys(lambda key, default: _get(data, key, default))
    )
    return fixed


def to_dict(recipe: Recipe) -> ConfigDict:
    """The resolved recipe as plain JSON data (what RunStarted records; tuples become lists, so a
    recorded and a loaded recipe compare equal)."""
    out: ConfigDict = msgspec.json.decode(msgspec.json.encode(recipe))
    return out


# ---- error messages --------------------------------------------------------------------------

_FIELD = re.compile(
    r"Object (contains unknown|missing required) field `([^`]+)`(?: - at `\$(.*)`)?"
)
_AT = re.compile(r"^(.*) - at `\$(.*)`$")


def explain(message: str) -> str:
    """Rewrite msgspec's validation message in terms of the recipe's key paths."""
    if m := _FIELD.match(message):
        parent = (m.group(3) or "").lstrip(".")
        key = f"{parent}.{m.group(2)}" if parent else m.group(2)
        if m.group(1) == "missing required":
            return f"missing required key {key}"
        return f"unknown key {key}; accepted: {', '.join(_keys_at(parent))}"
    if m := _AT.match(message):
        what, path = m.group(1), m.group(2).lstrip(".")
        accepted = _accepted_at(path)
        tail = f"; accepted: {accepted}" if accepted else ""
        return f"{path}: {what.replace('`', '')}{tail}"
    return message


def _field_type(path: str) -> object | None:
    """The declared type at a dotted path of Recipe (list indices skipped), or None."""
    tp: object = Recipe
    for part in re.sub(r"\[\d+\]", "", path).split("."):
        if not part:
            continue
        struct = _struct_of(tp)
        tp = None if struct is None else typing.get_type_hints(struct).get(part)
        if tp is None:
            return None
    if re.search(r"\[\d+\]$", path):
        args = typing.get_args(tp)
        return args[0] if args else None
    return tp


def _struct_of(tp: object) -> type[msgspec.Struct] | None:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    for arg in typing.get_args(tp):  # X | None
        if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
            return arg
    return None


def _keys_at(path: str) -> list[str]:
    struct = _struct_of(_field_type(path)) if path else Recipe
    return list(struct.__struct_fields__) if struct is not None else []


def _accepted_at(path: str) -> str:
    tp = _field_type(path)
    if tp is None:
        return ""
    if typing.get_origin(tp) is typing.Literal:
        return ", ".join(repr(a) for a in typing.get_args(tp))
    if _struct_of(tp) is not None:
        return "a table with keys " + ", ".join(_keys_at(path))
    return ""  # msgspec's message already names the expected type


# ---- display and comparison ------------------------------------------------------------------


def flatten(data: ConfigDict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, object] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def diff(old: ConfigDict, new: ConfigDict) -> list[str]:
    """Lines ``key: old -> new`` for every leaf that differs (missing leaves shown as <absent>)."""
    a, b = flatten(old), flatten(new)
    pairs = ((k, a.get(k, "<absent>"), b.get(k, "<absent>")) for k in sorted(set(a) | set(b)))
    return [f"{k}: {json.dumps(va)} -> {json.dumps(vb)}" for k, va, vb in pairs if va != vb]


def _literal(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    return repr(v)


def to_toml(data: ConfigDict, prefix: str = "") -> str:
    """The resolved recipe as TOML (``None`` values as comments), for printing."""
    lines: list[str] = []
    tables: list[tuple[str, ConfigDict]] = []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((f"{prefix}{k}", v))
        elif v is None:
            lines.append(f"# {k} = none")
        else:
            lines.append(f"{k} = {_literal(v)}")
    for name, table in tables:
        lines += [f"\n[{name}]", to_toml(table, name + ".")]
    return "\n".join(line for line in lines if line != "")
