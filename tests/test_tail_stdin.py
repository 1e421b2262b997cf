"""``--log -`` (kvwatch.sources.stdin) and the shared line splitter (kvwatch.sources.lines)."""

from __future__ import annotations

import io
import os
import threading

import pytest

from kvwatch.sources.lines import Line, LineSplitter, QueuedLines
from kvwatch.sources.stdin import StdinSource


def drain(source: StdinSource) -> list[Line]:
    """Poll until the stream has ended; every wait is bounded."""
    lines: list[Line] = []
    for _ in range(1000):
        lines += source.poll()
        if source.status().eof:
            return lines
        source.wait(timeout=5)
    raise AssertionError("stdin source never reported EOF")


def test_stdin_lines_arrive_and_eof_is_reported() -> None:
    source = StdinSource(io.BytesIO(b"INFO one\r\nINFO two\nlast without newline"))
    lines = drain(source)
    assert [line.text for line in lines] == ["INFO one", "INFO two", "last without newline"]
    status = source.status()
    assert (status.up, status.eof, status.last_error, status.lines_total) == (False, True, None, 3)


def test_stdin_from_a_real_pipe_waits_for_complete_lines() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb", buffering=0) as reader:
        source = StdinSource(reader)  # type: ignore[arg-type]
        os.write(write_fd, b"INFO half")
        assert source.wait(timeout=0.05) is False  # nothing complete yet
        assert source.poll() == []
        os.write(write_fd, b" and half\n")
        assert source.wait(timeout=60) is True
        assert [line.text for line in source.poll()] == ["INFO half and half"]
        assert source.status().up
        os.close(write_fd)
        assert drain(source) == []


def test_stdin_long_line_is_bounded() -> None:
    source = StdinSource(io.BytesIO(b"y" * 100_000 + b"\nok\n"), max_line_bytes=1000)
    assert [(len(line.text), line.truncated) for line in drain(source)] == [(1000, True), (2, False)]
    assert source.status().truncated_lines_total == 1


class Unreadable(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, buffer: object) -> int:
        raise OSError(5, "Input/output error")


def test_unreadable_stdin_is_reported_not_raised() -> None:
    source = StdinSource(io.BufferedReader(Unreadable()))
    drain(source)
    assert source.last_error is not None
    assert source.last_error.startswith("cannot read standard input")


# ----------------------------------------------------------------------------- the splitter


@pytest.mark.parametrize(
    ("chunks", "bound", "expected", "held"),
    [
        ([b"a\nb\n"], 10, [("a", False), ("b", False)], 0),
        ([b"ab", b"c\n"], 10, [("abc", False)], 0),
        ([b"abcdefghijkl\n"], 5, [("abcde", True)], 0),
        ([b"abc", b"defgh", b"ijk\nz"], 5, [("abcde", True)], 1),
        ([b"\xe2\x82\xac" * 3 + b"\n"], 4, [("\u20ac\ufffd", True)], 0),
        ([b"\x00\x00\x00text\n"], 100, [("text", False)], 0),
        ([b"cr\r\r\n"], 10, [("cr\r", False)], 0),
    ],
    ids=[
        "two_lines",
        "line_across_chunks",
        "over_bound_in_one_chunk",
        "over_bound_across_chunks_then_partial",
        "bound_cuts_a_utf8_char",
        "leading_nuls_from_a_file_hole",
        "only_one_cr_is_a_terminator",
    ],
)
def test_splitter(chunks: list[bytes], bound: int, expected: list[tuple[str, bool]], held: int) -> None:
    splitter = LineSplitter(bound)
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    assert [(line.text, line.truncated) for line in lines] == expected
    assert splitter.held == held


def test_splitter_memory_stays_at_the_bound_however_long_the_line() -> None:
    splitter = LineSplitter(64)
    for _ in range(1000):
        assert splitter.feed(b"z" * 4096) == []
    assert splitter.held == 4096 * 1000
    assert len(splitter._buf) == 64  # the only copy kept
    assert splitter.flush() == Line("z" * 64, truncated=True)
    assert splitter.held == 0


def test_queue_offer_drops_instead_of_blocking_when_full() -> None:
    queue = QueuedLines(max_lines=2)
    assert [queue.offer(Line(str(i))) for i in range(3)] == [True, True, False]
    assert [line.text for line in queue.take()] == ["0", "1"]


def test_queue_wait_wakes_on_a_put_from_another_thread() -> None:
    queue = QueuedLines()
    threading.Thread(target=queue.put, args=(Line("x"),)).start()
    assert queue.wait(timeout=60) is True
    assert queue.take() == [Line("x")]
