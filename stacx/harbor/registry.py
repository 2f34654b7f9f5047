"""Harbor's dataset registry: registry.json and dataset.toml manifests, resolved to task directories
fetched from git at their pinned commits, through a cache (each repository cloned once, each task
exported once per commit). Any URL git can clone; no HTTP package registry.

Design: docs/tasks.md#registries-download-prepare-build-eval
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import tomllib
import urllib.request
from collections.abc import Callable
from pathlib import Path

import msgspec

from stacx.errors import StacxError

DEFAULT_REGISTRY = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"


class RegistryTask(msgspec.Struct, frozen=True, kw_only=True):
    name: str | None = None
    git_url: str | None = None
    git_commit_id: str | None = None
    path: str = ""
    digest: str | None = None  # Harbor's package registry; not resolvable here


class Dataset(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    version: str = "head"
    description: str = ""
    tasks: list[RegistryTask] = msgspec.field(default_factory=list)
    root: str = ""  # the manifest's directory (for local task entries)


class Fetched(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    path: str
    cached: bool


def _read(source: str) -> tuple[str, Path | None]:
    """The text of a file path or URL (file://, http(s)://), and its directory if local."""
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=30) as resp:
                return resp.read().decode(), None
        except OSError as exc:
            raise StacxError(f"--registry {source}: cannot fetch it: {exc}") from exc
    path = Path(source.removeprefix("file://")).expanduser()
    if not path.is_file():
        raise StacxError(f"--registry {source}: no such file")
    return path.read_text(), path.resolve().parent


def load_registry(source: str) -> list[Dataset]:
    """The datasets of a registry.json or a dataset.toml (path or URL)."""
    text, root = _read(source)
    where = f"--registry {source}"
    if source.endswith(".toml"):
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise StacxError(f"{where}: not valid TOML: {exc}") from exc
        head = raw.get("dataset", raw)
        data: object = [
            {
                "name": head.get("name", ""),
                "version": str(head.get("version", "head")),
                "description": head.get("description", ""),
                "tasks": raw.get("tasks", []),
            }
        ]
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise StacxError(f"{where}: not valid JSON: {exc}") from exc
    try:
        datasets = msgspec.convert(data, list[Dataset], strict=False)
    except msgspec.ValidationError as exc:
        raise StacxError(f"{where}: not a Harbor registry: {exc}") from exc
    return [msgspec.structs.replace(d, root=str(root or "")) for d in datasets]


def resolve(datasets: list[Dataset], spec: str, *, where: str = "dataset") -> Dataset:
    """`name@version` (or `name`, when the registry has one version of it) -> the dataset."""
    name, _, version = spec.partition("@")
    named = [d for d in datasets if d.name == name]
    if not named:
        known = sorted({d.name for d in datasets})
        raise StacxError(f"{where} {spec!r}: no dataset named {name!r}; known: {', '.join(known)}")
    versions = ", ".join(d.version for d in named)
    if version:
        found = [d for d in named if d.version == version]
        if not found:
            raise StacxError(f"{where} {spec!r}: no version {version!r}; known: {versions}")
        return found[0]
    if len(named) > 1:
        raise StacxError(f"{where} {spec!r}: several versions ({versions}); say NAME@VERSION")
    return named[0]


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StacxError(f"git {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def _commit(repo: Path, url: str, commit: str | None) -> str:
    """The full commit id in the cached clone `repo` (fetched from `url` when missing)."""
    if not commit or commit.lower() == "head":
        _git("fetch", "--quiet", url, "HEAD", cwd=repo)
        return _git("rev-parse", "FETCH_HEAD", cwd=repo)
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", cwd=repo)
    except StacxError:
        _git("fetch", "--quiet", url, commit, cwd=repo)
        return _git("rev-parse", "--verify", f"{commit}^{{commit}}", cwd=repo)


def fetch_task(task: RegistryTask, cache: Path) -> tuple[Path, bool]:
    """The task's directory in the cache, and whether it was there already."""
    assert task.git_url is not None
    repo = cache / "git" / _key(task.git_url)
    if not repo.is_dir():
        repo.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=repo.parent, prefix=".clone-"))
        _git("clone", "--quiet", "--bare", task.git_url, str(tmp))
        tmp.rename(repo)
    commit = _commit(repo, task.git_url, task.git_commit_id)
    sub = task.path.strip("/")
    dest = cache / "tasks" / _key(task.git_url) / commit / (sub or "_root")
    if dest.is_dir():
        return dest, True
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".export-"))
    try:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit, *([sub] if sub else [])],
            cwd=repo,
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise StacxError(
                f"task {task.name or sub}: {task.path!r} is not in {task.git_url} at {commit}: "
                f"{archive.stderr.decode().strip()}"
            )
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        (staging / sub if sub else staging).rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest, False


def download(
    dataset: Dataset,
    output: Path,
    *,
    cache: Path,
    task_names: list[str] | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> list[Fetched]:
    """Fetch the dataset's tasks (or those named in `task_names`) into `output/<name>`."""
    tasks = dataset.tasks
    names = [t.name or Path(t.path).name for t in tasks]
    if task_names is not None:
        unknown = sorted(set(task_names) - set(names))
        if unknown:
            raise StacxError(
                f"--task-names-file: {unknown} are not tasks of {dataset.name}@{dataset.version}"
            )
        tasks = [t for t, n in zip(tasks, names, strict=True) if n in task_names]
    output.mkdir(parents=True, exist_ok=True)
    out: list[Fetched] = []
    for task in tasks:
        name = (task.name or Path(task.path).name).split("/")[-1]
        if task.git_url:
            src, cached = fetch_task(task, cache)
        elif task.digest and not task.path:
            raise StacxError(
                f"task {task.name}: pinned by digest {task.digest} only, which needs Harbor's "
                "package registry service (not reachable here); give git_url/git_commit_id/path"
            )
        else:
            src, cached = Path(dataset.root) / (task.path or name), True
            if not src.is_dir():
                raise StacxError(f"task {task.name}: no directory {src} next to the manifest")
        dest = output / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest, symlinks=True)
        out.append(Fetched(name=name, path=str(dest), cached=cached))
        log(f"{'cached ' if cached else 'fetched'} {name} -> {dest}")
    return out
