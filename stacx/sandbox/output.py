"""Bounded capture of a command's output stream.

Keeps the first and the last `limit // 2` bytes and counts what falls in between; memory stays
O(limit) however much is fed. `text()` decodes (UTF-8, invalid bytes replaced) and, when
something was dropped, puts a visible marker with the byte count where it was.
"""

from __future__ import annotations


class OutputCapture:
    """Keeps the first and last `limit // 2` bytes of a stream, counts what it drops."""

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
