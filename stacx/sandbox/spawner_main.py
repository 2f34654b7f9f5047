"""The process sandbox's spawner program: one small process per sandbox, inside its namespaces and
chroot, that forks each command from its own small address space, so the caller never forks (STYLE
principle 21). Built-in modules only, never stacx; `live_processes` is the project's one /proc scan.

Design: docs/sandboxes.md#the-spawners-protocol
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # `signal` imports enum: 10 ms of startup
import _socket
import marshal
import os
import resource
import select
import sys
import time

SIGKILL = 9
SWEEP_TRIES = 50
# the signals ignored when the spawner started (Python ignores SIGPIPE and SIGXFSZ; whatever started
# it may ignore more, e.g. nohup: SIGHUP): an ignored signal survives exec, a command starts with none
IGNORED = [
    sig
    for sig in _signal.valid_signals()
    if sig not in (_signal.SIGKILL, _signal.SIGSTOP) and _signal.getsignal(sig) == _signal.SIG_IGN
]


def live_processes(uid: int) -> list[int]:
    """Pids of `uid`'s processes that are not zombies (from /proc)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        state = fields.get(b"State", b"").strip()
        if fields.get(b"Uid", b"").split()[:1] == [str(uid).encode()] and state[:1] not in b"ZX":
            pids.append(int(name))
    return pids


def _command(req: tuple, out: int, err: int, null: int) -> None:  # type: ignore[type-arg]
    """In the forked child: its own session, the rlimits, the uid switch, exec. Never returns."""
    _, _, argv, env, cwd, ids, rlimits = req
    code = 126
    try:
        os.setsid()
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for sig in IGNORED:  # they and the blocked mask survive exec
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        for res, soft, hard in rlimits:
            resource.setrlimit(res, (soft, hard))
        if ids is not None:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])
        os.chdir(cwd)
        code = 127
        _execvpe(argv, env)
    except Exception as exc:  # anything: the command's stderr says why
        code = 127 if code == 127 and isinstance(exc, FileNotFoundError) else 126
        os.write(2, f"stacx sandbox: cannot run {argv[0]!r} in {cwd}: {exc}\n".encode())
    finally:
        os._exit(code)


def _execvpe(argv: list[str], env: dict[str, str]) -> None:
    """os.execvpe without its lazy `import warnings`: 127 when not found, 126 when not runnable."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    error: OSError | None = None
    for d in env.get("PATH", "/usr/bin:/bin").split(":"):
        try:
            os.execve(f"{d or '.'}/{argv[0]}", argv, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            error = error or exc
        except PermissionError as exc:
            if not os.access(d or ".", os.X_OK):
                error = error or FileNotFoundError(exc.errno, exc.strerror, argv[0])
            elif error is None or isinstance(error, FileNotFoundError):
                error = exc
        except OSError as exc:
            error = exc if error is None or isinstance(error, FileNotFoundError) else error
    raise error or FileNotFoundError(argv[0])


def _sweep(uid: int) -> None:
    """In a forked child, as `uid`: kill(-1) (atomic against fork) until none is left."""
    code = 1
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        me = os.getpid()
        for _ in range(SWEEP_TRIES):
            try:
                os.kill(-1, SIGKILL)  # every process of `uid`, except this one
            except ProcessLookupError:
                pass
            if not [pid for pid in live_processes(uid) if pid != me]:
                code = 0
                break
            time.sleep(0.02)
    finally:
        os._exit(code)


def _fork(target, *args) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:
        target(*args)
    return pid


class Spawner:
    def __init__(self, ctl: _socket.socket, sweep_uid: int | None) -> None:
        self.ctl = ctl
        self.sweep_uid = sweep_uid
        self.null = os.open(os.devnull, os.O_RDONLY)  # opened before the chroot
        self.jobs: dict[int, int] = {}  # pid -> request id
        self.groups: set[int] = set()  # the commands' process groups (= their pids)
        self.buf = b""
        self.fds: list[int] = []

    def send(self, kind: str, rid: int, value: int) -> None:
        data = marshal.dumps((kind, rid, value))
        self.ctl.sendall(len(data).to_bytes(4, "little") + data)

    def receive(self) -> bool:
        """Read what the caller sent, run each whole request; False at EOF."""
        space = _socket.CMSG_SPACE(4 * 64)
        data, anc, _, _ = self.ctl.recvmsg(1 << 16, space, _socket.MSG_CMSG_CLOEXEC)
        if not data:
            return False
        for level, kind, payload in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                n = len(payload) - len(payload) % 4
                self.fds += [
                    int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, n, 4)
                ]
        self.buf += data
        while len(self.buf) >= 4 and len(self.buf) >= 4 + (
            n := int.from_bytes(self.buf[:4], "little")
        ):
            req, self.buf = marshal.loads(self.buf[4 : 4 + n]), self.buf[4 + n :]
            self.handle(req)
        return True

    def handle(self, req: tuple) -> None:  # type: ignore[type-arg]
        if req[0] == "exec":
            out, err, self.fds = self.fds[0], self.fds[1], self.fds[2:]
            pid = _fork(_command, req, out, err, self.null)
            os.close(out)
            os.close(err)
            self.groups.add(pid)
        else:
            pid = _fork(_sweep, req[2])
        self.jobs[pid] = req[1]
        self.send("pid", req[1], pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.groups.discard(pid)
            if pid in self.jobs:
                self.send("exit", self.jobs.pop(pid), status)

    def shutdown(self) -> int:
        for pgid in self.groups:
            try:
                os.killpg(pgid, SIGKILL)
            except OSError:
                pass
        if self.sweep_uid is None:
            return 0
        _, status = os.waitpid(_fork(_sweep, self.sweep_uid), 0)
        return os.waitstatus_to_exitcode(status)


def _bind(root: str, names: list[str]) -> None:
    """`mount --rbind /NAME ROOT/NAME` for each, as syscalls (4 ms; `mount` processes: 70 ms)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    flags = 4096 | 16384  # MS_BIND | MS_REC
    for name in names:
        if libc.mount(f"/{name}".encode(), f"{root}/{name}".encode(), None, flags, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"mount --rbind /{name} {root}/{name}: {os.strerror(errno)}")


def _loopback_up() -> None:
    """`ip link set lo up` where `ip` is installed (else loopback stays down)."""
    for ip in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if os.path.exists(ip):
            pid = os.posix_spawn(ip, [ip, "link", "set", "lo", "up"], {})
            os.waitpid(pid, 0)
            return


def main() -> int:
    ctl_fd, root, sweep_uid, loopback, *binds = sys.argv[1:]
    if binds:
        _bind(root, binds)
    if loopback == "1":
        _loopback_up()
    if root:
        os.chroot(root)
        os.chdir("/")
    if ctl_fd == "-":
        return 0
    ctl = _socket.socket(fileno=int(ctl_fd))
    os.set_inheritable(ctl.fileno(), False)
    spawner = Spawner(ctl, int(sweep_uid) if sweep_uid else None)
    wake_r, wake_w = os.pipe()  # SIGCHLD wakes the poll below through this pipe
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    _signal.set_wakeup_fd(wake_w)
    spawner.send("ready", 0, os.getpid())
    poll = select.poll()
    poll.register(ctl.fileno(), select.POLLIN)
    poll.register(wake_r, select.POLLIN)
    while True:
        for fd, _ in poll.poll():
            if fd == wake_r:
                try:  # drain the wake-ups
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                spawner.reap()
            elif not spawner.receive():
                return spawner.shutdown()


if __name__ == "__main__":
    sys.exit(main())
