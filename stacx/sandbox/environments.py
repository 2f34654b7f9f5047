"""The `Environments` port over Docker: task images, the warm pool, the verifier, failures mapped to
FailureKind (raised as InfraFailure), artifacts copied out, each phase on its network policy; a
sandbox is never reused after an episode.

Design: docs/sandboxes.md#the-docker-backend
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Self

import aiodocker
import msgspec

from stacx.errors import SandboxError, TaskError
from stacx.events import Emit, EpisodeWarned, FailureKind, derive_id, new_id
from stacx.harbor.model import ArtifactConfig
from stacx.harbor.task_network import episode_network, network_mode
from stacx.harbor.tasks import verifier_separate
from stacx.ports import InfraFailure, Limits, Sandbox, StepFailed, Task, Verdict
from stacx.sandbox.aliases import AliasMap, dockerfile_warnings
from stacx.sandbox.build import BuildOptions, build_task_image, local_image
from stacx.sandbox.compose import (
    MAIN,
    Service,
    Sidecars,
    binds,
    compose_file,
    create_volumes,
    internal_network,
    load_compose,
    remove_volumes,
    start_order,
)
from stacx.sandbox.docker import DockerSandbox, owner_labels
from stacx.sandbox.egress import Egress, proxy_env
from stacx.sandbox.layers import ImageLayer, layered_image, layered_limits
from stacx.sandbox.lifecycle import Lifecycle
from stacx.sandbox.limits import task_limits
from stacx.sandbox.pool import SandboxPool
from stacx.sandbox.steps import start_step
from stacx.sandbox.verifier import VerifierOutcome, run_verifier, verdict

SERVICE_TIMEOUT_S = 120.0  # for a compose service to be started / healthy / done


@dataclasses.dataclass
class _Plan:
    """What one episode starts (`DockerEnvironments._plan`)."""

    image: str
    limits: Limits
    services: dict[str, Service]
    order: list[str]
    hosts: list[str] | None
    switching: bool
    fresh: bool = False


class DockerEnvironments(Lifecycle):
    """Docker-backed `Environments`; an async context manager owning a client and a pool."""

    start_errors = (SandboxError, TaskError, aiodocker.DockerError)

    def __init__(
        self,
        *,
        run_id: str,
        emit: Emit | None = None,
        warm: int = 0,
        aliases: AliasMap | None = None,
        layer: ImageLayer | None = None,
        artifacts_dir: Path | None = None,
        runtime: str = "",
    ) -> None:
        super().__init__(run_id=run_id, emit=emit)
        self.runtime = runtime  # the OCI runtime ("": $STACX_SANDBOX_RUNTIME, else runc)
        self.artifacts_dir = artifacts_dir  # where artifacts go (<run dir>/artifacts)
        # an installed scaffold's layer over every task image: network none, its socket mounted
        self.layer = layer
        self.warm = warm  # ready containers kept per (image, limits); 0: start on demand
        self.aliases = aliases  # base-image aliases for builds; None: $STACX_IMAGE_ALIASES
        self._docker: aiodocker.Docker | None = None
        self._pool: SandboxPool | None = None
        self._egress: dict[str, Egress] = {}  # episode -> its allowlist network and proxy

    async def __aenter__(self) -> Self:
        self._docker = aiodocker.Docker()
        self._pool = SandboxPool(
            size=self.warm,
            run_id=self.run_id,
            emit=self.emit,
            docker=self._docker,
            runtime=self.runtime,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._docker is not None:
            await self._docker.close()

    async def _plan(self, task: Task, episode_id: str) -> _Plan:
        """What an episode of `task` starts: image, limits, compose services, first network."""
        assert self._docker is not None
        # before the build: the warning explains a build that fails (pinned wheels of another
        # Python), so every episode of the task records it, built or not
        warnings = await self._warn(task, episode_id)
        unfaithful = "".join(f"\n{w}" for w in warnings)  # on the failure, too
        try:
            image = await build_task_image(task, self._docker, self.aliases)
            limits = task_limits(task)
        except (TaskError, aiodocker.DockerError) as exc:
            raise InfraFailure(FailureKind.IMAGE_BUILD, f"{exc}{unfaithful}") from exc
        phases, hosts = episode_network(task)
        compose = compose_file(task.environment_dir)
        try:
            services = load_compose(compose)[0] if compose else {}
            sidecar_order = start_order(services)
        except TaskError as exc:
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        if sidecar_order:  # main joins the services' network, so it cannot start on none
            limits = msgspec.structs.replace(
                limits, env={**services[MAIN].environment, **limits.env}
            )
        if hosts is not None:  # the proxy's address, fixed for the container's life
            limits = msgspec.structs.replace(limits, env={**proxy_env(), **limits.env})
        switching = len(phases) > 1 or bool(sidecar_order) or hosts is not None
        if switching:  # start on the bridge, switch at each phase
            limits = msgspec.structs.replace(limits, allow_internet=True)
        if self.layer is not None:  # after the phase policy: the scaffold never gets a route out
            try:
                image = await layered_image(self._docker, image, self.layer)
            except (TaskError, aiodocker.DockerError) as exc:
                raise InfraFailure(FailureKind.IMAGE_BUILD, f"{exc}{unfaithful}") from exc
            limits = layered_limits(limits, self.layer)
        return _Plan(image, limits, services, sidecar_order, hosts, switching)

    async def _start(
        self, stack: contextlib.AsyncExitStack, task: Task, episode_id: str
    ) -> DockerSandbox:
        """Start the episode's volumes, proxy, sandbox, services (each undone by `stack`), wait
        until it is healthy and its first step is set up."""
        assert self._pool is not None and self._docker is not None, "use `async with`"
        pool, docker = self._pool, self._docker
        plan = await self._plan(task, episode_id)  # InfraFailure IMAGE_BUILD
        labels = owner_labels(self.run_id, episode_id)
        name = f"stacx-{episode_id[:16]}-{new_id()[:6]}"
        volumes: dict[str, str] = {}
        if any(s.mounts for s in plan.services.values()):
            # created for this episode before main (Docker fixes mounts at creation), so main
            # is started cold and never pooled; removed after everything
            volumes = await create_volumes(docker, plan.services, name, labels)
            stack.push_async_callback(remove_volumes, docker, list(volumes.values()))
            main_mounts = binds(plan.services[MAIN], volumes)
            plan.fresh = bool(main_mounts)
            plan.limits = msgspec.structs.replace(
                plan.limits, mounts={**plan.limits.mounts, **main_mounts}
            )
        egress: Egress | None = None
        if plan.hosts is not None:
            egress = await Egress.start(docker, f"{name}-egress", plan.hosts, labels)
            self._egress[episode_id] = egress
            stack.push_async_callback(egress.close)
            stack.callback(self._egress.pop, episode_id, None)
        sandbox = await pool.acquire(
            plan.image, plan.limits, episode_id=episode_id, fresh=plan.fresh
        )
        reason = "services failed"  # SandboxStopped's reason, once the sandbox is released
        stack.push_async_callback(lambda: pool.release(sandbox, reason=reason))
        if plan.order:
            sidecars = await self._start_services(task, plan, sandbox, name, volumes)
            stack.push_async_callback(sidecars.close)
        if plan.switching:
            first = task.step_tasks[0] if task.step_tasks else task
            await _switch(sandbox, network_mode(first, "agent"), egress)
        reason = "unhealthy"
        await self._ready(sandbox, task, episode_id)
        reason = "released"
        return sandbox

    async def _start_services(
        self,
        task: Task,
        plan: _Plan,
        sandbox: DockerSandbox,
        name: str,
        volumes: dict[str, str],
    ) -> Sidecars:
        """The compose sidecars on network `name`, `main` on it; removed if any fails."""
        assert self._docker is not None
        labels = owner_labels(self.run_id, sandbox.episode_id)
        network = await internal_network(self._docker, name, labels)
        sidecars = Sidecars(self._docker, name)
        try:
            for service_name in plan.order:
                service = plan.services[service_name]
                if service.build_dir is not None:
                    image = await build_task_image(
                        task,
                        self._docker,
                        self.aliases,
                        env_dir=Path(service.build_dir),
                        variant=service_name,
                        options=BuildOptions(
                            dockerfile=service.dockerfile,
                            args=service.build_args,
                            target=service.build_target,
                        ),
                    )
                else:
                    assert service.image is not None
                    aliases = self.aliases or AliasMap.from_env()
                    image = await local_image(
                        self._docker, aliases, service.image, task=task.task_id
                    )
                await sidecars.start(service, image, labels, SERVICE_TIMEOUT_S, volumes)
            for dep, condition in plan.services[MAIN].depends_on.items():
                await sidecars.wait(dep, condition, SERVICE_TIMEOUT_S)
            await network.connect({"Container": sandbox.id, "EndpointConfig": {"Aliases": [MAIN]}})
        except BaseException:
            await sidecars.close()
            raise
        return sidecars

    async def _warn(self, task: Task, episode_id: str) -> list[str]:
        """Record the task.toml keys not honoured and the bases' stand-ins; return the latter."""
        dockerfile = task.environment_dir / "Dockerfile"
        aliases = self.aliases or AliasMap.from_env()
        try:
            messages = (
                dockerfile_warnings(dockerfile.read_text(), aliases) if dockerfile.is_file() else []
            )
        except SandboxError:  # no Docker engine to ask: the build that follows reports it
            messages = []
        for i, message in enumerate([*(f"task.toml: {n}" for n in task.notes), *messages]):
            if self.emit is not None:
                await self.emit(
                    EpisodeWarned(
                        run_id=self.run_id,
                        event_id=derive_id(episode_id, "EpisodeWarned", i),
                        episode_id=episode_id,
                        task_id=task.task_id,
                        message=message,
                    )
                )
        return [f"fidelity: {m}" for m in messages]

    async def verify(self, sandbox: Sandbox, task: Task, *, episode_id: str) -> Verdict:
        """Run the verifier (here or apart), keep the artifacts, then set up a next step if any."""
        agent_mode, verifier_mode = network_mode(task, "agent"), network_mode(task, "verifier")
        egress = self._egress.get(episode_id)
        multi = self._multi.get(episode_id) if task.step else None
        step, parent = (task.step, multi) if multi is not None else (None, task)
        try:
            if verifier_separate(task.config):  # handed over first; the agent's side is done
                artifacts = await self._collect(sandbox, parent, step, episode_id)
                outcome = await self._verify_separate(task, artifacts, episode_id)
            else:  # kept after the verifier ran, as Harbor does
                if agent_mode != verifier_mode:
                    await _switch(sandbox, verifier_mode, egress)
                outcome = await run_verifier(sandbox, task)
                if agent_mode != verifier_mode:  # the next step's agent phase
                    await _switch(sandbox, agent_mode, egress)
                await self._collect(sandbox, parent, step, episode_id)
        except SandboxError as exc:
            raise InfraFailure(FailureKind.EXEC_TRANSPORT, str(exc)) from exc
        result = verdict(outcome)
        await self._next_step(sandbox, task, result, episode_id)
        return result

    async def verify_artifacts(self, task: Task, kept: Path, *, episode_id: str) -> Verdict:
        """A separate verifier on artifacts an earlier episode left under `kept` (regrade)."""
        if not verifier_separate(task.config):
            raise TaskError(f"task {task.task_id}: its verifier is not separate; replay instead")
        try:
            return verdict(
                await self._verify_separate(task, kept_artifacts(task, kept), episode_id)
            )
        except SandboxError as exc:
            raise InfraFailure(FailureKind.EXEC_TRANSPORT, str(exc)) from exc

    async def _start_step(
        self, sandbox: Sandbox, multi: Task, name: str, verified: Verdict | None, episode_id: str
    ) -> None:
        """steps.start_step, collecting a failed step's artifacts before its StepFailed."""
        try:
            await start_step(sandbox, multi, name, verified)
        except StepFailed:
            await self._collect(sandbox, multi, name, episode_id)
            raise

    async def _collect(
        self, sandbox: Sandbox, task: Task, step: str | None, episode_id: str
    ) -> list[tuple[str, Path]]:
        """Harbor's collection pass: /logs/artifacts, the task's artifacts, those of its `step`,
        into <artifacts_dir>/<episode> (a step's: its steps/<name>/artifacts); the (container,
        host) paths found."""
        own = next(s.artifacts for s in task.config.steps or [] if s.name == step) if step else []
        artifacts = [*task.config.artifacts, *own]
        base = self.artifacts_dir or Path(tempfile.gettempdir()) / "stacx-artifacts" / self.run_id
        root = base / episode_id / "steps" / step / "artifacts" if step else base / episode_id
        if not isinstance(sandbox, DockerSandbox):
            if artifacts:
                raise SandboxError(f"{type(sandbox).__name__} cannot collect artifacts")
            return []
        found: list[tuple[str, Path]] = []
        with tempfile.TemporaryDirectory() as tmp:
            if await _fetch(sandbox, CONVENTION, Path(tmp), []):
                for item in sorted((Path(tmp) / PurePosixPath(CONVENTION).name).iterdir()):
                    _replace(item, root / item.name)
                    found.append((f"{CONVENTION}/{item.name}", root / item.name))
        for a, dest in _placed(artifacts, root):
            with tempfile.TemporaryDirectory() as tmp:
                if await _fetch(sandbox, a.source, Path(tmp), a.exclude):
                    _replace(Path(tmp) / PurePosixPath(a.source).name, dest)
                    found.append((a.source, dest))
        return found

    async def _verify_separate(
        self, task: Task, artifacts: list[tuple[str, Path]], episode_id: str
    ) -> VerifierOutcome:
        """Harbor's separate verifier: a container of its own, given only the artifacts."""
        assert self._pool is not None and self._docker is not None
        own = task.config.verifier.environment
        environment = own or task.config.environment
        try:
            if (task.tests_dir / "Dockerfile").is_file() or (own and own.docker_image):
                image = await build_task_image(
                    task,
                    self._docker,
                    self.aliases,
                    env_dir=task.tests_dir,
                    docker_image=own.docker_image if own else None,
                    variant="verifier",
                )
            else:
                image = await build_task_image(task, self._docker, self.aliases)
        except (TaskError, aiodocker.DockerError) as exc:
            raise InfraFailure(FailureKind.IMAGE_BUILD, f"verifier image: {exc}") from exc
        vtask = msgspec.structs.replace(
            task, config=msgspec.structs.replace(task.config, environment=environment)
        )
        mode = network_mode(task, "verifier")
        limits = task_limits(vtask)
        egress = self._egress.get(episode_id) if mode == "allowlist" else None
        limits = msgspec.structs.replace(
            limits,
            allow_internet=mode == "public" or egress is not None,  # then switched
            env={**proxy_env(), **limits.env} if egress is not None else limits.env,
        )
        try:
            vsandbox = await self._pool.acquire(image, limits, episode_id=episode_id)
        except (SandboxError, aiodocker.DockerError) as exc:
            raise InfraFailure(FailureKind.START, f"verifier sandbox: {exc}") from exc
        try:
            if egress is not None:
                await _switch(vsandbox, mode, egress)
            for source, host in artifacts:
                if host.is_dir():
                    await vsandbox.upload_dir(str(host), source)
                else:
                    await vsandbox.write_file(source, host.read_bytes())
            return await run_verifier(vsandbox, vtask)
        finally:
            await self._pool.release(vsandbox, reason="verified")


