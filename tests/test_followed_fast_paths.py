"""The sidecar's per-line shortcuts must not change a single line or a single answer.

A followed log is read a batch at a time, and at 5,000 lines/s every microsecond a line costs is
half a percent of a core (benchmarks/footprint.py). Each shortcut here is held against the plain
way it replaces, on generated input built to hit its edges:

* ``LineSplitter.feed`` decodes a batch of whole lines in one call and splits it; the reference is
  the same bytes fed one at a time, which always takes the line-by-line way;
* ``_may_open_record`` reads a line's own last characters where no ANSI code can reach them; the
  reference is its definition, the last characters of ``clean(line)``.

(Speed is measured by benchmarks/footprint.py and benchmarks/followed_lines_speed.py, never here.)
"""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from kvwatch.parse import log
from kvwatch.parse import logpatterns as P
from kvwatch.parse.log import _may_open_record, clean
from kvwatch.sources import lines as lines_module
from kvwatch.sources.lines import Line, LineSplitter

# Bytes that each take a decision of the splitter: newline, CR (a CRLF loses it), NUL (a file
# hole's), bytes that are never UTF-8, a three-byte character whole and cut, the characters
# str.splitlines would split at (VT, FS, NEL in UTF-8, LINE SEPARATOR) and plain text.
_PIECES = (
    b"\n",
    b"\r",
    b"\r\n",
    b"\0",
    b"\xff",
    b"\xc3",
    b"\xe2\x82\xac",
    b"\xe2\x82",
    b"\x0b",
    b"\x1c",
    b"\xc2\x85",
    b"\xe2\x80\xa8",
    b"INFO 11-29 14:05:10 [loggers.py:236] ",
    b"Avg prompt throughput: 1.0",
    b"abc",
    b"x" * 40,
)


_CLEAN_PIECES = tuple(p for p in _PIECES if b"\r" not in p and b"\0" not in p)


def _random_stream(rng: random.Random) -> bytes:
    # Half the streams hold no CR or NUL: those are the batches the shortcut takes.
    pieces = _PIECES if rng.random() < 0.5 else _CLEAN_PIECES
    return b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))


def _cuts(rng: random.Random, data: bytes) -> list[bytes]:
    points = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randint(0, 6))))
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in pairwise(edges)]


def _fed(splitter: LineSplitter, chunks: list[bytes]) -> tuple[list[Line], Line | None]:
    lines = [line for chunk in chunks for line in splitter.feed(chunk)]
    return lines, splitter.flush()


