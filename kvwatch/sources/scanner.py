"""Candidate lines of a buffer: every line holding one literal of the pattern table, found in one pass.

The reader decodes and parses only lines that hold one of ``logpatterns.PREFILTER_ANCHORS`` (every
row of the pattern table contains one, a test checks that). Finding them is most of the byte work
of ``kvwatch analyze``: one ``bytes.find`` pass per literal costs about a grep of the buffer each,
so 28 literals cost 28 greps. A compiled multi-pattern engine does all of them in one pass:

* ``hyperscan`` (Intel's regex engine, the one Suricata uses; PyPI wheels for Linux x86_64), where
  it imports. One expression, ``(?:lit1|lit2|...)[^\\n]*\\n``, reports each candidate line once, at
  its newline: Hyperscan reports a match of one expression at one end offset once, however many
  literals the line holds (Hyperscan developer reference, "Matching": "each match is reported at
  most once per end offset"), so the Python callback runs once per candidate line, not per hit.
* the pure-Python fallback (``bytes.find`` per literal, the reader's original scanner) everywhere
  else: the same lines, slower. ``KVWATCH_SCANNER=python`` forces it (tests compare the two).

Both return the same spans for the same bytes, so the analyze document does not depend on which
one ran; ``name()`` says which did (``kvwatch --version``).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import zlib
from typing import Any

from kvwatch.parse.logpatterns import PREFILTER_ANCHORS
from kvwatch.sources.pieces import PARTIALS, partial_lines, python_partials

ENV_VAR = "KVWATCH_SCANNER"  # "python" forces the pure-Python scanner; anything else: the best one

Spans = dict[int, int]  # line start -> line end (the end excludes the newline)


def find_lines(data: bytes, anchors: tuple[bytes, ...], spans: Spans, lo: int, hi: int) -> None:
    """Pure Python: add the span of every line in ``data[lo:hi]`` holding one of ``anchors``.

    One ``bytes.find`` pass per anchor (memchr-class C code each); a line already found by an
    earlier anchor is skipped past at once, so a frequent anchor first keeps the passes short.
    """
    find, rfind = data.find, data.rfind
    for anchor in anchors:
        pos = find(anchor, lo, hi)
        while pos != -1:
            start = max(lo, rfind(b"\n", lo, pos) + 1)
            end = find(b"\n", pos, hi)
            if end == -1:
                end = hi
            spans[start] = end
            pos = find(anchor, end, hi)


def _expression(anchors: tuple[bytes, ...]) -> bytes:
    # re.escape: every literal byte as itself (Hyperscan reads PCRE syntax, where "\ " and
    # "\." are the literal space and dot, as in Python's re).
    return b"(?:" + b"|".join(re.escape(a) for a in anchors) + b")[^\n]*\n"


def _expressions(anchors: tuple[bytes, ...]) -> list[bytes]:
    """What one database finds: the anchors' candidate lines (id 0), then the partial entries of
    a container runtime (ids 1.., kvwatch.sources.pieces), which cost the pass next to nothing."""
    return [_expression(anchors), *PARTIALS]


def database_key() -> bytes:
    """The expressions of the database, as one key (its cache file is named by it)."""
    return b"\0".join(_expressions(PREFILTER_ANCHORS))


def _compile(hyperscan: Any, expressions: list[bytes]) -> Any:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    multiline = hyperscan.HS_FLAG_MULTILINE  # "^" at every line start, as Python's re.MULTILINE
    db.compile(
        expressions=expressions,
        ids=list(range(len(expressions))),
        flags=[0, *(multiline for _ in expressions[1:])],
    )
    return db


class _Hyperscan:
    """The anchors compiled into one Hyperscan block-mode database (compiled once per process)."""

    def __init__(self, hyperscan: Any, anchors: tuple[bytes, ...], db: Any = None) -> None:
        self.anchors = anchors
        if db is None:
            db = _compile(hyperscan, _expressions(anchors))
        self.db = db
        self.version = str(getattr(hyperscan, "__version__", "?"))

    def find(self, data: bytes, spans: Spans, lo: int, hi: int, partials: list[int] | None = None) -> None:
        """Add the span of every line in ``data[lo:hi]`` holding one of the anchors, and to
        ``partials`` the start of every partial runtime entry (ascending)."""
        if hi <= lo:
            return
        ends: list[int] = []
        append = ends.append
        cut: list[int] = []
        append_cut = cut.append

        def on_match(id_: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
            if id_:
                append_cut(to)
            else:
                append(to)

        # A memoryview: the 16 MiB chunk is scanned in place, not copied.
        self.db.scan(memoryview(data)[lo:hi], match_event_handler=on_match)
        rfind = data.rfind
        for to in ends:
            end = lo + to - 1  # the newline
            spans[max(lo, rfind(b"\n", lo, end) + 1)] = end
        if partials is not None and cut:
            # A partial entry's match lies within its line, from its start.
            partials.extend(sorted({max(lo, rfind(b"\n", lo, lo + to) + 1) for to in cut}))
        # The expression needs the newline: a last line without one is checked here.
        if data[hi - 1 : hi] != b"\n":
            start = max(lo, rfind(b"\n", lo, hi) + 1)
            line = data[start:hi]
            if any(a in line for a in self.anchors):
                spans[start] = hi


# A short-lived interpreter that compiles the expressions on stdin (NUL-separated) and writes the
# serialized database.
_COMPILER = (
    "import sys, hyperscan\n"
    "exprs = sys.stdin.buffer.read().split(bytes(1))\n"
    "db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)\n"
    "flags = [0] + [hyperscan.HS_FLAG_MULTILINE] * (len(exprs) - 1)\n"
    "db.compile(expressions=exprs, ids=list(range(len(exprs))), flags=flags)\n"
    "sys.stdout.buffer.write(hyperscan.dumpb(db))\n"
)
_compile_elsewhere = False  # set by compile_out_of_process()


def cache_path(expression: bytes, version: str) -> str:
    """Where the serialized database for ``expression`` is kept between runs.

    Compiling costs ~16 ms, in every process that scans (``analyze``'s parent for a small log, each
    of its workers for a big one, the sidecar), where loading the 40 KB it gives takes well under
    one (hs_serialize_database / hs_deserialize_database). The file is named by the expression and
    the hyperscan version, under $XDG_CACHE_HOME/kvwatch (~/.cache/kvwatch).
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = f"{zlib.crc32(expression):08x}{len(expression):x}"
    return os.path.join(base, "kvwatch", f"hyperscan-{version}-{key}.db")


