"""Scaffold specs as data: what an installed scaffold is (packages, version checks, its `run`
template, the API it speaks, where its trajectory lands), read from a TOML file, a shipped one
(``stacx/agents/scaffolds/*.toml``) or a recipe's ``[agent.scaffold_spec]``. An invalid spec fails
at load naming the key path and the accepted values.

Design: docs/scaffolds.md#your-own-scaffold-a-spec-file-no-code
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from stacx.errors import ConfigError
from stacx.events import StopReason

LOGS_DIR = "/logs/agent"
SHIPPED_DIR = Path(__file__).resolve().parent / "scaffolds"
Api = Literal["openai-chat", "openai-completions", "anthropic-messages"]


class Beside(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A scaffold that runs in a container of its own beside the task's (Harbor's way for
    Terminus-2): that container's image is `base_image` plus these packages and commands; the
    scaffold acts in the task's sandbox through the exec relay (stacx.agents.exec_relay)."""

    base_image: str  # e.g. "stacx/base:trixie" (Python 3.13), whatever the task's Python
    apt: list[str] = []
    pip: list[str] = []  # into the venv at {venv}
    install: list[str] = []


class ScaffoldSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one scaffold is installed and run (docs/scaffolds.md). `run` is a shell template whose
    placeholders are shell-quoted: {instruction_file} {model} {base_url} {api_key} {max_turns}
    {temperature} {top_p} {max_tokens} {timeout} {logs_dir} {venv}; `base_url` is the gateway's
    /v1 for an OpenAI `api`, its root for Anthropic's."""

    name: str
    run: str
    version: str = ""
    api: Api = "openai-chat"
    pip: list[str] = []  # requirements, installed into the venv at {venv}
    npm: list[str] = []  # `npm install -g` (the task image, or an install command, has npm)
    apt: list[str] = []  # `apt-get install -y` (a Debian-based task image)
    install: list[str] = []  # more shell commands, after the packages
    min_python: str = ""  # e.g. "3.12": the task image's python3 must be at least this
    min_node: str = ""  # e.g. "20": the task image's node must be at least this
    base_image: str = ""  # the base image a task needs for it (named in the version error)
    python: str = ""  # runs the forwarder: default {venv}/bin/python with pip, else python3
    trajectory: str = f"{LOGS_DIR}/trajectory.json"  # the scaffold's own record
    env: dict[str, str] = {}
    files: dict[str, str] = {}  # path -> text, written into the sandbox before each run
    # the trajectory's info.exit_status -> the episode's stop reason (else AGENT_DONE)
    stops: dict[str, StopReason] = {}
    # set: the scaffold runs beside the task's container, in an image of its own (`Beside`);
    # `run`, `python`, `env`, `files` and the trajectory are that container's, while the
    # top-level packages and commands still make the task's layer (e.g. the tmux it drives)
    beside: Beside | None = None

    @property
    def venv(self) -> str:
        return f"/opt/stacx-{self.name}"

    def interpreter(self) -> str:
        pip = self.beside.pip if self.beside is not None else self.pip
        return self.python.replace("{venv}", self.venv) or (
            f"{self.venv}/bin/python" if pip else "python3"
        )

    def layer_commands(self) -> list[str]:
        """The task layer's shell commands (one RUN each): version checks, then packages."""
        out = [
            _version_check(self, tool, want)
            for tool, want in (("python3", self.min_python), ("node", self.min_node))
            if want
        ]
        out += self._packages(self.apt, self.pip)
        if self.npm:
            out.append(f"npm install -g {' '.join(map(shlex.quote, self.npm))}")
        return out + [c.replace("{venv}", self.venv) for c in self.install]

    def beside_commands(self) -> list[str]:
        """The beside image's shell commands over `beside.base_image` (none without `beside`)."""
        b = self.beside
        if b is None:
            return []
        return self._packages(b.apt, b.pip) + [c.replace("{venv}", self.venv) for c in b.install]

    def _packages(self, apt: list[str], pip: list[str]) -> list[str]:
        out = []
        if apt:
            out.append(
                "apt-get update && apt-get install -y --no-install-recommends "
                f"{' '.join(map(shlex.quote, apt))} && rm -rf /var/lib/apt/lists/*"
            )
        if pip:
            out.append(
                f"python3 -m venv {self.venv} && {self.venv}/bin/pip install --no-cache-dir "
                f"--disable-pip-version-check {' '.join(map(shlex.quote, pip))}"
            )
        return out

    def run_env(self) -> dict[str, str]:
        return {k: v.replace("{venv}", self.venv) for k, v in self.env.items()}

    def run_files(self) -> dict[str, str]:
        return {p.replace("{venv}", self.venv): text for p, text in self.files.items()}


