"""Bounded capture of a command's output: O(limit) memory, however much comes."""

from __future__ import annotations

from stacx.ports import ExecResult

KILL_GRACE_S = 2.0  # TERM, then KILL this much later (coreutils timeout -k)


class OutputLimits:
    """The output bounds of a local backend's commands."""

    output_limit = 1 << 20  # bytes kept per stream
    # Past this many bytes of output a command is killed rather than drained (Docker's exec
    # stream drains at tens of MB/s here): a flood costs seconds, not minutes.
    flood_limit = 64 << 20


class OutputCapture:
    """Keeps the first and last `limit // 2` bytes, counts what it drops; `text()` marks the cut."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        if len(self.tail) > 2 * self.half:  # trim rarely: amortized O(1) per byte
            cut = len(self.tail) - self.half
            self.dropped += cut
            del self.tail[:cut]

    def text(self) -> tuple[str, bool]:
        if len(self.tail) > self.half:
            self.dropped += len(self.tail) - self.half
            del self.tail[: len(self.tail) - self.half]
        if self.dropped == 0:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace"), False
        marker = f"\n[... {self.dropped} bytes truncated by stacx ...]\n".encode()
        return (bytes(self.head) + marker + bytes(self.tail)).decode("utf-8", "replace"), True


def exec_result(
    out: OutputCapture,
    err: OutputCapture,
    *,
    exit_code: int | None,
    timed_out: bool,
    duration_ms: float,
    oom_killed: bool,
    pids_limited: bool,
    flood_limit: int | None,
) -> ExecResult:
    """An ended command's ExecResult, as every local backend reports it; `flood_limit`: the
    command was killed for printing more than that (a marker ends its stderr)."""
    if flood_limit is not None:
        err.feed(
            f"\n[stacx: output flood: the command was killed after printing more than "
            f"{flood_limit} bytes]\n".encode()
        )
    stdout, t1 = out.text()
    stderr, t2 = err.text()
    return ExecResult(
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        duration_ms=duration_ms,
        truncated=t1 or t2 or flood_limit is not None,
        oom_killed=oom_killed,
        pids_limited=pids_limited,
    )