def _load(hyperscan: Any, serialized: bytes) -> Any:
    db = hyperscan.loadb(serialized, hyperscan.HS_MODE_BLOCK)
    db.scratch = hyperscan.Scratch(db)
    return db


def _cached(hyperscan: Any, path: str) -> Any:
    """The database kept at ``path``, or None: none kept, unreadable, or refused by hyperscan (a
    damaged file, or one compiled for another CPU: hs_deserialize_database checks the platform)."""
    try:
        with open(path, "rb") as fh:
            serialized = fh.read()
        return _load(hyperscan, serialized)
    except Exception:  # OSError, hyperscan.error: compile instead
        return None


def _keep(path: str, serialized: bytes) -> None:
    """Keep a serialized database at ``path`` for the next run; a cache that cannot be written
    (a read-only file system, no home) is no error, the next run compiles again."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(serialized)
        os.replace(tmp, path)  # whole or absent: a concurrent reader never sees half a file
    except OSError:
        pass


def _compiled_elsewhere(hyperscan: Any, expression: bytes) -> bytes:
    """The serialized database compiled by another interpreter: this process never runs
    Hyperscan's compiler (see compile_out_of_process)."""
    out = subprocess.run(
        [sys.executable, "-c", _COMPILER], input=expression, capture_output=True, timeout=120, check=True
    )
    return out.stdout


@functools.cache
def _compiled() -> _Hyperscan | None:
    """The compiled scanner for PREFILTER_ANCHORS (once per process), or None if it cannot load.

    From the cache of an earlier run where it holds the database, else compiled (here, or in a
    short-lived interpreter after compile_out_of_process) and kept for the next run.
    """
    try:
        import hyperscan
    except ImportError:  # no wheel for this platform: the pure-Python scanner
        return None
    expression = database_key()
    version = str(getattr(hyperscan, "__version__", "0"))
    path = cache_path(expression, version)
    db = _cached(hyperscan, path)
    if db is None and _compile_elsewhere:
        try:
            serialized = _compiled_elsewhere(hyperscan, expression)
            db = _load(hyperscan, serialized)
            _keep(path, serialized)
        except Exception:  # no interpreter to run, a timeout, a refused database: compile here
            db = None
    try:
        if db is None:
            engine = _Hyperscan(hyperscan, PREFILTER_ANCHORS)
            _keep(path, hyperscan.dumpb(engine.db))
            return engine
        return _Hyperscan(hyperscan, PREFILTER_ANCHORS, db)
    except Exception:  # hyperscan.error (e.g. a CPU without SSSE3): the pure-Python scanner
        return None


