"""The `Environments` port (stacx.ports) over Docker: task images, the warm pool, the verifier,
with their failures mapped to FailureKind (raised as InfraFailure). stacx.launch hands it to
the rollout manager.

Guarantees: every failure of the build, start, healthcheck or verifier has its kind (a failed
step of a multi-step task is StepFailed, after its artifacts are collected); the artifacts are
copied to <run dir>/artifacts/<episode>/; each phase gets its task's network policy; a sandbox is
never reused after an episode (the pool destroys it on release).

Specification: docs/sandboxes.md#the-docker-backend
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Self

import aiodocker
import msgspec

from stacx.errors import SandboxError, TaskError
from stacx.events import Emit, EpisodeWarned, FailureKind, derive_id, new_id
from stacx.harbor.model import ArtifactConfig
from stacx.harbor.task_network import episode_network, network_mode
from stacx.harbor.tasks import load_task, task_limits, verifier_separate
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
    load_compose,
    remove_volumes,
    start_order,
)
from stacx.sandbox.docker import DockerSandbox, owner_labels
from stacx.sandbox.egress import Egress, proxy_env
from stacx.sandbox.health import wait_healthy
from stacx.sandbox.layers import ImageLayer, layered_image, layered_limits
from stacx.sandbox.pool import SandboxPool
from stacx.sandbox.steps import following, start_step
from stacx.sandbox.verifier import VerifierOutcome, run_verifier, verdict

SERVICE_TIMEOUT_S = 120.0  # for a compose service to be started / healthy / done


@dataclasses.dataclass
class _Plan:
    """What one episode starts (DockerEnvironments._plan): the image, the sandbox's limits
    (compose volumes' mounts added once created), the compose services and their start
    order, the allowlist's hosts, whether the network switches per phase, and whether the
    sandbox must be started cold (it mounts the episode's own volumes)."""

    image: str
    limits: Limits
    services: dict[str, Service]
    order: list[str]
    hosts: list[str] | None
    switching: bool
    fresh: bool = False


class DockerEnvironments:
    """Docker-backed `Environments`; an async context manager owning a client and a pool."""

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
        self.run_id = run_id
        self.runtime = (
            runtime  # sandbox.runtime: the OCI runtime ("": runc, or $STACX_SANDBOX_RUNTIME)
        )
        self.artifacts_dir = artifacts_dir  # where artifacts go (<run dir>/artifacts)
        # an installed scaffold's layer over every task image: network none, its socket mounted
        self.layer = layer
        self.emit = emit
        self.warm = warm  # ready containers kept per (image, limits); 0: start on demand
        self.aliases = aliases  # base-image aliases for builds; None: $STACX_IMAGE_ALIASES
        self._docker: aiodocker.Docker | None = None
        self._pool: SandboxPool | None = None
        self._egress: dict[str, Egress] = {}  # episode -> its allowlist network and proxy
        self._multi: dict[str, Task] = {}  # episode -> its multi-step task (steps' own keys)

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

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._docker is not None:
            await self._docker.close()

    def task(self, path: str) -> Task:
        return load_task(path)

    @contextlib.asynccontextmanager
    async def sandbox(self, task: Task, *, episode_id: str) -> AsyncIterator[Sandbox]:
        assert self._pool is not None and self._docker is not None, "use `async with`"
        plan = await self._plan(task, episode_id)
        # compose volumes: created for this episode before main (Docker fixes mounts at
        # creation), so main is started cold and never pooled; removed after everything
        volumes: dict[str, str] = {}
        try:
            if any(s.mounts for s in plan.services.values()):
                volumes = await create_volumes(
                    self._docker,
                    plan.services,
                    f"stacx-{episode_id[:16]}-{new_id()[:6]}",
                    owner_labels(self.run_id, episode_id),
                )
                main_mounts = binds(plan.services[MAIN], volumes)
                plan.fresh = bool(main_mounts)
                plan.limits = msgspec.structs.replace(
                    plan.limits, mounts={**plan.limits.mounts, **main_mounts}
                )
        except SandboxError as exc:
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        try:
            sandbox, sidecars = await self._start(task, plan, episode_id, volumes)
            if task.step_tasks:
                self._multi[episode_id] = task
            try:
                yield sandbox
            finally:
                self._multi.pop(episode_id, None)
                await self._pool.release(sandbox)
                if sidecars is not None:
                    await sidecars.close()
                await self._close_egress(episode_id)
        finally:
            await remove_volumes(self._docker, list(volumes.values()))

    async def _plan(self, task: Task, episode_id: str) -> _Plan:
        """What an episode of `task` starts: its image (built, then layered), the sandbox's
        limits, the compose services, and the network it starts on (the bridge when it must
        switch between phases)."""
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
            sidecar_order = start_order(services) if services else []
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
        return _Plan(
            image=image,
            limits=limits,
            services=services,
            order=sidecar_order,
            hosts=hosts,
            switching=switching,
        )

    async def _start(
        self, task: Task, plan: _Plan, episode_id: str, volumes: dict[str, str]
    ) -> tuple[DockerSandbox, Sidecars | None]:
        """Start the episode's egress proxy, sandbox and services, switch it to the agent's
        network, and wait until it is healthy (and the first step is set up); what started is
        released again on a failure (an InfraFailure, or the first step's StepFailed)."""
        assert self._pool is not None and self._docker is not None
        sidecars: Sidecars | None = None
        egress: Egress | None = None
        try:
            if plan.hosts is not None:
                egress = await Egress.start(
                    self._docker,
                    f"stacx-{episode_id[:16]}-{new_id()[:6]}-egress",
                    plan.hosts,
                    owner_labels(self.run_id, episode_id),
                )
                self._egress[episode_id] = egress
            sandbox = await self._pool.acquire(
                plan.image, plan.limits, episode_id=episode_id, fresh=plan.fresh
            )
        except (SandboxError, aiodocker.DockerError) as exc:
            await self._close_egress(episode_id)
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        try:
            if plan.order:
                sidecars = await self._start_services(
                    task, plan.services, plan.order, sandbox, episode_id, volumes
                )
            if plan.switching:
                await _switch(
                    sandbox,
                    network_mode(task.step_tasks[0] if task.step_tasks else task, "agent"),
                    egress,
                )
        except (SandboxError, TaskError, aiodocker.DockerError) as exc:
            await self._pool.release(sandbox, reason="services failed")
            await self._close_egress(episode_id)
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        healthcheck = task.config.environment.healthcheck
        try:  # the agent starts once the services are up (and the first step is set up)
            if healthcheck is not None:
                await wait_healthy(sandbox, healthcheck)
            if task.step_tasks:
                await self._start_step(
                    sandbox, task, task.step_tasks[0].step or "", None, episode_id
                )
        except (SandboxError, aiodocker.DockerError, StepFailed) as exc:
            await self._pool.release(sandbox, reason="unhealthy")
            if sidecars is not None:
                await sidecars.close()
            await self._close_egress(episode_id)
            if isinstance(exc, StepFailed):  # the first step's, not the sandbox's
                raise
            raise InfraFailure(FailureKind.START, str(exc)) from exc
        return sandbox, sidecars

    async def _close_egress(self, episode_id: str) -> None:
        egress = self._egress.pop(episode_id, None)
        if egress is not None:
            await egress.close()

    async def _start_services(
        self,
        task: Task,
        services: dict[str, Service],
        order: list[str],
        sandbox: Sandbox,
        episode_id: str,
        volumes: dict[str, str],
    ) -> Sidecars:
        """The compose sidecars on a per-episode internal network, `main` joined to it (see
        stacx.sandbox.compose); removed again if any fails."""
        assert self._docker is not None
        if not isinstance(sandbox, DockerSandbox):
            raise SandboxError(f"{type(sandbox).__name__} cannot join compose services")
        labels = owner_labels(self.run_id, episode_id)
        name = f"stacx-{episode_id[:16]}-{sandbox.name[-6:]}"
        # Internal alone still routes to the host's own addresses (the bridge's gateway IP,
        # where any host service listening on 0.0.0.0 answers); with no IPv4 address on the
        # bridge the services reach each other and nothing else.
        network = await self._docker.networks.create(
            {
                "Name": name,
                "Internal": True,
                "Labels": labels,
                "CheckDuplicate": True,
                "Options": {"com.docker.network.bridge.inhibit_ipv4": "true"},
            }
        )
        sidecars = Sidecars(self._docker, name)
        timeout = SERVICE_TIMEOUT_S
        try:
            for service_name in order:
                service = services[service_name]
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
                await sidecars.start(service, image, labels, timeout, volumes)
            for dep, condition in services[MAIN].depends_on.items():
                await sidecars.wait(dep, condition, timeout)
            await network.connect({"Container": sandbox.id, "EndpointConfig": {"Aliases": [MAIN]}})
        except BaseException:
            await sidecars.close()
            raise
        return sidecars

    async def _warn(self, task: Task, episode_id: str) -> list[str]:
        """Record on the episode what is not faithful to the task as written: its task.toml
        keys not honoured (unknown ones with the nearest known key), its base images'
        stand-ins; return the latter (fidelity)."""
        dockerfile = task.environment_dir / "Dockerfile"
        aliases = self.aliases or AliasMap.from_env()
        try:
            messages = (
                dockerfile_warnings(dockerfile.read_text(), aliases) if dockerfile.is_file() else []
            )
        except SandboxError:  # no Docker engine to ask: the build that follows reports it
            messages = []
        emit = self.emit
        notes = [f"task.toml: {n}" for n in task.notes]
        for i, message in enumerate([*notes, *messages] if emit is not None else []):
            assert emit is not None
            await emit(
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
        """Run the task's verifier (here, or in a separate container handed the artifacts)
        and keep the artifacts; for a step of a multi-step task then run the next step's
        setup and healthcheck (StepFailed if they fail)."""
        agent_mode, verifier_mode = network_mode(task, "agent"), network_mode(task, "verifier")
        egress = self._egress.get(episode_id)
        multi = self._multi.get(episode_id) if task.step else None
        step = None
        if multi is not None:
            step = next(s for s in multi.config.steps or [] if s.name == task.step)
        # Harbor's collection pass: /logs/artifacts, the task's artifacts, the step's own
        wanted = [*task.config.artifacts, *(step.artifacts if step else [])]
        root = self._artifacts_root(episode_id, step.name if step else None)
        try:
            if verifier_separate(task.config):  # handed over first; the agent's side is done
                artifacts = await self._collect(sandbox, wanted, root)
                outcome = await self._verify_separate(task, artifacts, episode_id)
            else:  # kept after the verifier ran, as Harbor does
                if agent_mode != verifier_mode:
                    await _switch(sandbox, verifier_mode, egress)
                outcome = await run_verifier(sandbox, task)
                if agent_mode != verifier_mode:  # the next step's agent phase
                    await _switch(sandbox, agent_mode, egress)
                await self._collect(sandbox, wanted, root)
        except SandboxError as exc:
            raise InfraFailure(FailureKind.EXEC_TRANSPORT, str(exc)) from exc
        result = verdict(outcome)
        after = following(multi, step.name, result) if multi and step else None
        if multi is not None and after is not None:
            try:
                await self._start_step(sandbox, multi, after, result, episode_id)
            except (SandboxError, aiodocker.DockerError) as exc:
                raise InfraFailure(FailureKind.START, str(exc)) from exc
        return result

    async def verify_artifacts(self, task: Task, kept: Path, *, episode_id: str) -> Verdict:
        """A separate verifier run on artifacts an earlier episode left under `kept` (its
        ``<artifacts_dir>/<episode>``; `stacx regrade`), handed over at the paths they were
        collected from, as right after that episode's agent: the declared artifacts, then what
        else is there (``/logs/artifacts``). Only for tasks whose verifier is separate (a
        shared one sees the agent's whole container, not just the artifacts)."""
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
        """stacx.sandbox.steps.start_step; when it raises StepFailed (the runner's to record),
        the failed step's artifacts are still collected first, as Harbor's trial does."""
        try:
            await start_step(sandbox, multi, name, verified)
        except StepFailed:
            step = next(s for s in multi.config.steps or [] if s.name == name)
            await self._collect(
                sandbox,
                [*multi.config.artifacts, *step.artifacts],
                self._artifacts_root(episode_id, name),
            )
            raise

    def _artifacts_root(self, episode_id: str, step: str | None) -> Path:
        """<artifacts_dir>/<episode>, and for a step of a multi-step task, under it
        steps/<name>/artifacts (Harbor's trial layout)."""
        base = self.artifacts_dir or Path(tempfile.gettempdir()) / "stacx-artifacts" / self.run_id
        root = base / episode_id
        return root / "steps" / step / "artifacts" if step else root

    async def _collect(
        self, sandbox: Sandbox, artifacts: list[str | ArtifactConfig], root: Path
    ) -> list[tuple[str, Path]]:
        """Copy what the agent's container holds under /logs/artifacts (Harbor's convention
        dir) into <root>/, then each of `artifacts` into <root>/<destination, else the
        source's base name>; (path in the container, host path) of each thing found (a
        missing source is left out: the verifier decides what its absence means)."""
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
        for a in artifacts:
            a = a if isinstance(a, ArtifactConfig) else ArtifactConfig(source=a)
            dest = root / (a.destination or PurePosixPath(a.source).name)
            with tempfile.TemporaryDirectory() as tmp:
                if await _fetch(sandbox, a.source, Path(tmp), a.exclude):
                    _replace(Path(tmp) / PurePosixPath(a.source).name, dest)
                    found.append((a.source, dest))
        return found

    async def _verify_separate(
        self, task: Task, artifacts: list[tuple[str, Path]], episode_id: str
    ) -> VerifierOutcome:
        """Harbor's separate verifier: a container of its own (tests/Dockerfile, else
        [verifier.environment].docker_image, else a fresh copy of the agent's environment),
        given only the artifacts, at their source paths."""
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
    """Put the sandbox on the networks of `mode`: the bridge (public), the episode's
    allowlist network (allowlist), or neither (no-network)."""
    if isinstance(sandbox, DockerSandbox):
        await sandbox.set_network(mode == "public")
        if egress is not None:
            try:
                if mode == "allowlist":
                    await egress.connect(sandbox.id)
                else:
                    await egress.disconnect(sandbox.id)
            except aiodocker.DockerError as exc:
                raise SandboxError(f"network switch of sandbox {sandbox.name}: {exc}") from exc
        elif mode == "allowlist":
            raise SandboxError(f"sandbox {sandbox.name}: an allowlist phase with no proxy")
    else:  # another backend (a remote sandbox) must not silently keep the wrong policy
        raise SandboxError(
            f"{type(sandbox).__name__} cannot switch networks between phases "
            "(the task's agent and verifier network_mode differ)"
        )


CONVENTION = "/logs/artifacts"  # what the agent leaves here is an artifact without being listed


async def _fetch(sandbox: DockerSandbox, source: str, into: Path, exclude: list[str]) -> bool:
    """Extract `source` from the container into `into` (as its base name), without what
    `exclude` matches (tar --exclude patterns); False if the container has no such path."""
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
    """(path in the container, host path) of the artifacts `_collect` kept under `kept`: the
    convention dir's items (as collected first), then each declared artifact that was found."""
    declared: list[tuple[str, Path]] = []
    for a in task.config.artifacts:
        a = a if isinstance(a, ArtifactConfig) else ArtifactConfig(source=a)
        dest = kept / (a.destination or PurePosixPath(a.source).name)
        if dest.exists():
            declared.append((a.source, dest))
    named = {host for _, host in declared}
    convention = [
        (f"{CONVENTION}/{item.name}", item)
        for item in sorted(kept.iterdir())
        if item not in named and item.name != "steps"
    ]
    return convention + declared


def _replace(src: Path, dest: Path) -> None:
    """Move `src` to `dest`, replacing what is there."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    dest.unlink(missing_ok=True)
    shutil.move(src, dest)