@pytest.mark.parametrize("piece", [256 << 10, 50, 3])
@pytest.mark.parametrize("bound", [1 << 20, 48, 7])
def test_a_batch_split_at_once_gives_the_lines_a_byte_at_a_time_gives(
    bound: int, piece: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(bound * piece)
    monkeypatch.setattr(lines_module, "_PIECE_BYTES", piece)  # a batch decoded in pieces this long
    made = [0]  # Lines the batch way made (a byte at a time never takes it: no whole line follows)

    def counted(cls: type, fields: tuple[str, bool, str]) -> Line:
        made[0] += 1
        return tuple.__new__(cls, fields)

    monkeypatch.setattr(lines_module, "_new_line", counted)
    for _ in range(3000):
        data = _random_stream(rng)
        chunks = _cuts(rng, data)
        before = made[0]
        reference = _fed(LineSplitter(bound, "stderr"), [data[i : i + 1] for i in range(len(data))])
        assert made[0] == before
        got = _fed(LineSplitter(bound, "stderr"), chunks)
        assert got == reference, (chunks, got, reference)
    assert made[0] > 100  # the shortcut itself was exercised, not only the way around it


def test_the_lines_after_a_held_one_are_split_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A follower's read mostly ends inside a line: the next batch still takes the shortcut.
    made: list[tuple[str, bool, str]] = []
    monkeypatch.setattr(
        lines_module, "_new_line", lambda cls, fields: made.append(fields) or tuple.__new__(cls, fields)
    )
    splitter = LineSplitter(1 << 20)
    assert splitter.feed(b"a\nb\nha") == [Line("a"), Line("b")]
    assert splitter.feed(b"lf\nc\nd\ne") == [Line("half"), Line("c"), Line("d")]
    assert made == [("a", False, ""), ("b", False, ""), ("c", False, ""), ("d", False, "")]


def test_a_batch_split_at_once_keeps_what_the_splitter_holds_for_the_next_one() -> None:
    splitter = LineSplitter(1 << 20, "stdout")
    assert splitter.feed(b"one\ntwo\nthr") == [Line("one", False, "stdout"), Line("two", False, "stdout")]
    assert splitter.held == 3  # the follower's position of the last whole line is its offset less this
    assert splitter.feed(b"ee\n\xe2\x82\xac\xff\n") == [
        Line("three", False, "stdout"),
        Line("\u20ac\ufffd", False, "stdout"),
    ]
    assert splitter.held == 0


def test_a_batch_with_a_line_over_the_bound_is_cut_as_line_by_line_cuts_it() -> None:
    data = b"short\n" + b"y" * 100 + b"\nend\n"
    assert LineSplitter(10).feed(data) == [Line("short"), Line("y" * 10, True), Line("end")]


# Characters that each take a decision of clean() at the end of a line: ANSI codes with and
# without their ESC (the remnants a copy leaves), their parameters, a web page's no-break spaces,
# a paste's backticks, CRs, and the stats record's start a hard wrap may cut.
_LINE_PIECES = (
    "[",
    "\x1b[",
    "0",
    "36",
    ";",
    "m",
    "1;36m",
    "[0;0m",
    "\x1b[0m",
    "A",
    "Avg",
    "Avg prompt thr",
    " ",
    "\xa0",
    "`",
    "\r",
    "x",
    "[loggers.py:236] ",
    "(APIServer pid=7) ",
    '{"log":"',
)


@pytest.mark.parametrize("seed", range(4))
def test_may_open_record_answers_as_the_cleaned_line_does(seed: int) -> None:
    rng = random.Random(seed)
    shortcut = 0
    for _ in range(20000):
        line = "".join(rng.choice(_LINE_PIECES) for _ in range(rng.randint(0, 14)))
        expected = "A" in clean(line)[-len(P.STATS_START) :]
        assert _may_open_record(line) == expected, repr(line)
        last = line.rfind("[")
        shortcut += "\r" not in line and not line.startswith('{"log":') and len(line) - last > 30
    assert shortcut > 1000


def test_may_open_record_on_the_lines_a_sidecar_sees_most() -> None:
    request = (
        "2026-12-06T03:31:24.123456789Z stdout F (APIServer pid=7) INFO 11-29 14:05:10 [logger.py:43] "
        "Received request cmpl-1f: prompt: 'Summarise', params: SamplingParams(n=1), lora_request: None."
    )
    assert not _may_open_record(request)
    assert _may_open_record("(APIServer pid=7) INFO 11-29 14:05:10 [loggers.py:236] Engine 000: Avg prompt thr")
    # The tail is the cleaned line's: a code right at the end is dropped, the "A" before it counts.
    assert _may_open_record("INFO 11-29 14:05:10 [loggers.py:236] Avg\x1b[0m")
    assert _may_open_record("INFO 11-29 14:05:10 [loggers.py:236] Avg" + "[0;0;0;0;0;0;0;0;0;0;0;0;0m")


# ---- a batch's streams, read at once -------------------------------------------------------------

_STREAM_LINES = (
    "2026-12-06T03:31:24.123456789Z stdout F (APIServer pid=7) INFO 11-29 14:05:10 [logger.py:43] Received request",
    '2026-12-06T03:31:24.123456789Z stdout F INFO:     127.0.0.1:4242 - "POST /v1/completions HTTP/1.1" 200 OK',
    "2026-12-06T03:31:24.123456789Z stderr F WARNING:  Invalid HTTP request received.",
    "2026-12-06T03:31:24.123456789Z stderr P Traceback (most recent call last):",
    "2026-12-06T03:31:24Z stdout F:X   File x.py",
    '{"log":"INFO 11-29 14:05:10 [core.py:1] ok\\n","stream":"stdout","time":"2026-12-06T03:31:24Z"}',
    '{"log":"WARNING:  Invalid HTTP request\\n","stream":"stderr","time":"2026-12-06T03:31:24Z"}',
    '{"log":"half',
    "2026-12-06 stdout F not an entry",
    "\u0663026-12-06T03:31:24Z stdout F a digit that is no ASCII digit",
    "INFO 11-29 14:05:10 [core.py:1] a line no runtime wrote",
    "",
)


def _reference_seek(lines: log.ListLines, n: int, pos: int, stream: str, forward: bool, pieces: set[int]) -> int | None:
    step = 1 if forward else -1
    while 0 <= pos < n:
        s = lines.stream(pos)
        if (not s or s == stream) and pos not in pieces:
            return pos
        pos += step
    return None


def test_a_batchs_streams_read_at_once_are_each_lines_own() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        lines = [rng.choice(_STREAM_LINES) for _ in range(rng.randint(0, 12))]
        assert log.line_streams(lines, "\n".join(lines)) == [log.line_stream(line) for line in lines]


def test_a_streams_view_of_a_batch_walks_only_its_lines_and_answers_as_the_walk_over_all() -> None:
    rng = random.Random(6)
    for _ in range(600):
        texts = [rng.choice(_STREAM_LINES) for _ in range(rng.randint(1, 14))]
        pieces = {i for i in range(len(texts)) if rng.random() < 0.15}
        texts = ["" if i in pieces else t for i, t in enumerate(texts)]
        streams = log.line_streams(texts, "\n".join(texts))
        for stream in ("cstdout", "cstderr", "dstdout", "dstderr"):
            view = log.ListLines(texts, pieces, streams)
            runs = log.EchoRuns(view)  # record_head per line, as the runs read them
            for pos in range(len(texts)):
                for forward in (True, False):
                    assert view.seek(pos, stream, forward) == _reference_seek(
                        view, len(texts), pos, stream, forward, pieces
                    )
                expected = next(
                    (
                        i
                        for i in range(pos, len(texts))
                        if streams[i] in ("", stream) and log._visible(texts[i]) and runs.head(i).bounds
                    ),
                    None,
                )
                fresh = log.ListLines(texts, pieces, streams)
                assert fresh.headed_from(pos, runs.head, stream) == expected
                assert view.headed_from(pos, runs.head, stream) == expected  # through the memo too
