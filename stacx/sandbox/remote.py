"""The remote backend: the `Sandbox` and `Environments` ports over sandbox services on NATS
(``sandbox.backend = "remote"``). Places each sandbox on the live service with the most free slots;
a lost host's sandboxes raise InfraFailure(SANDBOX_HOST_LOST), retried elsewhere; only idempotent
requests are re-sent on timeout (never exec or verify); the verifier runs on the service, so a
remote verdict is a local one.

Design: docs/sandboxes.md#remote-sandboxes-stacx-sandbox-serve
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Self, TypedDict

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from stacx.bus.client import connect
from stacx.errors import ConfigError, SandboxError
from stacx.events import Emit, FailureKind, new_id
from stacx.ports import Environments, ExecResult, InfraFailure, Sandbox, Task, Verdict
from stacx.sandbox.archive import tar_directory
from stacx.sandbox.lifecycle import Lifecycle
from stacx.sandbox.remote_hosts import Host, HostTable
from stacx.sandbox.remote_wire import (
    ENCODER,
    REPLY_DECODER,
    Assembled,
    Chunk,
    Exec,
    Fetch,
    Heartbeat,
    ReadFile,
    Reply,
    Request,
    Start,
    Started,
    Status,
    Stop,
    Upload,
    Verify,
    WriteFile,
    admin_subject,
    run_subject,
    split,
    step_failed_of,
    task_digest,
)

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_S = 30.0  # reads, writes, stops: the service answers these in well under that
START_TIMEOUT_S = 1800.0  # a start may build the task image first
EXEC_GRACE_S = 60.0  # an exec's reply may come this long after its own timeout
VERIFY_GRACE_S = 300.0  # uploads of tests, the reward read, network switches
IDEMPOTENT_TRIES = 3


class _Auth(TypedDict):  # the fields every request carries
    run_id: str
    token: str


class _Ids(_Auth):  # and those of a request about one sandbox
    sandbox_id: str


class HostLost(InfraFailure):
    def __init__(self, service_id: str, why: str) -> None:
        super().__init__(FailureKind.SANDBOX_HOST_LOST, f"sandbox service {service_id}: {why}")
        self.service_id = service_id


async def call(
    nc: NATS,
    subject: str,
    req: Request,
    *,
    timeout: float,
    idempotent: bool,
    host: Host | None = None,
) -> Reply:
    """One request and its reply, chunked if large; TimeoutError, NoRespondersError, or HostLost
    once `host` is lost."""
    ids = _Auth(run_id=req.run_id, token=req.token)

    async def piece_call(piece: Request) -> Reply:  # a piece of a large request or reply
        reply = await call(
            nc, subject, piece, timeout=REQUEST_TIMEOUT_S, idempotent=True, host=host
        )
        _raise_for(reply, subject)
        return reply

    data: bytes = ENCODER.encode(req)
    if len(data) > nc.max_payload - 1024:
        blob_id = new_id()
        pieces = split(data, nc.max_payload)
        for i, piece in enumerate(pieces):
            await piece_call(Chunk(**ids, blob_id=blob_id, index=i, data=piece))
        data = ENCODER.encode(Assembled(**ids, blob_id=blob_id, n=len(pieces)))
    tries = IDEMPOTENT_TRIES if idempotent else 1
    for attempt in range(tries):
        try:
            msg = await _race(nc.request(subject, data, timeout=timeout), host)
            break
        except TimeoutError:
            if attempt + 1 == tries:
                raise
            log.warning("request %s to %s timed out; retrying (idempotent)", type(req), subject)
    reply = REPLY_DECODER.decode(msg.data)
    if reply.blob is not None:
        blob = reply.blob
        parts = [
            await piece_call(Fetch(**ids, blob_id=blob.blob_id, index=i)) for i in range(blob.n)
        ]
        reply = REPLY_DECODER.decode(b"".join(p.data or b"" for p in parts))
    return reply


async def _race(request: Coroutine[object, object, Msg], host: Host | None) -> Msg:
    req_task = asyncio.ensure_future(request)
    if host is None:
        return await req_task
    lost_task = asyncio.ensure_future(host.lost.wait())
    try:
        await asyncio.wait({req_task, lost_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost_task.cancel()
    if req_task.done():
        return req_task.result()
    req_task.cancel()
    raise HostLost(host.advert.service_id, host.why)


def _raise_for(reply: Reply, where: str) -> None:
    """Raise what a failed reply means on this side ("internal": RuntimeError, our bug)."""
    match reply.error:
        case "":
            return
        case "infra":
            raise InfraFailure(reply.failure_kind or FailureKind.START, reply.message)
        case "step_failed":  # a step's setup.sh or healthcheck: the episode runner's to record
            raise step_failed_of(reply)
        case "not_found":
            raise FileNotFoundError(reply.message)
        case "is_dir":
            raise IsADirectoryError(reply.message)
        case "auth":
            raise ConfigError(f"the sandbox service refused the request ({where}): {reply.message}")
        case "internal":
            raise RuntimeError(f"sandbox service bug ({where}):\n{reply.message}")
        case _:
            raise SandboxError(f"{reply.error}: {reply.message} ({where})")


class RemoteSandbox:
    """A sandbox held by a service; the `Sandbox` port over its requests."""

    def __init__(self, nc: NATS, host: Host, run_id: str, token: str, started: Started) -> None:
        self.nc = nc
        self.host = host
        self.id = started.sandbox_id
        self.image = started.image
        self.workdir = started.workdir  # read by the verifier, as DockerSandbox's
        self.output_limit = started.output_limit
        self.subject = run_subject(host.advert.service_id, run_id)
        self.closed = False
        self._ids = _Ids(run_id=run_id, token=token, sandbox_id=self.id)

    @property
    def service_id(self) -> str:
        return self.host.advert.service_id

    async def _call(
        self, req: Request, *, timeout: float = REQUEST_TIMEOUT_S, idempotent: bool = True
    ) -> Reply:
        if self.host.lost.is_set():
            raise HostLost(self.service_id, self.host.why)
        try:
            reply = await call(
                self.nc,
                self.subject,
                req,
                timeout=timeout,
                idempotent=idempotent,
                host=self.host,
            )
        except nats.errors.NoRespondersError:
            self.host.mark_lost("no responders on its subject")
            raise HostLost(self.service_id, self.host.why) from None
        except TimeoutError as exc:
            what = type(req).__name__.lower()
            raise SandboxError(
                f"{what} in sandbox {self.id[:12]} on {self.service_id}: no reply in {timeout:g}s"
                + ("" if idempotent else f" (not retried: {what} is not idempotent)")
            ) from exc
        if reply.error == "unknown_sandbox":  # the service restarted, or reaped it
            raise HostLost(self.service_id, reply.message)
        _raise_for(reply, f"sandbox {self.id[:12]} on {self.service_id}")
        return reply

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        req = Exec(**self._ids, cmd=cmd, timeout=timeout, env=env, user=user, cwd=cwd)
        # no timeout: wait as long as the command runs (a lost host still ends the wait)
        wait = 10 * 365 * 86400.0 if timeout is None else timeout + EXEC_GRACE_S
        reply = await self._call(req, timeout=wait, idempotent=False)
        assert reply.exec is not None, reply
        return reply.exec

    async def read_file(self, path: str) -> bytes:
        return (await self._call(ReadFile(**self._ids, path=path))).data or b""

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        payload = data.encode() if isinstance(data, str) else data
        await self._call(WriteFile(**self._ids, path=path, data=payload, mode=mode))

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        tar = await asyncio.to_thread(tar_directory, local_dir)
        await self._call(Upload(**self._ids, remote_dir=remote_dir, tar=tar))

    async def verify(self, task: Task, *, episode_id: str) -> Verdict:
        req = Verify(**self._ids, episode_id=episode_id, step=task.step)
        wait = task.config.verifier.timeout_sec + VERIFY_GRACE_S
        reply = await self._call(req, timeout=wait, idempotent=False)
        assert reply.verdict is not None, reply
        return reply.verdict

    async def status(self) -> bool:
        return (await self._call(Status(**self._ids))).count == 1

    async def close(self, reason: str = "released") -> None:
        """Stop the sandbox; idempotent, never raises for the transport (lease expiry cleans up)."""
        if self.closed:
            return
        self.closed = True
        if self.host.lost.is_set():
            return
        try:
            await self._call(Stop(**self._ids, reason=reason))
        except (HostLost, SandboxError) as exc:
            log.warning("stop of sandbox %s: %s (its lease will expire)", self.id[:12], exc)


class RemoteEnvironments(Lifecycle):
    """`Environments` over sandbox services: the NATS connection, host table, lease renewals."""

    def __init__(
        self,
        *,
        url: str,
        run_id: str,
        token: str,
        emit: Emit | None = None,
        warm: int = 0,
        place_wait_s: float = 60.0,
        lease_every_s: float = 10.0,
    ) -> None:
        super().__init__(run_id=run_id, emit=emit)
        self.url = url
        self.token = token
        self.warm = warm
        self.place_wait_s = place_wait_s  # how long a start waits for a host with a free slot
        self.lease_every_s = lease_every_s
        self._nc: NATS | None = None
        self.hosts: HostTable | None = None
        self._held: set[RemoteSandbox] = set()
        self._tasks: dict[str, tuple[str, str]] = {}  # task dir -> (digest, name)
        self._lease: asyncio.Task[None] | None = None
        self._auth = _Auth(run_id=run_id, token=token)

    async def __aenter__(self) -> Self:
        self._nc = await connect(self.url, name=f"stacx-remote-{self.run_id}")
        self.hosts = HostTable(self._nc)
        await self.hosts.start()
        self._lease = asyncio.create_task(self._renew())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._lease is not None:
            self._lease.cancel()
            await asyncio.gather(self._lease, return_exceptions=True)
        await asyncio.gather(*(sb.close() for sb in list(self._held)), return_exceptions=True)
        if self.hosts is not None:
            await self.hosts.close()
        if self._nc is not None:
            await self._nc.close()

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease_every_s)
            by_host: dict[str, list[str]] = {}  # the run's subject on a host -> its sandboxes
            for sb in self._held:
                by_host.setdefault(sb.subject, []).append(sb.id)
            for subject, ids in by_host.items():
                beat = Heartbeat(**self._auth, sandbox_ids=ids)
                with contextlib.suppress(Exception):  # a lost host is noticed by its requests
                    await self.nc.publish(subject, ENCODER.encode(beat))

    @property
    def nc(self) -> NATS:
        assert self._nc is not None, "use `async with`"
        return self._nc

    def _digest(self, task: Task) -> tuple[str, str]:
        if task.path not in self._tasks:
            self._tasks[task.path] = (task_digest(task.dir), task.dir.name)
        return self._tasks[task.path]

    async def _place(self, task: Task, episode_id: str) -> tuple[Host, Started]:
        assert self.hosts is not None, "use `async with`"
        digest, name = await asyncio.to_thread(self._digest, task)
        req = Start(
            **self._auth, episode_id=episode_id, task_digest=digest, task_name=name, warm=self.warm
        )
        while True:
            host = await self.hosts.pick(digest, wait=self.place_wait_s)
            sid = host.advert.service_id
            host.placing += 1
            try:
                reply = await call(
                    self.nc,
                    run_subject(sid, self.run_id),
                    req,
                    timeout=START_TIMEOUT_S,
                    idempotent=False,
                    host=host,
                )
            except nats.errors.NoRespondersError:
                host.mark_lost("no responders on its subject")
                continue  # nothing was started there: place it elsewhere
            except TimeoutError as exc:
                raise SandboxError(f"start on {sid}: no reply in {START_TIMEOUT_S:g}s") from exc
            finally:
                host.placing -= 1
            if reply.error == "missing_task":
                tar = await asyncio.to_thread(tar_directory, task.dir)
                req = msgspec.structs.replace(req, task_tar=tar)
                continue
            if reply.error == "full":  # its advert was stale: wait for the next ones
                host.advert = msgspec.structs.replace(host.advert, used=host.advert.slots)
                continue
            _raise_for(reply, f"start on {sid}")
            assert reply.started is not None, reply
            return host, reply.started

    async def _start(
        self, stack: contextlib.AsyncExitStack, task: Task, episode_id: str
    ) -> Sandbox:
        t0 = time.perf_counter()
        host, started = await self._place(task, episode_id)
        sb = RemoteSandbox(self.nc, host, self.run_id, self.token, started)
        self._held.add(sb)

        async def release(et: object, exc: BaseException | None, tb: object) -> None:
            self._held.discard(sb)
            lost = isinstance(exc, HostLost) or host.lost.is_set()
            await sb.close()
            await self.stopped(sb.id, episode_id, "host_lost" if lost else "released")

        stack.push_async_exit(release)
        start_ms = (time.perf_counter() - t0) * 1000
        await self.started(
            sb.id, sb.image, episode_id, start_ms, warm=started.warm, host=sb.service_id
        )
        return sb

    async def verify(self, sandbox: Sandbox, task: Task, *, episode_id: str) -> Verdict:
        """Run on the service (DockerEnvironments.verify): a remote verdict is a local one."""
        if not isinstance(sandbox, RemoteSandbox):
            raise TypeError(f"RemoteEnvironments.verify: {type(sandbox).__name__} is not remote")
        return await sandbox.verify(task, episode_id=episode_id)


async def admin_call(nc: NATS, service_id: str, req: Request, *, timeout: float = 30.0) -> Reply:
    """One admin request to one service (ls, stats, stop, gc)."""
    reply = await call(nc, admin_subject(service_id), req, timeout=timeout, idempotent=False)
    _raise_for(reply, f"admin request to {service_id}")
    return reply


def remote_url(url: str) -> str:
    """`sandbox.url`, else $STACX_NATS_URL; ConfigError when neither names a NATS server."""
    from stacx.bus.server import external_url

    found = url or external_url()
    if not found:
        raise ConfigError(
            "sandbox.backend = 'remote' needs sandbox.url or STACX_NATS_URL: the NATS server "
            "the `stacx sandbox serve` services listen on"
        )
    return found


if TYPE_CHECKING:  # mypy checks that the backend implements the ports
    _conforms: type[Sandbox] = RemoteSandbox
    _envs: type[Environments] = RemoteEnvironments