def _version_check(spec: ScaffoldSpec, tool: str, want: str) -> str:
    parts = tuple(int(p) for p in want.split("."))
    need = f"scaffold {spec.name} needs {tool} >= {want} in the task image" + (
        f" (base image {spec.base_image})" if spec.base_image else ""
    )
    if tool == "python3":
        probe = f"python3 -c 'import sys; sys.exit(sys.version_info[:{len(parts)}] < {parts!r})'"
    else:  # node: the first differing part decides
        probe = (
            'node -e \'const v = process.versions.node.split(".").map(Number); '
            f"const w = [{', '.join(map(str, parts))}]; "
            "for (let i = 0; i < w.length; i++) if ((v[i] || 0) !== w[i]) "
            "process.exit((v[i] || 0) > w[i] ? 0 : 1);'"
        )
    return f"{probe} || {{ echo {shlex.quote(need + '; it has:')} $({tool} --version 2>&1) >&2; exit 1; }}"


def load_spec(path: Path) -> ScaffoldSpec:
    """The spec in a TOML file; ConfigError naming the file and the key path otherwise."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"scaffold spec {path}: cannot read it: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"scaffold spec {path}: not valid TOML: {exc}") from exc
    try:
        spec = msgspec.convert(data, ScaffoldSpec)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"scaffold spec {path}: {_explain(str(exc))}") from exc
    return checked(spec, f"scaffold spec {path}")


def checked(spec: ScaffoldSpec, where: str) -> ScaffoldSpec:
    """`spec` once its versions and placeholders are valid; else ConfigError after `where`."""

    def key(name: str) -> str:
        return f"{where}.{name}" if where.startswith("agent.") else f"{where}: {name}"

    for want, name in ((spec.min_python, "min_python"), (spec.min_node, "min_node")):
        if want and not all(p.isdigit() for p in want.split(".")):
            raise ConfigError(f"{key(name)} = {want!r}: a version like '3.12'")
    try:
        spec.run.format(**dict.fromkeys(PLACEHOLDERS, "x"))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"{key('run')}: unknown placeholder {exc}; accepted: {', '.join(sorted(PLACEHOLDERS))}"
        ) from exc
    return spec


PLACEHOLDERS = {
    "instruction_file",
    "model",
    "base_url",
    "api_key",
    "max_turns",
    "temperature",
    "top_p",
    "max_tokens",
    "timeout",
    "logs_dir",
    "venv",
}


def _explain(message: str) -> str:
    """msgspec's message with its `$.a.b` path as a key path and Literal choices spelled out."""
    text = message.replace("$.", "").replace("at `$`", "at the top level")
    if "Invalid enum value" in text and "api" in text:
        text += "; accepted: openai-chat, openai-completions, anthropic-messages"
    if "Invalid enum value" in text and "stops" in text:
        text += f"; accepted: {', '.join(s.value for s in StopReason)}"
    return text


def shipped() -> dict[str, Path]:
    """The shipped specs by name (the file stem is the name)."""
    return {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.toml"))}


def resolve(name_or_path: str) -> ScaffoldSpec:
    """A shipped spec by name, or the spec in a ``.toml`` file (relative to the cwd)."""
    specs = shipped()
    if name_or_path in specs:
        return load_spec(specs[name_or_path])
    path = Path(name_or_path).expanduser()
    if path.suffix == ".toml":
        if not path.is_file():
            raise ConfigError(f"agent.scaffold = {name_or_path!r}: no such spec file")
        return load_spec(path)
    raise ConfigError(
        f"agent.scaffold = {name_or_path!r}: accepted: {', '.join(specs)}, or a "
        "path to a scaffold spec (.toml)"
    )
