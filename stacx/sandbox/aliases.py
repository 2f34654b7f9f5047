"""The base-image alias map: FROM images that cannot be pulled here, mapped onto local bases of the
same distribution and Python minor (stacx.sandbox.images) or offline stand-ins. The answer never
depends on what the host happens to have built; an unresolvable image is a TaskError.

Design: docs/sandboxes.md#task-images
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path

from stacx.errors import BaseUnavailableError, ConfigError, TaskError
from stacx.sandbox.images import (
    BASE_IMAGE,
    DISTRO,
    NOBLE_IMAGE,
    PYTHON_MINOR,
    TRIXIE_IMAGE,
    image_exists,
)
from stacx.sandbox.standins import PREFIX, standin, standin_base

ENV_VAR = "STACX_IMAGE_ALIASES"

# Each image goes to the base of its distribution and Python minor (3.8-3.10 to the oldest
# here, bookworm's 3.11). The most specific matching pattern wins, whatever the order
# (`_specificity`): a pattern naming a version beats one naming only a suite
# (python:3.12-slim-bookworm is python:3.12*), a longer literal beats a shorter.
DEFAULT_ALIASES: dict[str, str] = {
    "python:3.11*": BASE_IMAGE,
    "python:3.12*": NOBLE_IMAGE,
    "python:3.13*": TRIXIE_IMAGE,
    "python:3.14*": TRIXIE_IMAGE,
    "python:3.*": BASE_IMAGE,  # 3.8, 3.9, 3.10: the oldest Python here
    "python:3": TRIXIE_IMAGE,
    "python:3-*": TRIXIE_IMAGE,
    "python:latest": TRIXIE_IMAGE,
    "python:slim*": TRIXIE_IMAGE,
    "python:*bookworm*": BASE_IMAGE,
    "python:*trixie*": TRIXIE_IMAGE,
    "debian:trixie*": TRIXIE_IMAGE,
    "debian:13*": TRIXIE_IMAGE,
    "debian:testing*": TRIXIE_IMAGE,
    "debian:*": BASE_IMAGE,
    # Ubuntu 24.04 (noble) and later on noble itself (apt package names and versions are what
    # Ubuntu tasks install); older Ubuntu on bookworm, the nearest older Debian
    "ubuntu:24.04*": NOBLE_IMAGE,
    "ubuntu:noble*": NOBLE_IMAGE,
    "ubuntu:2[5-9].*": NOBLE_IMAGE,
    "ubuntu:latest": NOBLE_IMAGE,
    "ubuntu:rolling": NOBLE_IMAGE,
    "ubuntu:*": BASE_IMAGE,
    "buildpack-deps:*": BASE_IMAGE,
}


def _specificity(pattern: str) -> tuple[bool, int]:
    """How specific a pattern is: (its tag pins a version, its number of literal characters)."""
    tag = pattern.rpartition("/")[2].partition(":")[2]
    return bool(tag[:1].isdigit()), sum(c not in "*?[]" for c in pattern)


# Registries that serve Docker Hub's images under the same names (official images under
# library/): a name behind one of them is the Hub image.
_HUB_PREFIXES = (
    "docker.io/",
    "index.docker.io/",
    "registry-1.docker.io/",
    "public.ecr.aws/docker/library/",
    "mirror.gcr.io/",
)


def normalize(image: str) -> str:
    """`docker.io/library/python:3.11-slim@sha256:ab..` -> `python:3.11-slim`."""
    name = image.strip().split("@", 1)[0]
    for prefix in _HUB_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    name = name.removeprefix("library/")
    # A tag is a `:` after the last `/` (a `:` before it is a registry port).
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return name


def load_alias_file(path: str | Path) -> dict[str, str]:
    """Read a TOML or JSON alias file: a flat table `pattern = "target"`, or one under `[aliases]`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"image alias file {path} ({ENV_VAR}): cannot read: {exc}") from exc
    try:
        data: object = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"image alias file {path}: not valid TOML/JSON: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("aliases"), dict):
        data = data["aliases"]
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ConfigError(
            f"image alias file {path}: expected a table of strings, pattern -> image "
            '(e.g. `"ubuntu:*" = "stacx/base:bookworm"`), optionally under [aliases]'
        )
    return dict(data)


