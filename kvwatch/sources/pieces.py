"""Lines a container runtime split into pieces: told apart so that no piece is read as a line.

A container runtime stores what a container writes as one entry per line, and cuts a long line
into several entries:

* Docker's json-file driver (``/var/lib/docker/containers/*/*-json.log``) writes
  ``{"log":"...","stream":"stdout","time":"..."}``. Its copier hands the driver at most 16 KiB at a
  time (moby daemon/logger/copier.go, ``Copier.copySrc``, ``bufSize``), and a piece that is not a
  line's end is written without the ``\\n`` that ends ``log`` (daemon/logger/jsonfilelog,
  ``marshalMessage``: the newline is appended only when the message is not partial).
* The kubelet's CRI files (``/var/log/pods/*/*/N.log``, written by containerd or CRI-O) hold
  ``TIME STREAM TAGS CONTENT``, with the tag ``P`` on every piece but the last, which has ``F``
  (cri-api pkg/apis/runtime/v1/constants.go, ``LogTagPartial``/``LogTagFull``, tags joined by
  ``LogTagDelimiter`` ":"; containerd internal/cri/io/logger.go ``redirectLogs`` cuts at
  ``max_container_log_line_size``, 16 KiB by default).

A client controls where the cut falls in its own text (a long prompt, a stop string, a request
body that vLLM echoes), so the piece after a cut can start with text that spells a vLLM header
and a record: a forged start-up line, stats line or engine death. A piece that continues an entry
is therefore never read as a line of its own: it belongs to the line its first piece started,
whose reading already stops at the first request echo (``kvwatch.parse.provenance``). The first
piece is read as the line, the rest are passed by.

Pieces of one stream follow each other, with entries of the other stream between them at most
(the runtime reads stdout and stderr apart), so the state is one flag per stream: open after a
partial entry, closed after a final one. Text that is no entry (another format glued on) changes
nothing. Where a reader starts in the middle of a log (a worker's byte range, a piece of a .gz),
the state there comes from the ``LOOKBACK`` bytes before it: a stream whose last entry lies
further back than that counts as closed (one runtime piece is at most 16 KiB of text, ~100 KiB
once JSON-escaped, and pieces of one write follow each other).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

LOOKBACK = 256 << 10

# A docker json-file entry whose ``log`` does not end in an escaped newline: the JSON string as a
# run of tokens (a plain byte, or a backslash and the byte it escapes) whose last token is not
# "\n". Shared with the compiled scanner (kvwatch.sources.scanner), which finds these in the
# same pass as the anchors; PCRE syntax, read alike by Python's re.
DOCKER_PARTIAL = rb'^\{"log":"(?:[^"\\\n]|\\[^\n])*(?:[^"\\\n]|\\[^n\n])","stream":"'
# A CRI entry tagged partial: "2026-11-29T14:00:00.123456789Z stdout P ..." (or "P:..." tags).
CRI_PARTIAL = rb"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[^ \n]{1,40} (?:stdout|stderr) P(?:[ :]|$)"
PARTIALS: tuple[bytes, ...] = (DOCKER_PARTIAL, CRI_PARTIAL)

_DOCKER_PARTIAL = re.compile(DOCKER_PARTIAL, re.MULTILINE)
_CRI_PARTIAL = re.compile(CRI_PARTIAL, re.MULTILINE)
_DOCKER_STREAM = re.compile(rb'\{"log":"(?:[^"\\\n]|\\[^\n])*","stream":"([a-z]+)"')
_CRI_STREAM = re.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2}T[^ \n]{1,40} (stdout|stderr) [A-Z](?::[A-Z])*(?: |$)")

Open = frozenset[bytes]  # the streams whose last entry was a partial one
CLOSED: Open = frozenset()


def entry(data: bytes, start: int, end: int) -> tuple[bytes, bool] | None:
    """``(stream, partial)`` of the runtime entry ``data[start:end]`` (one line), None for other text.

    The stream is prefixed by the format (b"d" docker, b"c" CRI): pieces never join across formats.
    """
    head = data[start : start + 1]
    if head == b"{":
        m = _DOCKER_STREAM.match(data, start, end)
        if m is None:
            return None
        return b"d" + m.group(1), _DOCKER_PARTIAL.match(data, start, end) is not None
    if head.isdigit():
        m = _CRI_STREAM.match(data, start, end)
        if m is None:
            return None
        return b"c" + m.group(1), _CRI_PARTIAL.match(data, start, end) is not None
    return None


def python_partials(data: bytes, lo: int, hi: int) -> list[int]:
    """Line starts of the partial entries in ``data[lo:hi]`` (whole lines), without the compiled
    scanner: each format's expression runs only where its entries can be at all."""
    found: list[int] = []
    if data.find(b'{"log":"', lo, hi) != -1:
        found.extend(m.start() for m in _DOCKER_PARTIAL.finditer(data, lo, hi))
    if data.find(b"stdout P", lo, hi) != -1 or data.find(b"stderr P", lo, hi) != -1:
        found.extend(m.start() for m in _CRI_PARTIAL.finditer(data, lo, hi))
    return sorted(found)


