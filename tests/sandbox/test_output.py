"""Bounded output capture (pure)."""

from __future__ import annotations

from stacx.sandbox.output import OutputCapture


def test_short_output_is_kept_whole() -> None:
    cap = OutputCapture(100)
    cap.feed(b"hello ")
    cap.feed(b"world")
    assert cap.text() == ("hello world", False)


def test_long_output_keeps_head_and_tail_around_a_marker() -> None:
    cap = OutputCapture(10)
    for chunk in (b"HEAD", b"x" * 1000, b"m" * 10_000, b"TAIL!"):
        cap.feed(chunk)
    text, truncated = cap.text()
    assert truncated
    assert text == "HEADx\n[... 10999 bytes truncated by stacx ...]\nTAIL!"
    assert cap.total == 11_009
    assert len(cap.head) + len(cap.tail) <= 10


def test_memory_stays_bounded_while_feeding() -> None:
    cap = OutputCapture(1 << 10)
    for _ in range(10_000):
        cap.feed(b"z" * 4096)
        assert len(cap.head) + len(cap.tail) <= 3 * (1 << 10)


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    cap = OutputCapture(100)
    cap.feed(b"ok \xff\xfe")
    assert cap.text() == ("ok \ufffd\ufffd", False)