class AliasMap:
    """FROM images to local images: the user's patterns, then the defaults, most specific first."""

    def __init__(
        self,
        aliases: Mapping[str, str] | None = None,
        *,
        defaults: Mapping[str, str] = DEFAULT_ALIASES,
        exists: Callable[[str], bool] | None = None,
    ) -> None:
        # The user's entries are tried before the defaults; within each, the most specific wins.
        # Patterns are normalized as names are (a glob tag is kept as written).
        self.user = {normalize(k): v for k, v in (aliases or {}).items()}
        self.defaults = {normalize(k): v for k, v in defaults.items()}
        self._exists = exists

    @classmethod
    def from_env(cls, path: str | Path | None = None) -> AliasMap:
        """The map from `path`, else from $STACX_IMAGE_ALIASES, plus the built-in defaults."""
        path = path or os.environ.get(ENV_VAR) or None
        return cls(load_alias_file(path) if path else None)

    def lookup(self, image: str) -> str | None:
        """The alias target of `image`, or None (a Terminal-Bench base goes as its image)."""
        names = [normalize(image)]
        if (plain := equivalent(names[0])) is not None:
            names.append(plain)
        for table in (self.user, self.defaults):
            for name in names:
                matches = [p for p in table if fnmatch.fnmatchcase(name, p)]
                if matches:
                    return table[max(matches, key=_specificity)]
        return None

    def resolve(self, image: str, *, task: str = "?") -> str:
        """The local image for `image` (a base may need building); BaseUnavailableError if none."""
        target = self.lookup(image)
        if target is not None:
            return target
        target = standin(normalize(image))
        if target is not None:  # built before use (stacx.sandbox.build.local_image)
            return target
        exists = self._exists or image_exists
        if exists(image) or exists(normalize(image)):
            return image
        raise BaseUnavailableError(
            f"task {task}: base image {image!r} cannot be pulled here and has no alias; "
            f"add one to the alias file (${ENV_VAR}), e.g. "
            f'"{normalize(image)}" = "{BASE_IMAGE}", or build the image locally'
        )

    def fidelity(self, image: str) -> str | None:
        """Why `image` mapped onto its local stand-in is not faithful, or None when it is."""
        why = self._fidelity(image)
        if equivalent(normalize(image)) is None or self.lookup(image) is None:
            return why
        lacks = f"{image} runs on {self.resolve(image)} without the tmux and asciinema it adds"
        return lacks if why is None else f"{why}; without the tmux and asciinema it adds"

    def _fidelity(self, image: str) -> str | None:
        name = normalize(image)
        target = self.resolve(image)
        name = equivalent(name) or name
        if target.startswith(PREFIX):  # a stand-in is as faithful as the base it is built on
            base = standin_base(target)
            why = None if base is None else self.fidelity(base)
            return None if why is None else f"{image} is uv from PyPI on top of: {why}"
        base_minor = PYTHON_MINOR.get(target)
        if base_minor is None:
            return None  # the user's own image, or the image as written
        repo, _, tag = name.partition(":")
        if repo == "python":
            return _python_fidelity(image, tag, target, base_minor)
        suite = target.rsplit(":", 1)[-1]
        distro = DISTRO[suite]
        if repo in ("debian", "ubuntu") and repo == distro.lower():
            release = {"bookworm": "12", "trixie": "13", "noble": "24.04"}[suite]
            if tag.split("-")[0] in (suite, release) or (repo, tag) == ("ubuntu", "latest"):
                return None
            return f"{image} runs on {target} ({distro} {suite}, not {tag})"
        return (
            f"{image} runs on {target} ({distro} {suite}, not {repo}: packages and versions differ)"
        )


_DEBIAN_SUITES = ("buster", "bullseye", "bookworm", "trixie", "alpine")


def _python_fidelity(image: str, tag: str, target: str, base_minor: str) -> str | None:
    """Why a python:* image on `target` is not faithful: another minor, another Debian."""
    why: list[str] = []
    m = re.match(r"(3\.\d+)", tag)
    if m and m.group(1) != base_minor:
        asked = m.group(1)
        older = tuple(map(int, asked.split("."))) < tuple(map(int, base_minor.split(".")))
        hint = (
            f"wheels pinned for {asked} may not exist for {base_minor}"
            if older
            else f"code written for {asked} may use what {base_minor} lacks"
        )
        why.append(
            f"asks for Python {asked}; it runs on {target} with Python {base_minor} ({hint})"
        )
    elif not m and target != TRIXIE_IMAGE:
        why.append(f"means the newest Python; it runs on {target} (Python {base_minor})")
    suite = target.rsplit(":", 1)[-1]
    named = next((s for s in _DEBIAN_SUITES if s in tag), None)
    distro = DISTRO[suite]
    if named is not None and named != suite:
        why.append(
            f"{distro} {suite}, not {named}"
            if why
            else f"runs on {target} ({distro} {suite}, not {named})"
        )
    return f"{image} " + "; ".join(why) if why else None


