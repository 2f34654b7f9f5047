"""The Docker backend of the Sandbox port (aiodocker): one container per sandbox, `docker exec`. A
timed-out or flooding command is killed with its process group and the sandbox stays usable; output
is capped; containers carry owner labels for `stacx sandbox gc`. Not a security boundary.

Design: docs/sandboxes.md#the-docker-backend
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import aiodocker
from aiodocker.containers import DockerContainer
from aiodocker.types import JSONValue

from stacx.errors import SandboxConfigError, SandboxError
from stacx.events import new_id
from stacx.ports import ExecResult, Limits, Sandbox
from stacx.sandbox.archive import log_dirs_tar, tar_directory, tar_files
from stacx.sandbox.cgroups import IN_CONTAINER_PROBE, Counters, Snapshot, parse_counters
from stacx.sandbox.output import KILL_GRACE_S, OutputCapture, OutputLimits, exec_result
from stacx.sandbox.privileges import check_runtime, read_only_mounts, security_options
from stacx.sandbox.public_net import ensure_public_network, public_network

LABEL = "stacx"
RUNTIME_ENV = "STACX_SANDBOX_RUNTIME"
DEADLINE_GRACE_S = 8.0  # the host stops waiting this long after the in-container KILL
LOG_DIRS = ("/logs/verifier", "/logs/agent", "/logs/artifacts")  # artifacts: Harbor's convention


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


async def delete(removal: Awaitable[object], *gone: int, what: str = "") -> None:
    """Await a removal; a DockerError of a `gone` status (404: gone; 409: in use, or its removal
    already in progress) is none; another is SandboxError `what: error` (as it is, no `what`)."""
    try:
        await removal
    except aiodocker.DockerError as exc:
        if exc.status in gone:
            return
        if what:
            raise SandboxError(f"{what}: {exc}") from exc
        raise


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
    runtime = runtime or check_runtime(
        os.environ.get(RUNTIME_ENV) or "runc", where=f"${RUNTIME_ENV}"
    )
    host: dict[str, JSONValue] = {
        "NanoCpus": int(limits.cpus * 1e9),
        "Memory": limits.memory_mb << 20,
        "MemorySwap": limits.memory_mb << 20,  # equal to Memory: no swap
        "PidsLimit": limits.pids,
        "NetworkMode": public_network() if limits.allow_internet else "none",
        "Init": True,
        **security_options(limits, runtime),
    }
    if limits.read_only_root:
        host["Mounts"] = read_only_mounts()
    # overlay2 quotas need xfs with pquota; docker refuses StorageOpt elsewhere, so only opt in
    # when told to (STACX_STORAGE_QUOTA=1) on a host known to support it
    if limits.storage_mb and os.environ.get("STACX_STORAGE_QUOTA") == "1":
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


class DockerSandbox(OutputLimits):
    """One container: `await DockerSandbox.start(...)` or `async with`; `close()` is idempotent."""

    def __init__(
        self,
        docker: aiodocker.Docker,
        image: str,
        limits: Limits,
        *,
        run_id: str = "",
        episode_id: str | None = None,
        owns_docker: bool = False,
        runtime: str = "",
    ) -> None:
        self.docker = docker
        self.image = image
        self.limits = limits
        self.run_id = run_id
        self.episode_id = episode_id
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
    ) -> DockerSandbox:
        """Create and start a sandbox (a client is opened, and later closed, if none is given)."""
        sandbox = cls(
            docker or aiodocker.Docker(),
            image,
            limits or Limits(),
            run_id=run_id,
            episode_id=episode_id,
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
            # Before start, through the archive API: no exec needed (a read-only "/" refuses
            # writes; /logs is a volume then).
            ro = self.limits.read_only_root
            logs = log_dirs_tar(LOG_DIRS, under_logs=ro)
            await self._container.put_archive("/logs" if ro else "/", logs)
            await self._container.start()
            shown = await self._container.show()
            state = shown.get("State") or {}
            if not state.get("Running"):
                raise SandboxError(
                    f"the container of image {self.image} exited at start (its ENTRYPOINT, "
                    f"exit code {state.get('ExitCode')}): "
                    f"{''.join(await self._container.log(stdout=True, stderr=True))[-1000:]}"
                )
            self.workdir = str((shown.get("Config") or {}).get("WorkingDir") or "")
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

    async def __aexit__(self, *exc: object) -> None:
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
        """Run a command (a str under `bash -c`); SandboxError only if the container is gone."""
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
            await self._kill_group(info.get("Pid"))
        exit_code: int | None = None if info.get("Running") else info.get("ExitCode")
        if exit_code == 126 and not info.get("Pid") and await self._stopped():
            # the runtime could not enter the container (its init is gone: "setns ... exit
            # status 1"): the command never ran, the sandbox is lost
            raise SandboxError(
                f"exec in sandbox {self.name} failed: the container stopped "
                f"({err.text()[0].strip()[:300]})"
            )
        timed_out = not finished or (
            timeout is not None and exit_code in (124, 137) and duration_ms >= timeout * 1000 * 0.99
        )
        oom, pids = await self._limits_hit(info.get("Pid"), abnormal=exit_code != 0)
        return exec_result(
            out,
            err,
            exit_code=None if timed_out else exit_code,
            timed_out=timed_out,
            duration_ms=duration_ms,
            oom_killed=oom,
            pids_limited=pids,
            flood_limit=self.flood_limit if flooded else None,
        )

    async def _stopped(self, wait_s: float = 2.0) -> bool:
        """Whether the container has stopped, or stops within `wait_s` (one that is dying)."""
        for _ in range(int(wait_s / 0.2) + 1):
            try:
                state = (await self.container.show()).get("State") or {}
            except aiodocker.DockerError:
                return True
            if not state.get("Running"):
                return True
            await asyncio.sleep(0.2)
        return False

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
        """Run `argv` until it ends or `deadline`: (inspect info, ended in time, flooded)."""
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
                                await self._kill_group((await execution.inspect()).get("Pid"))
                except TimeoutError:
                    finished = False
            info: dict[str, Any] = await execution.inspect()
        except aiodocker.DockerError as exc:
            raise SandboxError(f"exec in sandbox {self.name} failed: {exc}") from exc
        return info, finished, flooded

    async def set_network(self, public: bool) -> None:
        """A route out (public_net) or loopback only; SandboxError if started with network=none."""
        if public:
            await ensure_public_network(self.docker)
        await self.attach(public_network(), public)

    async def attach(self, network: str, on: bool) -> None:
        """Join `network` (`on`) or leave it; SandboxError if started with network=none (an
        installed scaffold's sandbox: never a route out)."""
        try:
            attached = (await self.container.show())["NetworkSettings"]["Networks"] or {}
            if "none" in attached:
                if on:
                    raise SandboxError(f"sandbox {self.name} was started with network=none")
                return
            if on != (network in attached):
                net = await self.docker.networks.get(network)
                if on:
                    await net.connect({"Container": self.id})
                else:
                    await net.disconnect({"Container": self.id, "Force": True})
        except aiodocker.DockerError as exc:
            raise SandboxError(f"network switch of sandbox {self.name}: {exc}") from exc

    async def _limits_hit(self, pid: object, *, abnormal: bool) -> tuple[bool, bool]:
        """(OOM killer fired, a fork refused) since the last exec; a pids hit kills the group."""
        now = self._counters.read() if self._counters is not None else None
        if now is None:
            if not abnormal:  # the in-container probe costs an exec: only when it may matter
                return False, False
            now = await self._probe_counters()
        before, self._snapshot = self._snapshot, now
        oom = now.oom_kill > before.oom_kill
        pids = now.pids_max > before.pids_max
        if pids:
            await self._kill_group(pid, within_s=2.0)
        return oom, pids

    async def _kill_group(self, pid: object, *, within_s: float = 0.0) -> None:
        # An exec that outlived even `timeout -k`, flooded, or forked past the pids limit: its
        # process group is killed from the host when the engine is local (we see its pids; else
        # it is left for close()). One killpg can miss a fork bomb's children forked while the
        # signal is delivered: the group is signalled again until no member is left, or until
        # `within_s` has passed (zombies not yet reaped keep the group alive).
        if not isinstance(pid, int) or pid <= 0:
            return
        deadline = time.monotonic() + within_s
        while True:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                return
            if time.monotonic() >= deadline:
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
        """Extract `make_tar("")` into `remote_dir`, made if missing (existing dirs keep modes)."""
        remote_dir = remote_dir.rstrip("/") or "/"
        parent, name = os.path.split(remote_dir)
        try:
            # into the directory; else as a new entry of its parent; else after a mkdir -p
            for into, prefix in ((remote_dir, ""), (parent or "/", name)):
                try:
                    await self.container.put_archive(
                        into, await asyncio.to_thread(make_tar, prefix)
                    )
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
        """Remove the container and an owned client; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._container is not None:
            removal = self._container.delete(force=True, v=True)
            await delete(removal, 404, 409, what=f"cannot remove sandbox {self.name}")
        if self._owns_docker:
            await self.docker.close()


if TYPE_CHECKING:  # mypy checks that the backend implements the port
    _conforms: type[Sandbox] = DockerSandbox