async def _switch(sandbox: Sandbox, mode: str, egress: Egress | None) -> None:
    """Put the sandbox on the networks of `mode`: the bridge, the allowlist network, or neither."""
    if isinstance(sandbox, DockerSandbox):
        await sandbox.set_network(mode == "public")
        if egress is not None:
            await sandbox.attach(egress.network, mode == "allowlist")
        elif mode == "allowlist":
            raise SandboxError(f"sandbox {sandbox.name}: an allowlist phase with no proxy")
    else:  # another backend (a remote sandbox) must not silently keep the wrong policy
        raise SandboxError(
            f"{type(sandbox).__name__} cannot switch networks between phases "
            "(the task's agent and verifier network_mode differ)"
        )


CONVENTION = "/logs/artifacts"  # what the agent leaves here is an artifact without being listed


async def _fetch(sandbox: DockerSandbox, source: str, into: Path, exclude: list[str]) -> bool:
    """Extract `source` into `into` (minus `exclude` patterns); False if absent."""
    try:
        tar = await sandbox.container.get_archive(source)
    except aiodocker.DockerError as exc:
        if exc.status == 404:
            return False
        raise SandboxError(f"artifact {source}: {exc}") from exc
    with tar:
        members = [
            m
            for m in tar.getmembers()
            if not any(
                fnmatch.fnmatch(m.name, p) or fnmatch.fnmatch(m.name.split("/", 1)[-1], p)
                for p in exclude
            )
        ]
        tar.extractall(into, members=members, filter="data")
    return True


def kept_artifacts(task: Task, kept: Path) -> list[tuple[str, Path]]:
    """(container path, host path) of the artifacts `_collect` kept under `kept`."""
    declared = [
        (a.source, dest) for a, dest in _placed(task.config.artifacts, kept) if dest.exists()
    ]
    named = {host for _, host in declared}
    convention = [
        (f"{CONVENTION}/{item.name}", item)
        for item in sorted(kept.iterdir())
        if item not in named and item.name != "steps"
    ]
    return convention + declared


def _placed(artifacts: list[str | ArtifactConfig], root: Path) -> list[tuple[ArtifactConfig, Path]]:
    """Each artifact (a bare path: its source) and where it is kept under `root`."""
    full = [a if isinstance(a, ArtifactConfig) else ArtifactConfig(source=a) for a in artifacts]
    return [(a, root / (a.destination or PurePosixPath(a.source).name)) for a in full]


def _replace(src: Path, dest: Path) -> None:
    """Move `src` to `dest`, replacing what is there."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    dest.unlink(missing_ok=True)
    shutil.move(src, dest)
