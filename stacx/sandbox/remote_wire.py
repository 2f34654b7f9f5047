"""The sandbox service's wire protocol, spoken by stacx.sandbox.service and stacx.sandbox.remote:
subjects, msgpack messages, the run's token, chunked request/reply. A service executes a request
only with the run's token.

Design: docs/sandboxes.md#the-sandbox-services-wire
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from pathlib import Path

import msgspec

from stacx.events import FailureKind
from stacx.ports import ExecResult, InfraFailure, StepFailed, Verdict

ADVERT = "stacx.sandbox.advert"
DISCOVER = "stacx.sandbox.discover"
SECRET_ENV = "STACX_SANDBOX_SECRET"
# room left in a message for the envelope around a chunk of bytes
CHUNK_HEADROOM = 16 * 1024


def run_subject(service_id: str, run_id: str) -> str:
    return f"stacx.sandbox.svc.{service_id}.run.{subject_token(run_id)}"


def admin_subject(service_id: str) -> str:
    return f"stacx.sandbox.svc.{service_id}.admin"


def subject_token(name: str) -> str:
    """`name` made safe as one NATS subject token (no dots, spaces or wildcards)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"


def run_token(run_id: str, run_dir: str | Path | None = None) -> str:
    """HMAC-SHA256($STACX_SANDBOX_SECRET, run_id); without a secret, a random one in the run dir."""
    secret = os.environ.get(SECRET_ENV)
    if secret:
        return hmac.new(secret.encode(), run_id.encode(), hashlib.sha256).hexdigest()
    if run_dir is None:
        return secrets.token_hex(16)
    path = Path(run_dir) / "sandbox.token"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        token = secrets.token_hex(16)
        f.write(token)
    return token


def admin_token() -> str:
    secret = os.environ.get(SECRET_ENV)
    return hmac.new(secret.encode(), b"admin", hashlib.sha256).hexdigest() if secret else ""


def task_digest(task_dir: Path) -> str:
    """A content hash of a task directory (paths, executable bits, bytes; not mtimes)."""
    h = hashlib.sha256()
    for path in sorted(task_dir.rglob("*")):
        if path.is_dir():
            continue
        rel = path.relative_to(task_dir).as_posix()
        mode = path.lstat().st_mode
        h.update(f"{rel}\0{int(bool(mode & stat.S_IXUSR))}\0".encode())
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:24]


class Advert(msgspec.Struct, frozen=True, kw_only=True):
    """What a service offers: slots (sandboxes at once) and the task images it has built."""

    service_id: str
    host: str
    pid: int
    started_at: float  # unix time
    slots: int
    used: int
    cpus: float
    memory_mb: int
    heartbeat_s: float
    tasks: list[str] = []  # task digests whose image is built here
    runs: list[str] = []  # runs with sandboxes here


