"""Escape and abuse attempts, each checked by its concrete effect (not by an exit code alone):
the attempt is contained on every backend where it applies (docker, remote over the sandbox
service, process), and where it goes through the service it is refused with the right error.

In-container attempts share one sandbox per backend (fast). The outcome of each attempt is
printed as a table row (`pytest -s`) for the hardening report.

Not here: guessing another episode's gateway route (a credential is a uuid4, 122 random bits,
and an unknown one is refused with 401: tests/inference/test_gateway.py::
test_calls_without_a_known_credential_are_refused_in_launcher_mode)."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiodocker
import msgspec
import pytest

from stacx.bus.connection import connect
from stacx.bus.server import EmbeddedNats
from stacx.events import FailureKind
from stacx.ports import ExecResult, InfraFailure, Limits, Sandbox
from stacx.sandbox.docker import DockerSandbox
from stacx.sandbox.process import ProcessSandbox
from stacx.sandbox.remote import RemoteEnvironments
from stacx.sandbox.remote_wire import (
    ENCODER,
    REPLY_DECODER,
    AdminStop,
    ReadFile,
    admin_subject,
    run_subject,
    run_token,
)
from tests.sandbox.backends import backend, limits_task, sandbox, serving

__all__ = ["backend", "sandbox"]  # the parametrized fixtures


@dataclass
class Attempt:
    name: str
    cmd: str
    contained: Callable[[ExecResult], bool]
    user: str | None = None  # docker/remote: run as this user (the process backend has its own)
    setup: str = ""  # run first as the sandbox's default user (root in a container)


def _no(marker: str) -> Callable[[ExecResult], bool]:
    return lambda r: marker not in r.stdout


def _not_zero_euid(r: ExecResult) -> bool:
    return "0" not in r.stdout.split()


def _refused(r: ExecResult) -> bool:
    # EPERM: no CAP_SYS_MODULE (or seccomp); ENOSYS: a kernel without module loading (gVisor).
    # EFAULT/EINVAL would mean the call got as far as reading the (bogus) module: not refused
    return r.stdout.split() in (["-1", str(errno.EPERM)], ["-1", str(errno.ENOSYS)])


PY = "python3 -c"
KMOD = (
    f"{PY} 'import ctypes; c = ctypes.CDLL(None, use_errno=True); "
    'r = c.init_module(ctypes.c_char_p(b"\\0" * 64), 64, b""); print(r, ctypes.get_errno())\''
)
ATTEMPTS = [
    # a setuid-root binary (what sudo and su are) run by an unprivileged user
    Attempt(
        "setuid binary",
        "/tmp/suidpy -c 'import os; print(os.geteuid())'; "
        "sudo -n id -u 2>/dev/null; su -c 'id -u' root </dev/null 2>/dev/null",
        _not_zero_euid,
        user="nobody",
        setup='cp "$(readlink -f "$(command -v python3)")" /tmp/suidpy && chmod 4755 /tmp/suidpy',
    ),
    Attempt(
        "raw socket (ARP, AF_PACKET)",
        f"{PY} 'import socket; socket.socket(socket.AF_PACKET, "
        "socket.SOCK_RAW, socket.htons(0x0806))' && echo OPENED",
        _no("OPENED"),
    ),
    Attempt(
        "raw socket (ICMP)",
        f"{PY} 'import socket; socket.socket(socket.AF_INET, "
        "socket.SOCK_RAW, socket.IPPROTO_ICMP)' && echo OPENED",
        _no("OPENED"),
    ),
    Attempt(
        "mount", "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m && echo MOUNTED", _no("MOUNTED")
    ),
    Attempt("unshare -m", "unshare -m true && echo UNSHARED", _no("UNSHARED")),
    Attempt("unshare -r", "unshare -r true && echo UNSHARED", _no("UNSHARED")),
    Attempt("/proc/sysrq-trigger", "echo h > /proc/sysrq-trigger && echo WROTE", _no("WROTE")),
    Attempt("init_module", KMOD, _refused),
]


async def _outcome(sb: Sandbox, a: Attempt, docker_like: bool) -> tuple[bool, str]:
    if a.setup and docker_like:
        await sb.exec(a.setup, timeout=30)
    r = await sb.exec(a.cmd, timeout=30, user=a.user if docker_like else None)
    return a.contained(r), (r.stdout + r.stderr).strip().replace("\n", " | ")[:120]


async def test_in_sandbox_attempts_are_contained(sandbox: Sandbox, backend: str) -> None:
    docker_like = not isinstance(sandbox, ProcessSandbox)
    escaped = []
    for a in ATTEMPTS:
        ok, seen = await _outcome(sandbox, a, docker_like)
        print(f"| {a.name} | {backend} | {'contained' if ok else 'NOT CONTAINED'} | {seen} |")
        if not ok:
            escaped.append((a.name, seen))
    assert not escaped, escaped
    r = await sandbox.exec("echo alive", timeout=30)  # and the sandbox is still usable
    assert r.stdout == "alive\n"


# ---- the gateway's socket directory ----------------------------------------------------------


@pytest.mark.docker
async def test_gateway_socket_dir_is_usable_but_not_replaceable(base_image: str) -> None:
    """As stacx.launch.scaffolds mounts it (read-only): the socket connects; nothing in the
    container can remove or replace it, or drop a file next to it for another episode."""
    from stacx.agents.installed import SOCKET, SOCKET_DIR

    host_dir = tempfile.mkdtemp(prefix="stacx-gw-test-")
    os.chmod(host_dir, 0o755)
    path = os.path.join(host_dir, os.path.basename(SOCKET))

    async def pong(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"pong")
        await w.drain()
        w.close()

    server = await asyncio.start_unix_server(pong, path)
    os.chmod(path, 0o666)
    limits = Limits(memory_mb=256, allow_internet=False, mounts={host_dir: f"{SOCKET_DIR}:ro"})
    try:
        async with await DockerSandbox.create(base_image, limits, run_id="escape") as sb:
            talk = await sb.exec(
                f"{PY} 'import socket; s = socket.socket(socket.AF_UNIX); "
                f's.connect("{SOCKET}"); print(s.recv(9).decode())\'',
                timeout=30,
            )
            assert talk.stdout == "pong\n", talk
            evil = await sb.exec(
                f"rm -f {SOCKET}; touch {SOCKET_DIR}/evil.sock; mv {SOCKET} {SOCKET_DIR}/x",
                timeout=30,
            )
            assert "Read-only file system" in evil.stderr, evil
        assert await asyncio.to_thread(os.listdir, host_dir) == ["gateway.sock"]
    finally:
        server.close()


# ---- the sandbox service -----------------------------------------------------------------------


async def _wire(nc: object, subject: str, req: msgspec.Struct) -> object:
    msg = await nc.request(subject, ENCODER.encode(req), timeout=30)  # type: ignore[attr-defined]
    return REPLY_DECODER.decode(msg.data)


@pytest.mark.docker
async def test_service_refuses_another_runs_sandbox_and_a_flood(
    base_image: str, tmp_path: Path
) -> None:
    """Run `attacker` cannot read run `victim`'s sandbox (on its own subject: unknown sandbox;
    on the victim's subject: its token is refused); starts beyond the slots are refused as
    START infra failures (retried by the rollout, never reward), and the service survives."""
    task = limits_task(tmp_path, base_image, Limits(memory_mb=256, allow_internet=False))
    async with EmbeddedNats(tmp_path / "nats") as server:
        async with (
            serving(server.url, tmp_path / "svc", "esc", slots=1),
            RemoteEnvironments(url=server.url, run_id="victim", token=run_token("victim")) as vic,
            vic.sandbox(vic.task(str(task)), episode_id="v1") as sb,
        ):
            await sb.write_file("/tmp/secret", b"s3cret")
            nc = await connect(server.url)
            try:
                mine = ReadFile(run_id="attacker", token="a", sandbox_id=sb.id, path="/tmp/secret")
                r = await _wire(nc, run_subject("esc", "attacker"), mine)
                assert (r.error, r.data) == ("unknown_sandbox", None), r  # type: ignore[attr-defined]
                theirs = msgspec.structs.replace(mine, run_id="victim")
                r = await _wire(nc, run_subject("esc", "victim"), theirs)
                assert r.error == "auth" and b"s3cret" not in (r.data or b""), r  # type: ignore[attr-defined]
            finally:
                await nc.close()
            async with RemoteEnvironments(
                url=server.url, run_id="flood", token=run_token("flood"), place_wait_s=1.0
            ) as flood:

                async def one(i: int) -> str:
                    try:
                        async with flood.sandbox(flood.task(str(task)), episode_id=f"f{i}"):
                            return "started"
                    except InfraFailure as exc:
                        assert exc.kind == FailureKind.START and "all full" in exc.message
                        return "refused"

                got = await asyncio.gather(*(one(i) for i in range(6)))
            assert got == ["refused"] * 6
            assert (await sb.read_file("/tmp/secret")) == b"s3cret"  # the victim is untouched


@pytest.mark.docker
async def test_admin_requests_need_the_admin_token_when_a_secret_is_set(
    base_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACX_SANDBOX_SECRET", "s")
    task = limits_task(tmp_path, base_image, Limits(memory_mb=256, allow_internet=False))
    async with EmbeddedNats(tmp_path / "nats") as server:
        async with (
            serving(server.url, tmp_path / "svc", "adm", slots=2),
            RemoteEnvironments(url=server.url, run_id="victim", token=run_token("victim")) as vic,
            vic.sandbox(vic.task(str(task)), episode_id="v1") as sb,
        ):
            nc = await connect(server.url)
            try:
                stop = AdminStop(run_id="", token="guess", sandbox_id="", of_run="victim")
                r = await _wire(nc, admin_subject("adm"), stop)
                assert r.error == "auth", r  # type: ignore[attr-defined]
            finally:
                await nc.close()
            assert (await sb.exec("echo alive", timeout=30)).stdout == "alive\n"


# ---- SSRF through the allowlist proxy ----------------------------------------------------------


@pytest.mark.docker
async def test_allowlist_proxy_refuses_loopback_metadata_and_the_host(
    base_image: str, tmp_path: Path
) -> None:
    """Allowed names and IPs that are loopback or link-local (cloud metadata) are refused by
    the proxy (403), as is the Docker host's bridge address when it is not listed."""
    from stacx.sandbox.environments import DockerEnvironments

    host = _docker_host_ip()
    allowed = ["localhost", "127.0.0.1", "169.254.169.254", "ip6-localhost"]
    task = limits_task(tmp_path, base_image, Limits(memory_mb=256))
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace("allow_internet = true\n", "")
        + f'network_mode = "allowlist"\nallowed_hosts = {allowed!r}\n'.replace("'", '"')
    )
    probe = (
        f"{PY} 'import sys, urllib.request as u\n"
        "for url in sys.argv[1:]:\n"
        '    try: u.urlopen(url, timeout=10); print(url, "OPEN")\n'
        '    except Exception as e: print(url, getattr(e, "code", e))\' '
    )
    urls = [
        "http://localhost:22/",
        "http://127.0.0.1:8080/",
        "http://169.254.169.254/latest/",
        "http://ip6-localhost/",
        f"http://{host}:2375/",
    ]
    async with DockerEnvironments(run_id="ssrf") as envs:
        async with envs.sandbox(envs.task(str(task)), episode_id="ssrf") as sb:
            # the attacker's client ignores NO_PROXY (which keeps localhost off the proxy)
            r = await sb.exec(
                probe + " ".join(urls), timeout=120, env={"NO_PROXY": "", "no_proxy": ""}
            )
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert set(lines) == set(urls), r
    assert all(code == "403" for code in lines.values()), r


def _docker_host_ip() -> str:
    """The address of the Docker host on the default bridge (docker0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            import fcntl
            import struct

            req = struct.pack("256s", b"docker0")
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
        except OSError:
            return "172.17.0.1"


@pytest.mark.docker
async def test_hardened_defaults_are_what_docker_runs(base_image: str) -> None:
    async with aiodocker.Docker() as docker:
        async with await DockerSandbox.create(
            base_image, Limits(memory_mb=256), docker=docker
        ) as sb:
            shown = await docker.containers.container(sb.id).show()
            caps = await sb.exec("grep CapEff /proc/self/status", timeout=30)
    host = shown["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and "NET_RAW" not in host["CapAdd"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    assert not any("unconfined" in o for o in host["SecurityOpt"]) and not host["Privileged"]
    # CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7 (not 2: DAC_READ_SEARCH)
    assert int(caps.stdout.split()[1], 16) == (
        1 << 0 | 1 << 1 | 1 << 3 | 1 << 4 | 1 << 5 | 1 << 6 | 1 << 7
    ), caps
