"""Harbor's `environment/docker-compose.yaml`, run through the Docker API (no compose binary).

The agent works in the `main` service: the episode's sandbox, built from the task's
environment as ever. Every other service is a sidecar: a container of its image (``build:``
a context under environment/ with its Dockerfile, or ``image:`` through the alias map) running
its own command, on a per-episode internal network where each service answers by its name.
Sidecars start in ``depends_on`` order; ``condition: service_healthy`` waits for the
service's compose ``healthcheck`` (Docker's own), ``service_completed_successfully`` for its
exit 0; the agent starts once everything `main` depends on is up. Everything is removed with
the episode.

Honoured service keys: image, build (context; dockerfile only when it is "Dockerfile"),
environment, command, entrypoint, healthcheck, depends_on, working_dir, user, volumes; and for
main: environment, depends_on, volumes; `environment` values interpolate ${VAR} / ${VAR:-default} from the
host's environment, as `docker compose` does (done where the services start,
stacx.sandbox.environments). Other keys are reported (`compose_notes`), not silently dropped.

Limits: the network is internal and its bridge has no IPv4 address, so sidecars reach each
other and `main`, never the internet nor the host's own addresses (whatever the task's
network_mode: a sidecar that needs the internet fails here); main keeps its own policy on the
bridge.

Volumes (short `SRC:DST[:ro|rw]` or long `{type, source, target, read_only}` syntax): a named
volume, declared under the top-level `volumes:` with no options, is created for the episode
with the owner labels (so `stacx sandbox gc` collects it if orphaned), shared by the services
that mount it and removed with the episode; a bind mount must be a path inside the task's
environment/ dir that exists (read-only with `:ro`). Anything else (a host path outside the
task, `~`, an anonymous volume, volume options, an external volume) is refused when the task
loads, naming the key. Ports and named networks are not created (reported).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from pathlib import Path

import aiodocker
import msgspec
import yaml
from aiodocker.containers import DockerContainer
from aiodocker.types import JSONValue
from aiodocker.volumes import DockerVolume

from stacx.errors import SandboxError, TaskError
from stacx.sandbox.privileges import security_options

MAIN = "main"
FILES = ("docker-compose.yaml", "docker-compose.yml")
_KEYS = {"image", "build", "environment", "command", "entrypoint", "healthcheck", "depends_on",
         "working_dir", "user", "container_name", "volumes"}  # fmt: skip
_MAIN_KEYS = {"build", "environment", "depends_on", "image", "container_name", "volumes"}
_MOUNT_KEYS = {"type", "source", "target", "read_only"}


class Mount(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a service's `volumes:`."""

    source: str  # a named volume's compose name, or an absolute host path under environment/
    target: str
    read_only: bool = False
    volume: bool = False  # a named volume (one per episode), else a bind mount
_CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