_TBENCH = re.compile(r"^ghcr\.io/laude-institute/t-bench/(python|ubuntu)-(\d+)-(\d+):")


def equivalent(name: str) -> str | None:
    """The public image a Terminal-Bench base (`.../t-bench/python-3-13:<date>`) is, or None."""
    m = _TBENCH.match(name)
    if m is None:
        return None
    repo, major, minor = m.groups()
    return f"{repo}:{major}.{minor:0>2}" if repo == "ubuntu" else f"{repo}:{major}.{minor}"


_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)
_COPY_FROM = re.compile(r"^(\s*COPY\s+(?:--\S+\s+)*?--from=)(\S+)(.*)$", re.IGNORECASE)
_WORKDIR = re.compile(r"^\s*WORKDIR\s", re.IGNORECASE | re.MULTILINE)
_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", re.IGNORECASE)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def rewrite_dockerfile(
    text: str, aliases: AliasMap, *, task: str = "?", build_args: Mapping[str, str] | None = None
) -> tuple[str, list[str]]:
    """Every FROM (and `COPY --from=<image>`) through the alias map: new text, resolved bases."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    resolved: list[str] = []
    out: list[str] = []
    seen_from = False
    for line in text.splitlines(keepends=True):
        arg = _ARG.match(line)
        if arg and not seen_from:
            given = (build_args or {}).get(arg.group(1))
            args[arg.group(1)] = given if given is not None else (arg.group(2) or "").strip("\"'")
        bare = line.rstrip("\r\n")
        ending = line[len(bare) :]
        copy = _COPY_FROM.match(bare)
        if copy and copy.group(2) not in stages and not copy.group(2).isdigit():
            # `COPY --from=<image>`: an image, like a FROM (a stage name or index stays)
            target = aliases.resolve(copy.group(2), task=task)
            resolved.append(target)
            out.append(f"{copy.group(1)}{target}{copy.group(3)}{ending}")
            continue
        m = _FROM.match(bare)
        if not m:
            out.append(line)
            continue
        seen_from = True
        head, flags, image, rest = m.groups()
        expanded = _VAR.sub(lambda v: args.get(v.group(1) or v.group(3), v.group(2) or ""), image)
        stage = re.match(r"\s+AS\s+(\S+)", rest, re.IGNORECASE)
        if expanded.lower() == "scratch" or expanded in stages:
            target = expanded
        else:
            target = aliases.resolve(expanded, task=task)
            resolved.append(target)
        if stage:
            stages.add(stage.group(1))
        out.append(f"{head}{flags}{target}{rest}{ending}")
        if target in PYTHON_MINOR and expanded not in stages:
            out.append(python_shim(expanded) + (ending or "\n"))
    if not seen_from:
        raise TaskError(f"task {task}: the Dockerfile has no FROM line")
    if resolved and resolved[-1] in PYTHON_MINOR and not _WORKDIR.search(text):
        # The stand-in base sets WORKDIR /app; the image it stands for sets none (/).
        out.append("\nWORKDIR /\n")
    return "".join(out), resolved


def python_shim(image: str) -> str:
    """What makes a stand-in base's `python` command look like the image's."""
    name = normalize(image)
    repo = (equivalent(name) or name).partition(":")[0]
    if repo == "python":
        return "RUN rm -f /usr/bin/python && ln -sf /usr/bin/python3 /usr/local/bin/python"
    return "RUN rm -f /usr/bin/python"


def dockerfile_warnings(text: str, aliases: AliasMap) -> list[str]:
    """The unfaithful mappings of a Dockerfile's base images (see `AliasMap.fidelity`)."""
    warnings: list[str] = []
    stages: set[str] = set()
    for line in text.splitlines():
        m = _FROM.match(line) or None
        if m is None:
            continue
        image, stage = m.group(3), re.match(r"\s+AS\s+(\S+)", m.group(4), re.IGNORECASE)
        if image.lower() != "scratch" and image not in stages and "$" not in image:
            try:
                why = aliases.fidelity(image)
            except TaskError:
                why = None  # the build reports an unresolvable image
            if why and why not in warnings:
                warnings.append(why)
        if stage:
            stages.add(stage.group(1))
    return warnings