class _Request(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    run_id: str
    token: str


class _AboutSandbox(_Request, frozen=True, kw_only=True):
    sandbox_id: str


class Start(_Request, frozen=True, kw_only=True, tag="start"):
    episode_id: str
    task_digest: str
    task_name: str  # the task directory's name (its task id when it has no [task] name)
    task_tar: bytes | None = None  # sent only when the service asks (`missing_task`)
    warm: int = 0  # the run's warm pool size on this host


class Exec(_AboutSandbox, frozen=True, kw_only=True, tag="exec"):
    cmd: str | list[str]
    timeout: float | None = None
    env: dict[str, str] | None = None
    user: str | None = None
    cwd: str | None = None


class ReadFile(_AboutSandbox, frozen=True, kw_only=True, tag="read_file"):
    path: str


class WriteFile(_AboutSandbox, frozen=True, kw_only=True, tag="write_file"):
    path: str
    data: bytes
    mode: int = 0o644


class Upload(_AboutSandbox, frozen=True, kw_only=True, tag="upload"):
    remote_dir: str
    tar: bytes


class Verify(_AboutSandbox, frozen=True, kw_only=True, tag="verify"):
    """Run the task's verifier on the service, as DockerEnvironments.verify does."""

    episode_id: str
    step: str | None = None  # a multi-step task's step (Task.step)


class Stop(_AboutSandbox, frozen=True, kw_only=True, tag="stop"):
    reason: str = "released"


class Heartbeat(_Request, frozen=True, kw_only=True, tag="heartbeat"):
    """The client still holds these sandboxes (their lease is renewed)."""

    sandbox_ids: list[str]


class Status(_AboutSandbox, frozen=True, kw_only=True, tag="status"):
    """Whether the sandbox is running (a reply with count 1)."""


class Chunk(_Request, frozen=True, kw_only=True, tag="chunk"):
    """One piece of a request too large for one message."""

    blob_id: str
    index: int
    data: bytes


class Assembled(_Request, frozen=True, kw_only=True, tag="assembled"):
    """The request is the concatenation of the `n` chunks of `blob_id`."""

    blob_id: str
    n: int


class Fetch(_Request, frozen=True, kw_only=True, tag="fetch"):
    """One piece of a reply too large for one message (idempotent)."""

    blob_id: str
    index: int


class AdminLs(_Request, frozen=True, kw_only=True, tag="admin_ls"):
    stats: bool = False  # with each container's memory use (slower: a stats call each)


class AdminStop(_Request, frozen=True, kw_only=True, tag="admin_stop"):
    sandbox_id: str = ""  # a prefix of the container id, or empty with `of_run`
    of_run: str = ""


class AdminGc(_Request, frozen=True, kw_only=True, tag="admin_gc"):
    dry_run: bool = False
    of_run: str | None = None


Request = (
    Start
    | Exec
    | ReadFile
    | WriteFile
    | Upload
    | Verify
    | Stop
    | Heartbeat
    | Status
    | Chunk
    | Assembled
    | Fetch
    | AdminLs
    | AdminStop
    | AdminGc
)


class Started(msgspec.Struct, frozen=True, kw_only=True):
    sandbox_id: str
    image: str
    workdir: str
    start_ms: float
    warm: bool
    output_limit: int = 0  # bytes kept per stream of an exec's output


class BlobRef(msgspec.Struct, frozen=True, kw_only=True):
    blob_id: str
    n: int


class SandboxRow(msgspec.Struct, frozen=True, kw_only=True):
    """One sandbox as the admin CLI lists it."""

    service_id: str
    host: str
    sandbox_id: str
    run_id: str
    episode_id: str
    image: str
    age_s: float = 0.0
    idle_s: float = 0.0  # since the last request or lease renewal
    memory_mb: float | None = None


class StepFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A multi-step task's step that could not start (stacx.ports.StepFailed), on the wire."""

    step: str
    exception_type: str
    message: str
    verified: Verdict | None = None  # the step verified just before it


class Reply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A service's answer; `error` names what went wrong (docs/sandboxes.md lists them)."""

    error: str = ""
    message: str = ""
    failure_kind: FailureKind | None = None
    step_failed: StepFailure | None = None
    started: Started | None = None
    exec: ExecResult | None = None
    verdict: Verdict | None = None
    data: bytes | None = None
    blob: BlobRef | None = None
    rows: list[SandboxRow] | None = None
    count: int = 0


def failure_reply(exc: InfraFailure) -> Reply:
    """An InfraFailure on the wire; a StepFailed keeps its step (`step_failed_of`)."""
    if not isinstance(exc, StepFailed):
        return Reply(error="infra", failure_kind=exc.kind, message=exc.message)
    failure = StepFailure(
        step=exc.step,
        exception_type=exc.exception_type,
        message=exc.step_message,
        verified=exc.verified,
    )
    return Reply(error="step_failed", message=exc.message, step_failed=failure)


def step_failed_of(reply: Reply) -> StepFailed:
    """The StepFailed a "step_failed" reply carries, as the local backend raises it."""
    if reply.step_failed is None:
        raise ValueError(f"a step_failed reply without its step: {reply.message}")
    f = reply.step_failed
    return StepFailed(f.step, f.exception_type, f.message, f.verified)


ENCODER = msgspec.msgpack.Encoder()
REQUEST_DECODER = msgspec.msgpack.Decoder(Request)
REPLY_DECODER = msgspec.msgpack.Decoder(Reply)
ADVERT_DECODER = msgspec.msgpack.Decoder(Advert)


def split(data: bytes, max_payload: int) -> list[bytes]:
    size = max(max_payload - CHUNK_HEADROOM, 1024)
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]