def compile_out_of_process() -> None:
    """Compile the database in a short-lived interpreter from now on, for a long-running process.

    Hyperscan's compiler is most of the library: compiling in the sidecar touched its pages and
    left its heap behind, ~5 MiB of resident memory for the sidecar's life (benchmarks/footprint.py:
    58.7 vs 52.4 MiB after 90 s at 5,000 lines/s). The database a compile gives is 40 KB and
    loads without the compiler. Call before the first scan. Either way the database is kept for the
    next run (cache_path), which then loads it and compiles nothing.
    """
    global _compile_elsewhere  # noqa: PLW0603 (one switch for the process, set once at start-up)
    _compile_elsewhere = True
    _compiled.cache_clear()


def _engine() -> _Hyperscan | None:
    """The scanner to use now: the compiled one unless KVWATCH_SCANNER=python forces it off."""
    if os.environ.get(ENV_VAR, "").lower() == "python":
        return None
    return _compiled()


def line_spans(data: bytes, lo: int = 0, hi: int | None = None, partials: list[int] | None = None) -> Spans:
    """Start -> end of every line of ``data[lo:hi]`` that holds one of PREFILTER_ANCHORS; and,
    given ``partials``, the start of every partial container-runtime entry appended to it
    (ascending; kvwatch.sources.pieces).

    ``data[lo:hi]`` is whole lines (the last may lack its newline). The same spans and partials
    whichever scanner runs.
    """
    hi = len(data) if hi is None else hi
    spans: Spans = {}
    engine = _engine()
    if engine is not None:
        engine.find(data, spans, lo, hi, partials)
    else:
        find_lines(data, PREFILTER_ANCHORS, spans, lo, hi)
        if partials is not None:
            partials.extend(python_partials(data, lo, hi))
    return spans


def name() -> str:
    """Which scanner reads logs in this process: ``hyperscan X.Y.Z`` or ``python``."""
    engine = _engine()
    return f"hyperscan {engine.version}" if engine is not None else "python"


# The anchors as text, for lines that arrive decoded (the sidecar's followed lines).
_TEXT_ANCHORS = tuple(a.decode("ascii") for a in PREFILTER_ANCHORS)


def anchored_lines(lines: list[str], partials: list[int] | None = None) -> list[bool]:
    """For each of ``lines`` (decoded, without their newlines): whether it holds one of
    PREFILTER_ANCHORS, the same answer whichever scanner runs; and, given ``partials``, the index
    of every line that is a partial container-runtime entry appended to it (ascending).

    The sidecar follows a log one batch of lines at a time; a line with no anchor holds no line
    kind of the pattern table, so the parser can pass it by (``LogParser.feed_lines``). The
    compiled scanner checks the whole batch in one pass over its UTF-8 bytes (the anchors are
    ASCII, so a line's bytes hold one exactly when its text does); the fallback, one ``in`` per
    anchor per line.
    """
    engine = _engine()
    data = b""
    if engine is not None and lines:
        # "replace": a lone surrogate (never produced by the UTF-8 decoder's "replace") cannot spell an anchor.
        data = "\n".join(lines).encode("utf-8", "replace") + b"\n"
    if engine is None or data.count(b"\n") != len(lines):  # no engine, or a line holding a newline
        if partials is not None:
            partials.extend(partial_lines(lines))
        return [any(a in line for a in _TEXT_ANCHORS) for line in lines]
    spans: Spans = {}
    cut: list[int] | None = None if partials is None else []
    engine.find(data, spans, 0, len(data), cut)
    hits = [False] * len(lines)
    index = 0
    prev = 0
    count = data.count
    for start in sorted(spans):  # line starts, ascending: count the newlines between them once
        index += count(b"\n", prev, start)
        prev = start
        hits[index] = True
    if cut and partials is not None:
        index = prev = 0
        for start in cut:
            index += count(b"\n", prev, start)
            prev = start
            partials.append(index)
    return hits