class Service(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    image: str | None = None
    build_dir: str | None = None  # a build context (absolute), its Dockerfile named Dockerfile
    environment: dict[str, str] = msgspec.field(default_factory=dict)
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    healthcheck: dict[str, JSONValue] | None = None  # Docker API Healthcheck
    depends_on: dict[str, str] = msgspec.field(default_factory=dict)  # name -> condition
    working_dir: str | None = None
    user: str | None = None
    mounts: list[Mount] = msgspec.field(default_factory=list)


def binds(service: Service, volumes: dict[str, str]) -> dict[str, str]:
    """Docker's Binds for the service, as source -> target[:ro] (the form of Limits.mounts),
    its named volumes by their episode's Docker names (`volumes`: compose name -> Docker name)."""
    return {(volumes[m.source] if m.volume else m.source): m.target + (":ro" if m.read_only else "")
            for m in service.mounts}  # fmt: skip


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
                raise TaskError(f"{at} = {entry!r}: SOURCE:TARGET[:ro|rw] is required "
                                "(anonymous volumes are not supported)")  # fmt: skip
            source, target, mode = parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"
            if mode not in ("ro", "rw"):
                raise TaskError(f"{at} = {entry!r}: mode {mode!r}; accepted: ro, rw")
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            read_only = mode == "ro"
        elif isinstance(entry, dict):
            extra = sorted(set(entry) - _MOUNT_KEYS)
            if extra:
                raise TaskError(f"{at}.{extra[0]}: not supported; accepted keys: "
                                f"{', '.join(sorted(_MOUNT_KEYS))}")  # fmt: skip
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
                raise TaskError(f"{at}: volume {source!r} is not declared under the top-level "
                                "`volumes:`")  # fmt: skip
            out.append(Mount(source=source, target=target, read_only=read_only, volume=True))
            continue
        host = (env_dir / source).resolve()
        if source.startswith("~") or not host.is_relative_to(env_dir.resolve()):
            raise TaskError(f"{at}: host path {source!r} is outside the task's environment dir "
                            f"({env_dir}): refused")  # fmt: skip
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
            raise TaskError(f"{name}: volumes.{volume}.{key}: volume options are not "
                            "supported (a volume is created empty for each episode)")  # fmt: skip
    return dict(raw)


def compose_file(env_dir: Path) -> Path | None:
    return next((env_dir / f for f in FILES if (env_dir / f).is_file()), None)


def _argv(value: object) -> list[str] | None:
    if value is None:
        return None
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]  # type: ignore[attr-defined]


def _duration_ns(value: object, default_s: float) -> int:
    """Compose durations ("5s", "1m30s", "500ms", a number of seconds) in nanoseconds."""
    if value is None:
        return int(default_s * 1e9)
    if isinstance(value, int | float):
        return int(value * 1e9)
    total, number = 0.0, ""
    text = str(value).strip()
    i = 0
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    while i < len(text):
        if text[i].isdigit() or text[i] == ".":
            number += text[i]
            i += 1
            continue
        unit = "ms" if text[i : i + 2] == "ms" else "us" if text[i : i + 2] == "us" else text[i]
        if unit not in units or not number:
            raise TaskError(f"docker-compose.yaml: duration {value!r} is not like '5s'")
        total += float(number) * units[unit]
        number, i = "", i + len(unit)
    return int((total + (float(number) if number else 0.0)) * 1e9)


def _healthcheck(raw: object, where: str) -> dict[str, JSONValue] | None:
    if not isinstance(raw, dict) or raw.get("disable"):
        return None
    test = raw.get("test")
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if not isinstance(test, list) or not test:
        raise TaskError(f"{where}.healthcheck.test: a command list or string is required")
    return {
        "Test": [str(t) for t in test],
        "Interval": _duration_ns(raw.get("interval"), 30),
        "Timeout": _duration_ns(raw.get("timeout"), 30),
        "Retries": int(raw.get("retries", 3)),
        "StartPeriod": _duration_ns(raw.get("start_period"), 0),
    }


