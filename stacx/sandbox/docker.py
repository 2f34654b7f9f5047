"""The Docker backend of the Sandbox protocol, through aiodocker.

Each sandbox is one container started with `sleep infinity` under Docker's init, with the task's
limits and least privilege (stacx.sandbox.privileges); commands run with `docker exec`.
Guarantees: a timed-out or flooding command is killed with its process group and the sandbox
stays usable; captured output is capped; `oom_killed` / `pids_limited` come from the cgroup's
counters; containers carry owner labels so `stacx sandbox gc` can remove orphans. Not a security
boundary against a determined attacker.

Specification: docs/sandboxes.md#the-docker-backend
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import aiodocker
from aiodocker.containers import DockerContainer
from aiodocker.types import JSONValue

from stacx.errors import SandboxConfigError, SandboxError
from stacx.events import new_id
from stacx.ports import ExecResult, Limits, Sandbox
from stacx.sandbox.archive import log_dirs_tar, tar_directory, tar_files
from stacx.sandbox.cgroups import IN_CONTAINER_PROBE, Counters, Snapshot, parse_counters
from stacx.sandbox.output import OutputCapture
from stacx.sandbox.privileges import check_runtime, read_only_mounts, security_options
from stacx.sandbox.public_net import ensure_public_network, public_network

LABEL = "stacx"
RUNTIME_ENV = "STACX_SANDBOX_RUNTIME"
DEFAULT_OUTPUT_LIMIT = 1 << 20
# Draining docker's exec stream runs at tens of MB/s here; past this many bytes a command is
# killed rather than drained, so a flood costs seconds, not minutes.
DEFAULT_FLOOD_LIMIT = 64 << 20
KILL_GRACE_S = 2.0  # TERM, then KILL this much later (coreutils timeout -k)
DEADLINE_GRACE_S = 8.0  # the host stops waiting this long after the in-container KILL
LOG_DIRS = (
    "/logs/verifier",
    "/logs/agent",
    "/logs/artifacts",
)  # artifacts: Harbor's convention dir


def owner_labels(run_id: str, episode_id: str | None = None) -> dict[str, str]:
    """Labels naming the run, episode and owning process (host + pid + its start time)."""
    pid = os.getpid()
    return {
        LABEL: "1",
        "stacx.run_id": run_id,
        "stacx.episode_id": episode_id or "",
        "stacx.pid": str(pid),
        "stacx.pid_start": process_start_time(pid),
        "stacx.host": socket.gethostname(),
    }


def process_start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if unknown): guards pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def container_config(
    image: str, limits: Limits, labels: dict[str, str], runtime: str = ""
) -> dict[str, JSONValue]:
    """The create body of a sandbox container; `runtime` "": $STACX_SANDBOX_RUNTIME or runc."""
    host: dict[str, JSONValue] = {
        "NanoCpus": int(limits.cpus * 1e9),
        "Memory": limits.memory_mb << 20,
        "MemorySwap": limits.memory_mb << 20,  # equal to Memory: no swap
        "PidsLimit": limits.pids,
        "NetworkMode": public_network() if limits.allow_internet else "none",
        "Init": True,
        **security_options(limits, runtime or sandbox_runtime()),
    }
    if limits.read_only_root:
        host["Mounts"] = read_only_mounts()
    if limits.storage_mb and _storage_quota_supported():
        host["StorageOpt"] = {"size": f"{limits.storage_mb}M"}
    if limits.mounts:  # the one way out of a network=none scaffold container: its socket dir
        host["Binds"] = [f"{src}:{dst}" for src, dst in limits.mounts.items()]
    extra: dict[str, JSONValue] = {"WorkingDir": limits.workdir} if limits.workdir else {}
    return {
        **extra,
        "Image": image,
        # As Harbor starts `main`: the image's ENTRYPOINT runs (a task's entrypoint.sh starts
        # its services, then execs its arguments or sleeps itself) with this command instead
        # of the image's CMD; the agent's commands are execs next to it.
        "Cmd": ["sh", "-c", "sleep infinity"],
        "Labels": dict(labels),
        "Env": [f"{k}={v}" for k, v in limits.env.items()],
        "NetworkDisabled": not limits.allow_internet,
        "HostConfig": host,
    }


def sandbox_runtime() -> str:
    """The OCI runtime of sandbox containers: $STACX_SANDBOX_RUNTIME (`runc`, Docker's default,
    or `runsc`, gVisor, where installed and registered with the Docker daemon)."""
    return check_runtime(os.environ.get(RUNTIME_ENV) or "runc", where=f"${RUNTIME_ENV}")


def _storage_quota_supported() -> bool:
    # overlay2 quotas need xfs with pquota; docker refuses StorageOpt elsewhere, so only opt in
    # when told to (STACX_STORAGE_QUOTA=1) on a host known to support it.
    return os.environ.get("STACX_STORAGE_QUOTA") == "1"


class DockerSandbox:
    """One container. Create with `await DockerSandbox.start(...)` or use as an async context
    manager (started on enter, removed on exit). `close()` is idempotent."""

    def __init__(
        self,
        docker: aiodocker.Docker,
        image: str,
        limits: Limits,
        *,
        run_id: str = "",
        episode_id: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        flood_limit: int = DEFAULT_FLOOD_LIMIT,
        owns_docker: bool = False,
        runtime: str = "",
    ) -> None:
        self.docker = docker
        self.image = image
        self.limits = limits
        self.run_id = run_id
        self.episode_id = episode_id
        self.output_limit = output_limit
        self.flood_limit = flood_limit
        self.runtime = runtime  # the OCI runtime; "": $STACX_SANDBOX_RUNTIME or runc
        self.id = ""
        self.name = f"stacx-{new_id()[:16]}"
        self.start_ms = 0.0
        self.workdir = ""  # the image's WORKDIR ("" when it sets none), known once started
        self._container: DockerContainer | None = None
        self._owns_docker = owns_docker
        self._counters: Counters | None = None
        self._snapshot = Snapshot()
        self._closed = False

    @classmethod
    async def create(
        cls,
        image: str,
        limits: Limits | None = None,
        *,
        docker: aiodocker.Docker | None = None,
        run_id: str = "",
        episode_id: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        flood_limit: int = DEFAULT_FLOOD_LIMIT,
    ) -> DockerSandbox:
        """Create and start a sandbox (a client is opened, and later closed, if none is given)."""
        sandbox = cls(
            docker or aiodocker.Docker(),
            image,
            limits or Limits(),
            run_id=run_id,
            episode_id=episode_id,
            output_limit=output_limit,
            flood_limit=flood_limit,
            owns_docker=docker is None,
        )
        await sandbox.start()
        return sandbox

    async def start(self) -> None:
        """Create the container, make /logs/{verifier,agent}, start it. SandboxError on failure."""
        t0 = time.perf_counter()
        labels = owner_labels(self.run_id, self.episode_id)
        labels["stacx.image"] = self.image
        try:
            if self.limits.allow_internet:  # the internet, not the host (public_net)
                await ensure_public_network(self.docker)
            self._container = await self.docker.containers.create(
                container_config(self.image, self.limits, labels, self.runtime), name=self.name
            )
            self.id = self._container.id
            # Before start, through the archive API: no exec needed.
            if self.limits.read_only_root:  # "/" refuses writes; /logs is a volume
                await self._container.put_archive("/logs", log_dirs_tar(LOG_DIRS, under_logs=True))
            else:
                await self._container.put_archive("/", log_dirs_tar(LOG_DIRS))
            await self._container.start()
            shown = await self._container.show()
            if not (shown.get("State") or {}).get("Running"):
                raise SandboxError(
                    f"the container of image {self.image} exited at start (its ENTRYPOINT, "
                    f"exit code {(shown.get('State') or {}).get('ExitCode')}): "
                    f"{''.join(await self._container.log(stdout=True, stderr=True))[-1000:]}"
                )
            self.workdir = str((shown.get("Config") or {}).get("WorkingDir") or "")
            state = shown.get("State", {})
            self._counters = Counters.for_pid(int(state.get("Pid") or 0))
            self._snapshot = self._counters.read() or Snapshot()
        except aiodocker.DockerError as exc:
            await self.close()
            if "unknown runtime" in str(exc).lower():  # configuration: a retry fails the same
                raise SandboxConfigError(await self._runtime_missing(exc)) from exc
            raise SandboxError(f"cannot start a sandbox from image {self.image}: {exc}") from exc
        except SandboxError:
            await self.close()
            raise
        self.start_ms = (time.perf_counter() - t0) * 1000

    async def _runtime_missing(self, exc: aiodocker.DockerError) -> str:
        """The message for an OCI runtime the engine lacks, naming the ones it has."""
        runtime = self.runtime or os.environ.get(RUNTIME_ENV) or "runc"
        try:
            have = ", ".join(sorted((await self.docker.system.info()).get("Runtimes") or {}))
        except aiodocker.DockerError:
            have = "?"
        return (
            f"the Docker engine has no OCI runtime {runtime!r} (sandbox.runtime or "
            f"${RUNTIME_ENV}); it has: {have}. Install it and register it in the engine's "
            f"daemon.json, or choose one of those ({exc.message})"
        )

    async def __aenter__(self) -> Self:
        if self._container is None:
            await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def container(self) -> DockerContainer:
        if self._container is None or self._closed:
            raise SandboxError(f"sandbox {self.name} is not running")
        return self._container

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run a command (a str runs under `bash -c`); never raises for the command's own
        failure, only SandboxError when the container cannot be reached."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if timeout is not None:
            # `timeout` signals the command's whole process group on expiry, from inside, even
            # when the host is slow. (Every exec is already a process-group leader, as runc
            # starts it with setsid, so the host can kill the group on a flood either way.)
            argv = ["timeout", "-k", f"{KILL_GRACE_S:g}", f"{max(timeout, 0.001):.3f}", *argv]
        t0 = time.perf_counter()
        out, err = OutputCapture(self.output_limit), OutputCapture(self.output_limit)
        deadline = None if timeout is None else timeout + KILL_GRACE_S + DEADLINE_GRACE_S
        info, finished, flooded = await self._stream(argv, env, user, cwd, deadline, out, err)
        duration_ms = (time.perf_counter() - t0) * 1000
        if not finished and info.get("Running"):
            self._kill_host_pid(info.get("Pid"))
        exit_code: int | None = None if info.get("Running") else info.get("ExitCode")
        timed_out = not finished or (
            timeout is not None and exit_code in (124, 137) and duration_ms >= timeout * 1000 * 0.99
        )
        oom, pids = await self._limits_hit(info.get("Pid"), abnormal=exit_code != 0)
        if timed_out:
            exit_code = None
        if flooded:
            err.feed(
                f"\n[stacx: output flood: the command was killed after printing more than "
                f"{self.flood_limit} bytes]\n".encode()
            )
        stdout, t1 = out.text()
        stderr, t2 = err.text()
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            duration_ms=duration_ms,
            truncated=t1 or t2 or flooded,
            oom_killed=oom,
            pids_limited=pids,
        )

    async def _stream(
        self,
        argv: list[str],
        env: dict[str, str] | None,
        user: str | None,
        cwd: str | None,
        deadline: float | None,
        out: OutputCapture,
        err: OutputCapture,
    ) -> tuple[dict[str, Any], bool, bool]:
        """Run `argv` in the container, capturing its output until it ends or `deadline`
        passes; (the exec's inspect info, whether it ended in time, whether it flooded: then
        its process group was killed from the host)."""
        flooded = False
        try:
            execution = await self.container.exec(
                argv, environment=env, user=str(user or ""), workdir=cwd
            )
            finished = True
            async with execution.start(detach=False) as stream:
                try:
                    async with asyncio.timeout(deadline):
                        while (msg := await stream.read_out()) is not None:
                            (out if msg.stream == 1 else err).feed(msg.data)
                            if not flooded and out.total + err.total > self.flood_limit:
                                flooded = True
                                self._kill_host_pid((await execution.inspect()).get("Pid"))
                except TimeoutError:
                    finished = False
            info: dict[str, Any] = await execution.inspect()
        except aiodocker.DockerError as exc:
            raise SandboxError(f"exec in sandbox {self.name} failed: {exc}") from exc
        return info, finished, flooded

    async def set_network(self, public: bool) -> None:
        """Give the container a route out (stacx.sandbox.public_net) or none (loopback only), for
        a phase whose network policy differs from the one it started with. A sandbox started
        with no network at all (network=none) cannot be given one: SandboxError."""
        try:
            attached = (await self.container.show())["NetworkSettings"]["Networks"] or {}
            if "none" in attached:
                if public:
                    raise SandboxError(f"sandbox {self.name} was started with network=none")
                return
            name = public_network()
            if public and name not in attached:
                await ensure_public_network(self.docker)
                await (await self.docker.networks.get(name)).connect({"Container": self.id})
            elif not public and name in attached:
                await (await self.docker.networks.get(name)).disconnect(
                    {"Container": self.id, "Force": True}
                )
        except aiodocker.DockerError as exc:
            raise SandboxError(f"network switch of sandbox {self.name}: {exc}") from exc

    def _kill_host_pid(self, pid: object) -> None:
        # The exec outlived even `timeout -k`: kill its process group from the host when the
        # engine is local (we can see its pids); otherwise it is left for close().
        if isinstance(pid, int) and pid > 0:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass

    async def _limits_hit(self, pid: object, *, abnormal: bool) -> tuple[bool, bool]:
        """(OOM killer fired, a fork was refused by the pids limit) since the last exec.

        A command that hit the pids limit is killed with its process group: a fork bomb's
        background children would otherwise hold every pid and leave the sandbox unusable.
        """
        now = self._counters.read() if self._counters is not None else None
        if now is None:
            if not abnormal:  # the in-container probe costs an exec: only when it may matter
                return False, False
            now = await self._probe_counters()
        before, self._snapshot = self._snapshot, now
        oom = now.oom_kill > before.oom_kill
        pids = now.pids_max > before.pids_max
        if pids:
            await self._kill_group_until_gone(pid)
        return oom, pids

    async def _kill_group_until_gone(self, pid: object, *, within_s: float = 2.0) -> None:
        # One killpg can miss a fork bomb's children forked while the signal is delivered:
        # signal the group again until no member is left (or `within_s` has passed: zombies
        # not yet reaped keep the group alive).
        if not isinstance(pid, int) or pid <= 0:
            return
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            except OSError:
                return
            await asyncio.sleep(0.01)

    async def _probe_counters(self) -> Snapshot:
        try:
            execution = await self.container.exec(["sh", "-c", IN_CONTAINER_PROBE])
            data = b""
            async with execution.start(detach=False) as stream:
                while (msg := await stream.read_out()) is not None:
                    data += msg.data
        except aiodocker.DockerError:
            return self._snapshot
        return parse_counters(data.decode(errors="replace"))

    async def read_file(self, path: str) -> bytes:
        """A file's bytes; FileNotFoundError if it does not exist, IsADirectoryError for a dir."""
        try:
            tar = await self.container.get_archive(path)
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                raise FileNotFoundError(f"{path} (in sandbox {self.name})") from exc
            raise SandboxError(f"read {path} in sandbox {self.name}: {exc}") from exc
        with tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"{path} (in sandbox {self.name}) is not a regular file")
            f = tar.extractfile(member)
            assert f is not None
            return f.read()

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file (parents created as needed)."""
        payload = data.encode() if isinstance(data, str) else data
        parent, name = os.path.split(path.rstrip("/"))
        await self._put(
            parent or "/",
            lambda prefix: tar_files({name: (payload, mode)}, prefix),
        )

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        """Copy a local directory's contents into `remote_dir` (created as needed)."""
        await self._put(remote_dir, lambda prefix: tar_directory(local_dir, prefix))

    async def _put(self, remote_dir: str, make_tar: Callable[[str], bytes]) -> None:
        """Extract `make_tar("")` into `remote_dir`. A missing `remote_dir` is created by
        extracting `make_tar(<its name>)` into its parent (one call, no exec), or, if the
        parent is missing too, by `mkdir -p`. An existing directory is never a tar entry, so
        its mode (say /tmp's 1777) is never reset."""
        remote_dir = remote_dir.rstrip("/") or "/"
        try:
            try:
                await self.container.put_archive(remote_dir, await asyncio.to_thread(make_tar, ""))
                return
            except aiodocker.DockerError as exc:
                if exc.status != 404:
                    raise
            parent, name = os.path.split(remote_dir)
            try:
                tar = await asyncio.to_thread(make_tar, name)
                await self.container.put_archive(parent or "/", tar)
                return
            except aiodocker.DockerError as exc:
                if exc.status != 404:
                    raise
            made = await self.exec(["mkdir", "-p", remote_dir])
            if made.exit_code != 0:
                raise SandboxError(f"mkdir {remote_dir} in sandbox {self.name}: {made.stderr}")
            await self.container.put_archive(remote_dir, await asyncio.to_thread(make_tar, ""))
        except aiodocker.DockerError as exc:
            raise SandboxError(f"upload to {remote_dir} in sandbox {self.name}: {exc}") from exc

    async def close(self) -> None:
        """Remove the container (force) and, if owned, the client. Idempotent; never raises
        for a container that is already gone."""
        if self._closed:
            return
        self._closed = True
        if self._container is not None:
            try:
                await self._container.delete(force=True, v=True)
            except aiodocker.DockerError as exc:
                if exc.status not in (404, 409):  # gone, or removal already in progress
                    raise SandboxError(f"cannot remove sandbox {self.name}: {exc}") from exc
        if self._owns_docker:
            await self.docker.close()


if TYPE_CHECKING:  # mypy checks that the backend implements the port
    _conforms: type[Sandbox] = DockerSandbox