def continuations(
    data: bytes, lo: int, hi: int, partials: Collection[int], pending: Open = CLOSED
) -> tuple[list[int], Open]:
    """The line starts in ``data[lo:hi]`` that continue an entry the runtime cut, and the streams
    still open at ``hi``.

    ``partials``: the line starts of the partial entries in ``data[lo:hi]``, ascending (from the
    scanner's pass). ``pending``: the streams open at ``lo``. Lines are looked at only from a
    partial entry (or ``lo`` while a stream is open) to the final piece of each open stream, so a
    log without partial entries costs nothing here.
    """
    find = data.find

    def line_at(pos: int) -> tuple[tuple[bytes, bool] | None, int]:
        end = find(b"\n", pos, hi)
        end = hi if end == -1 else end
        return entry(data, pos, end), end + 1

    return _walk(lo, hi, partials, pending, line_at)


def continued_lines(lines: list[str], partials: Collection[int], pending: Open = CLOSED) -> tuple[list[int], Open]:
    """``continuations`` for decoded lines (the sidecar's batches): indices instead of offsets."""

    def line_at(i: int) -> tuple[tuple[bytes, bool] | None, int]:
        raw = lines[i].encode("utf-8", "replace")
        return entry(raw, 0, len(raw)), i + 1

    return _walk(0, len(lines), partials, pending, line_at)


def partial_lines(lines: list[str]) -> list[int]:
    """The indices of the partial entries among decoded lines, without the compiled scanner."""
    found: list[int] = []
    for i, line in enumerate(lines):
        if line.startswith('{"log":"') or "stdout P" in line[:64] or "stderr P" in line[:64]:
            raw = line.encode("utf-8", "replace")
            e = entry(raw, 0, len(raw))
            if e is not None and e[1]:
                found.append(i)
    return found


def _walk(
    lo: int,
    hi: int,
    partials: Collection[int],
    pending: Open,
    line_at: Callable[[int], tuple[tuple[bytes, bool] | None, int]],
) -> tuple[list[int], Open]:
    """The positions in [lo, hi) that continue a cut entry: from each partial entry (and from
    ``lo`` for the streams ``pending``), every entry of an open stream up to its final piece."""
    found: list[int] = []
    opened = set(pending)
    todo = iter(sorted(p for p in partials if lo <= p < hi))
    pos = lo
    while True:
        if not opened:
            nxt = next(todo, None)
            while nxt is not None and nxt < pos:  # a partial already walked over as a piece
                nxt = next(todo, None)
            if nxt is None:
                break
            pos = nxt
        if pos >= hi:
            break
        e, nxt_pos = line_at(pos)
        if e is not None:
            stream, partial = e
            if stream in opened:
                found.append(pos)
            if partial:
                opened.add(stream)
            else:
                opened.discard(stream)
        pos = nxt_pos
    return found, frozenset(opened)


def line_start_after(data: bytes, pos: int, lo: int) -> int:
    """The first line start at or after ``pos`` in ``data`` (``lo`` if ``pos`` is at or before it)."""
    if pos <= lo:
        return lo
    nl = data.find(b"\n", pos - 1)
    return len(data) if nl == -1 else nl + 1