def load_compose(path: Path) -> tuple[dict[str, Service], list[str]]:
    """The services of a compose file, and notes on the keys not honoured."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: not valid YAML: {exc}") from exc
    services_raw = raw.get("services") if isinstance(raw, dict) else None
    if not isinstance(services_raw, dict):
        raise TaskError(f"{path}: no `services:` table")
    notes = [f"{path.name}: top-level {k!r} ignored" for k in raw if k not in ("services",
             "version", "name", "volumes")]  # fmt: skip
    declared = _declared_volumes(raw.get("volumes"), path.name)
    services: dict[str, Service] = {}
    for name, spec in services_raw.items():
        where = f"{path.name}: services.{name}"
        spec = spec or {}
        keys = _MAIN_KEYS if name == MAIN else _KEYS
        notes += [f"{where}.{k}: ignored" for k in spec if k not in keys]
        env = spec.get("environment") or {}
        if isinstance(env, list):
            env = {str(e).partition("=")[0]: str(e).partition("=")[2] for e in env}
        deps = spec.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {str(d): "service_started" for d in deps}
        depends = {str(d): str((c or {}).get("condition", "service_started")) for d, c in
                   deps.items()}  # fmt: skip
        for d, c in depends.items():
            if c not in _CONDITIONS:
                raise TaskError(f"{where}.depends_on.{d}.condition = {c!r}; accepted: "
                                f"{', '.join(_CONDITIONS)}")  # fmt: skip
            if d not in services_raw:
                raise TaskError(f"{where}.depends_on: no service {d!r}")
        build = spec.get("build")
        build_dir = None
        if build is not None and name != MAIN:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
            if dockerfile not in (None, "Dockerfile"):
                raise TaskError(f"{where}.build.dockerfile = {dockerfile!r}: only 'Dockerfile'")
            build_dir = str((path.parent / context).resolve())
        if name != MAIN and build_dir is None and not spec.get("image"):
            raise TaskError(f"{where}: neither image nor build")
        services[name] = Service(
            name=name, image=spec.get("image"), build_dir=build_dir,
            environment={str(k): str(v) for k, v in env.items()},
            command=_argv(spec.get("command")), entrypoint=_argv(spec.get("entrypoint")),
            healthcheck=_healthcheck(spec.get("healthcheck"), where), depends_on=depends,
            working_dir=spec.get("working_dir"),
            user=None if spec.get("user") is None else str(spec.get("user")),
            mounts=_mounts(spec["volumes"], where, path.parent, declared)
            if "volumes" in spec else [],
        )  # fmt: skip
    if MAIN not in services:
        services[MAIN] = Service(name=MAIN)
    return services, notes


def start_order(services: dict[str, Service]) -> list[str]:
    """The sidecars, each after what it depends on (a cycle is a TaskError)."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order or name == MAIN:
            return
        if name in visiting:
            raise TaskError(f"docker-compose.yaml: depends_on cycle through {name!r}")
        visiting.add(name)
        for dep in services[name].depends_on:
            visit(dep)
        order.append(name)

    for name in services:
        visit(name)
    return order


