"""`stacx sandbox serve`: one Docker host's sandboxes over NATS request/reply, through the same
Docker backend a run uses in-process, so a remote sandbox is a local one started elsewhere. Each
request runs in its own task; only the run's token is obeyed; a start past `slots` is refused, never
queued; a sandbox whose lease lapses is stopped.

Design: docs/sandboxes.md#the-sandbox-services-wire
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import os
import shutil
import socket
import tarfile
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiodocker
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from stacx.bus.connection import connect_waiting
from stacx.errors import SandboxError, TaskError
from stacx.events import Event, FailureKind, SandboxStarted, new_id
from stacx.harbor.tasks import load_task
from stacx.ports import InfraFailure, Sandbox, Task
from stacx.sandbox.aliases import AliasMap
from stacx.sandbox.environments import DockerEnvironments
from stacx.sandbox.gc import collect_garbage
from stacx.sandbox.remote_wire import (
    ADVERT,
    DISCOVER,
    ENCODER,
    REQUEST_DECODER,
    SECRET_ENV,
    AdminGc,
    AdminLs,
    AdminStop,
    Advert,
    Assembled,
    BlobRef,
    Chunk,
    Exec,
    Fetch,
    Heartbeat,
    ReadFile,
    Reply,
    Request,
    SandboxRow,
    Start,
    Started,
    Status,
    Stop,
    Upload,
    Verify,
    WriteFile,
    admin_subject,
    admin_token,
    failure_reply,
    run_subject,
    run_token,
    split,
    subject_token,
)

log = logging.getLogger(__name__)
BLOB_TTL_S = 120.0


class ServiceConfig(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    service_id: str
    slots: int
    cpus: float
    memory_mb: int
    state_dir: str  # task directories received, by digest
    aliases: str = ""  # base-image alias file; empty: $STACX_IMAGE_ALIASES
    heartbeat_s: float = 1.0
    lease_s: float = 60.0
    idle_run_s: float = 60.0  # a run with no sandbox here for this long: its warm pool is closed
    gc_interval_s: float = 60.0
    # the OCI runtime of its sandboxes: runc, runsc; "": $STACX_SANDBOX_RUNTIME, else runc
    runtime: str = ""


def default_capacity() -> tuple[float, int]:
    """(cpus, memory MB) a service may use by default: every cpu, 80% of the memory."""
    cpus = float(len(os.sched_getaffinity(0)))
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    return cpus, memory_mb


def default_slots(cpus: float, memory_mb: int) -> int:
    """Four sandboxes per cpu, but at least 256 MB each (sandboxes mostly wait on a model)."""
    return max(1, min(int(cpus * 4), memory_mb // 256))


def default_service_id() -> str:
    return subject_token(f"{socket.gethostname()}-{new_id()[:6]}")


@dataclasses.dataclass
class _Held:
    """One started sandbox and what closing it takes."""

    sandbox: Sandbox
    stack: contextlib.AsyncExitStack
    envs: DockerEnvironments
    task: Task
    run_id: str
    episode_id: str
    started: float = dataclasses.field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.image = str(getattr(self.sandbox, "image", ""))
        self.last = self.started


class SandboxService:
    """The service; `await SandboxService(config).run(stop)` serves until `stop` is set."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.id = config.service_id
        self.started_at = time.time()
        self._nc: NATS | None = None
        self._docker: aiodocker.Docker | None = None
        self._envs: dict[str, DockerEnvironments] = {}
        self._run_seen: dict[str, float] = {}
        self._envs_lock = asyncio.Lock()
        self._tokens: dict[str, str] = {}
        self._held: dict[str, _Held] = {}
        self._starting = 0
        self._warm: dict[str, bool] = {}  # episode_id -> its sandbox came from the warm pool
        self._incoming: dict[str, tuple[float, dict[int, bytes]]] = {}
        self._outgoing: dict[str, tuple[float, list[bytes]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._built: set[str] = set()
        self._secret = bool(os.environ.get(SECRET_ENV))
        self.tasks_dir = Path(config.state_dir) / "tasks"

    @property
    def nc(self) -> NATS:
        assert self._nc is not None, "the service is not running"
        return self._nc

    @property
    def docker(self) -> aiodocker.Docker:
        assert self._docker is not None, "the service is not running"
        return self._docker

    def advert(self) -> Advert:
        return Advert(
            service_id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self.started_at,
            slots=self.config.slots,
            used=len(self._held) + self._starting,
            cpus=self.config.cpus,
            memory_mb=self.config.memory_mb,
            heartbeat_s=self.config.heartbeat_s,
            tasks=sorted(self._built),
            runs=sorted({h.run_id for h in self._held.values()}),
        )

    async def run(self, stop: asyncio.Event, ready: Callable[[], None] | None = None) -> None:
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        self._built = {p.name for p in self.tasks_dir.iterdir() if p.is_dir()}
        self._docker = aiodocker.Docker()
        try:
            reaped = await collect_garbage(self._docker)
            if reaped:
                log.warning("removed %d orphaned sandbox container(s) at start", len(reaped))
            # waiting for NATS is the point of a service: once said, retried quietly; a signal
            # (stop) ends the wait
            self._nc = await connect_waiting(self.config.url, stop, name=f"stacx-sandbox-{self.id}")
        finally:
            if self._nc is None:  # failed, or stopped before NATS answered: nothing held yet
                await self._docker.close()
        if self._nc is None:
            return
        prefix = run_subject(self.id, "x").rsplit(".", 1)[0]
        subs = [
            await self.nc.subscribe(f"{prefix}.*", cb=self._handler(self._run_request)),
            await self.nc.subscribe(
                admin_subject(self.id), cb=self._handler(self._admin_request, admin=True)
            ),
            await self.nc.subscribe(DISCOVER, cb=self._on_discover),
        ]
        loops = [asyncio.create_task(self._advertise()), asyncio.create_task(self._reap())]
        await self.nc.flush()
        await self._publish_advert()
        log.info("sandbox service %s: %d slots on %s", self.id, self.config.slots, self.config.url)
        if ready is not None:
            ready()
        try:
            await stop.wait()
        finally:
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            for t in [*loops, *self._tasks]:  # the heartbeat and reaper, the requests in flight
                t.cancel()
            await asyncio.gather(*loops, *self._tasks, return_exceptions=True)
            await asyncio.gather(
                *(self._stop(sid, "service stopped") for sid in list(self._held)),
                return_exceptions=True,
            )
            for envs in self._envs.values():
                await envs.__aexit__(None, None, None)
            await self._docker.close()
            await self._nc.close()

    def _handler(
        self, handle: Callable[[Request], Awaitable[Reply]], *, admin: bool = False
    ) -> Callable[[Msg], Awaitable[None]]:
        # nats-py runs one subscription's callbacks one after the other: each request gets its
        # own task, so a long exec holds up nothing.
        async def cb(msg: Msg) -> None:
            task = asyncio.create_task(self._answer(msg, handle, admin=admin))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return cb

    async def _publish_advert(self) -> None:
        await self.nc.publish(ADVERT, ENCODER.encode(self.advert()))

    async def _advertise(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a NATS reconnect: the next beat goes out
                await self._publish_advert()
            await asyncio.sleep(self.config.heartbeat_s)

    async def _on_discover(self, msg: Msg) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, ENCODER.encode(self.advert()))

    async def _reap(self) -> None:
        last_gc = time.monotonic()
        while True:
            await asyncio.sleep(min(self.config.lease_s / 4, 5.0))
            now = time.monotonic()
            for sid, held in list(self._held.items()):
                if now - held.last > self.config.lease_s:
                    log.warning("sandbox %s (run %s): lease expired", sid[:12], held.run_id)
                    await self._stop(sid, "lease expired")
            for store in (self._incoming, self._outgoing):
                for key, (expires, _) in list(store.items()):
                    if expires < now:
                        store.pop(key, None)
            live_runs = {h.run_id for h in self._held.values()}
            for run_id, seen in list(self._run_seen.items()):
                if run_id not in live_runs and now - seen > self.config.idle_run_s:
                    envs = self._envs.pop(run_id, None)
                    self._run_seen.pop(run_id, None)
                    if envs is not None:
                        await envs.__aexit__(None, None, None)
            if now - last_gc > self.config.gc_interval_s:
                last_gc = now
                with contextlib.suppress(aiodocker.DockerError):
                    await collect_garbage(self.docker)

    async def _answer(
        self, msg: Msg, handle: Callable[[Request], Awaitable[Reply]], *, admin: bool
    ) -> None:
        try:
            reply = await self._request(msg.data, msg.subject, handle, admin=admin)
        except msgspec.DecodeError as exc:
            reply = Reply(error="internal", message=f"undecodable request: {exc}")
        except Exception:  # a bug here: the client crashes with our traceback
            log.exception("request on %s failed", msg.subject)
            reply = Reply(error="internal", message=traceback.format_exc())
        if msg.reply:
            await self._reply(msg.reply, reply)

    async def _request(
        self,
        data: bytes,
        subject: str,
        handle: Callable[[Request], Awaitable[Reply]],
        *,
        admin: bool,
        nested: bool = False,
    ) -> Reply:
        """One request's reply; `nested`: a request reassembled from chunks (no chunking again)."""
        req = REQUEST_DECODER.decode(data)
        problem = self._auth(req, subject, admin=admin)
        if problem or (nested and isinstance(req, Chunk | Assembled | Fetch)):
            return Reply(error="auth", message=problem or "nested chunking")
        if isinstance(req, Chunk):
            _, pieces = self._incoming.setdefault(req.blob_id, (time.monotonic() + BLOB_TTL_S, {}))
            pieces[req.index] = req.data
            return Reply()
        if isinstance(req, Assembled):
            _, pieces = self._incoming.pop(req.blob_id, (0.0, {}))
            if sorted(pieces) != list(range(req.n)):
                return Reply(error="sandbox", message=f"request {req.blob_id}: chunks missing")
            whole = b"".join(pieces[i] for i in range(req.n))
            return await self._request(whole, subject, handle, admin=admin, nested=True)
        if isinstance(req, Fetch):
            _, blob = self._outgoing.get(req.blob_id, (0.0, []))
            if req.index < len(blob):
                return Reply(data=blob[req.index])
            return Reply(error="sandbox", message=f"reply blob {req.blob_id} expired")
        return await handle(req)

    async def _reply(self, subject: str, reply: Reply) -> None:
        data = ENCODER.encode(reply)
        if len(data) > self.nc.max_payload - 1024:
            blob_id = new_id()
            pieces = split(data, self.nc.max_payload)
            self._outgoing[blob_id] = (time.monotonic() + BLOB_TTL_S, pieces)
            data = ENCODER.encode(Reply(blob=BlobRef(blob_id=blob_id, n=len(pieces))))
        await self.nc.publish(subject, data)

    def _auth(self, req: Request, subject: str, *, admin: bool) -> str:
        if admin:
            return "" if req.token == admin_token() else "bad admin token"
        if subject != run_subject(self.id, req.run_id):
            return f"run {req.run_id!r} asked on another run's subject {subject}"
        if self._secret:
            ok = req.token == run_token(req.run_id)
        else:
            ok = self._tokens.setdefault(req.run_id, req.token) == req.token
        return "" if ok else f"bad token for run {req.run_id!r}"

    async def _run_request(self, req: Request) -> Reply:
        self._run_seen[req.run_id] = time.monotonic()
        if isinstance(req, Start):
            return await self._start(req)
        if isinstance(req, Heartbeat):
            for sid in req.sandbox_ids:
                if (held := self._held.get(sid)) is not None and held.run_id == req.run_id:
                    held.last = time.monotonic()
            return Reply()
        if isinstance(req, Stop):
            held = self._held.get(req.sandbox_id)
            if held is not None and held.run_id == req.run_id:
                await self._stop(req.sandbox_id, req.reason)
            return Reply()  # idempotent: an unknown sandbox is already stopped
        assert isinstance(req, Exec | ReadFile | WriteFile | Upload | Verify | Status), req
        held = self._held.get(req.sandbox_id)
        if held is None or held.run_id != req.run_id:
            return Reply(error="unknown_sandbox", message=f"no sandbox {req.sandbox_id} here")
        held.last = time.monotonic()
        sb = held.sandbox
        try:
            if isinstance(req, Exec):
                result = await sb.exec(
                    req.cmd, timeout=req.timeout, env=req.env, user=req.user, cwd=req.cwd
                )
                return Reply(exec=result)
            if isinstance(req, ReadFile):
                return Reply(data=await sb.read_file(req.path))
            if isinstance(req, WriteFile):
                await sb.write_file(req.path, req.data, req.mode)
                return Reply()
            if isinstance(req, Upload):
                with tempfile.TemporaryDirectory(prefix="stacx-upload-") as tmp:
                    await asyncio.to_thread(_extract, req.tar, Path(tmp))
                    await sb.upload_dir(tmp, req.remote_dir)
                return Reply()
            if isinstance(req, Verify):
                task = next((t for t in held.task.step_tasks if t.step == req.step), held.task)
                try:
                    found = await held.envs.verify(sb, task, episode_id=req.episode_id)
                except InfraFailure as exc:  # a StepFailed: the next step's setup, an outcome
                    return failure_reply(exc)
                return Reply(verdict=found)
            return Reply(count=1)  # Status: it is running
        except FileNotFoundError as exc:
            return Reply(error="not_found", message=str(exc))
        except IsADirectoryError as exc:
            return Reply(error="is_dir", message=str(exc))
        except (SandboxError, aiodocker.DockerError) as exc:
            return Reply(error="sandbox", message=str(exc))
        finally:
            held.last = time.monotonic()

    async def _start(self, req: Start) -> Reply:
        if len(self._held) + self._starting >= self.config.slots:
            return Reply(error="full", message=f"{self.config.slots} slots in use")
        task_dir = self.tasks_dir / req.task_digest / req.task_name
        if not task_dir.is_dir():
            if req.task_tar is None:
                return Reply(error="missing_task")
            await asyncio.to_thread(_unpack_task, req.task_tar, task_dir)
        self._starting += 1
        try:
            stack = contextlib.AsyncExitStack()
            try:
                task = load_task(task_dir)
                envs = await self._envs_of(req.run_id, req.warm)
                t0 = time.perf_counter()
                sb = await stack.enter_async_context(envs.sandbox(task, episode_id=req.episode_id))
            except TaskError as exc:
                return Reply(error="infra", failure_kind=FailureKind.IMAGE_BUILD, message=str(exc))
            except InfraFailure as exc:  # a StepFailed: the first step's setup or healthcheck
                return failure_reply(exc)
            self._built.add(req.task_digest)
            held = _Held(sb, stack, envs, task, req.run_id, req.episode_id)
            self._held[sb.id] = held
        finally:
            self._starting -= 1
        await self._publish_advert()
        return Reply(
            started=Started(
                sandbox_id=sb.id,
                image=held.image,
                workdir=str(getattr(sb, "workdir", "")),
                start_ms=(time.perf_counter() - t0) * 1000,
                warm=self._warm.pop(req.episode_id, False),
                output_limit=int(getattr(sb, "output_limit", 0)),
            )
        )

    async def _envs_of(self, run_id: str, warm: int) -> DockerEnvironments:
        async with self._envs_lock:
            envs = self._envs.get(run_id)
            if envs is None:
                envs = DockerEnvironments(
                    run_id=run_id,
                    emit=self._pool_event,
                    warm=warm,
                    aliases=AliasMap.from_env(self.config.aliases or None),
                    runtime=self.config.runtime,
                )
                await envs.__aenter__()
                self._envs[run_id] = envs
            return envs

    async def _pool_event(self, event: Event) -> None:
        # The client records SandboxStarted/SandboxStopped in the run's log; the pool's own
        # tell only whether a start was warm.
        if isinstance(event, SandboxStarted) and event.episode_id:
            self._warm[event.episode_id] = event.warm

    async def _stop(self, sandbox_id: str, reason: str) -> None:
        held = self._held.pop(sandbox_id, None)
        if held is None:
            return
        log.info("sandbox %s (run %s): stopped (%s)", sandbox_id[:12], held.run_id, reason)
        await held.stack.aclose()
        with contextlib.suppress(Exception):
            await self._publish_advert()

    async def _admin_request(self, req: Request) -> Reply:
        if isinstance(req, AdminLs):
            rows = [self._row(sid, h) for sid, h in self._held.items()]
            if req.stats:
                mem = await asyncio.gather(*(self._memory_mb(r.sandbox_id) for r in rows))
                rows = [
                    msgspec.structs.replace(r, memory_mb=m) for r, m in zip(rows, mem, strict=True)
                ]
            return Reply(rows=rows)
        if isinstance(req, AdminStop):
            doomed = [
                sid
                for sid, h in self._held.items()
                if (req.sandbox_id and sid.startswith(req.sandbox_id))
                or (req.of_run and h.run_id == req.of_run)
            ]
            rows = [self._row(sid, self._held[sid]) for sid in doomed]
            await asyncio.gather(*(self._stop(sid, "stopped by admin") for sid in doomed))
            return Reply(rows=rows, count=len(rows))
        if isinstance(req, AdminGc):
            doomed = [sid for sid, h in self._held.items() if h.run_id == req.of_run]
            rows = [self._row(sid, self._held[sid]) for sid in doomed]
            if not req.dry_run:
                await asyncio.gather(*(self._stop(sid, "gc") for sid in doomed))
            removed = await collect_garbage(self.docker, dry_run=req.dry_run, run_id=req.of_run)
            known = {r.sandbox_id[:12] for r in rows}
            rows += [
                SandboxRow(
                    service_id=self.id,
                    host=s.host,
                    sandbox_id=s.id,
                    run_id=s.run_id,
                    episode_id=s.episode_id,
                    image=s.image,
                )
                for s in removed
                if s.id[:12] not in known
            ]
            return Reply(rows=rows, count=len(rows))
        return Reply(error="auth", message=f"{type(req).__name__} is not an admin request")

    def _row(self, sandbox_id: str, held: _Held) -> SandboxRow:
        now = time.monotonic()
        return SandboxRow(
            service_id=self.id,
            host=socket.gethostname(),
            sandbox_id=sandbox_id,
            run_id=held.run_id,
            episode_id=held.episode_id,
            image=held.image,
            age_s=now - held.started,
            idle_s=now - held.last,
        )

    async def _memory_mb(self, sandbox_id: str) -> float | None:
        try:
            stats = await self.docker.containers.container(sandbox_id).stats(stream=False)
        except aiodocker.DockerError:
            return None
        usage = (stats[0] if stats else {}).get("memory_stats", {}).get("usage")
        return None if usage is None else float(usage) / 2**20


def _extract(tar: bytes, into: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="tar")  # keeps modes (exec bits); refuses ../ paths


def _unpack_task(tar: bytes, task_dir: Path) -> None:
    """Unpack a task directory atomically (a crash leaves no half directory behind)."""
    task_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=task_dir.parent))
    try:
        _extract(tar, tmp)
        try:
            tmp.rename(task_dir)
        except OSError:  # another start unpacked it first
            if not task_dir.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