class Sidecars:
    """The running sidecars of one episode and their network; `close()` removes them."""

    def __init__(self, docker: aiodocker.Docker, network: str) -> None:
        self.docker = docker
        self.network = network
        self.containers: dict[str, DockerContainer] = {}

    async def start(
        self,
        service: Service,
        image: str,
        labels: dict[str, str],
        timeout_s: float,
        volumes: dict[str, str] | None = None,
    ) -> None:
        """Start `service` once what it depends on is ready; `volumes` maps its named volumes
        to the episode's Docker volumes (create_volumes)."""
        for dep, condition in service.depends_on.items():
            await self.wait(dep, condition, timeout_s)
        config: dict[str, JSONValue] = {
            "Image": image,
            "Env": [f"{k}={v}" for k, v in service.environment.items()],
            "Labels": {**labels, "stacx.service": service.name},
            # the same least privilege as `main` (stacx.sandbox.privileges)
            "HostConfig": {"NetworkMode": self.network, "Init": True, **security_options()},
            "NetworkingConfig": {"EndpointsConfig": {self.network: {"Aliases": [service.name]}}},
        }
        if service.mounts:
            config["HostConfig"]["Binds"] = [  # type: ignore[index]
                f"{src}:{dst}" for src, dst in binds(service, volumes or {}).items()]  # fmt: skip
        for key, value in (("Cmd", service.command), ("Entrypoint", service.entrypoint),
                           ("Healthcheck", service.healthcheck),
                           ("WorkingDir", service.working_dir), ("User", service.user)):  # fmt: skip
            if value is not None:
                config[key] = value  # type: ignore[assignment]
        try:
            container = await self.docker.containers.create(config)
            self.containers[service.name] = container
            await container.start()
        except aiodocker.DockerError as exc:
            raise SandboxError(f"compose service {service.name} ({image}): {exc}") from exc

    async def wait(self, name: str, condition: str, timeout_s: float) -> None:
        """Until service `name` meets `condition` (SandboxError with its log if it cannot)."""
        container = self.containers[name]
        deadline = time.monotonic() + timeout_s
        while True:
            state = (await container.show()).get("State") or {}
            health = (state.get("Health") or {}).get("Status")
            if condition == "service_started" and state.get("Running"):
                return
            if condition == "service_healthy" and health == "healthy":
                return
            if condition == "service_completed_successfully" and state.get("Status") == "exited":
                if state.get("ExitCode") == 0:
                    return
                raise SandboxError(f"compose service {name} exited {state.get('ExitCode')}: "
                                   f"{await self._log(container)}")  # fmt: skip
            if state.get("Status") == "exited" and condition != "service_completed_successfully":
                raise SandboxError(f"compose service {name} exited {state.get('ExitCode')}: "
                                   f"{await self._log(container)}")  # fmt: skip
            if health == "unhealthy" or time.monotonic() > deadline:
                raise SandboxError(f"compose service {name} is not {condition} "
                                   f"(health {health}): {await self._log(container)}")  # fmt: skip
            await asyncio.sleep(0.2)

    async def _log(self, container: DockerContainer) -> str:
        try:
            lines = await container.log(stdout=True, stderr=True, tail=20)
        except aiodocker.DockerError:
            return "(no log)"
        return "".join(lines)[-1500:]

    async def close(self) -> None:
        for container in self.containers.values():
            try:
                await container.delete(force=True, v=True)
            except aiodocker.DockerError as exc:
                if exc.status != 404:
                    raise SandboxError(f"cannot remove a compose service: {exc}") from exc
        await remove_network(self.docker, self.network)


async def remove_network(docker: aiodocker.Docker, name: str) -> None:
    """Remove a per-episode network, first detaching what is still on it (the pool removes
    the episode's sandbox in the background, so it may not be gone yet). Gone already: fine."""
    for attempt in range(20):  # a container being removed can re-appear as an endpoint
        try:
            network = await docker.networks.get(name)
            for container_id in (await network.show()).get("Containers") or {}:
                try:
                    await network.disconnect({"Container": container_id, "Force": True})
                except aiodocker.DockerError as exc:
                    if exc.status != 404:
                        raise
            await network.delete()
            return
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                return
            if attempt == 19:
                raise SandboxError(f"cannot remove network {name}: {exc}") from exc
            await asyncio.sleep(0.25)


async def create_volumes(
    docker: aiodocker.Docker, services: dict[str, Service], prefix: str, labels: dict[str, str]
) -> dict[str, str]:
    """One Docker volume per named volume the services mount (compose name -> Docker name,
    `<prefix>-<name>`), labeled with the episode's owner (SandboxError if Docker refuses)."""
    made: dict[str, str] = {}
    try:
        for name in sorted({m.source for s in services.values() for m in s.mounts if m.volume}):
            await docker.volumes.create({"Name": f"{prefix}-{name}", "Labels": labels})
            made[name] = f"{prefix}-{name}"
    except aiodocker.DockerError as exc:
        await remove_volumes(docker, list(made.values()))
        raise SandboxError(f"cannot create a compose volume: {exc}") from exc
    return made


async def remove_volumes(docker: aiodocker.Docker, names: list[str]) -> None:
    """Remove an episode's volumes once its containers are gone (a container being removed can
    hold one a moment longer: retried). Gone already: fine."""
    for name in names:
        for attempt in range(20):
            try:
                await DockerVolume(docker, name).delete()
                break
            except aiodocker.DockerError as exc:
                if exc.status == 404:
                    break
                if exc.status != 409 or attempt == 19:
                    raise SandboxError(f"cannot remove volume {name}: {exc}") from exc
                await asyncio.sleep(0.25)
