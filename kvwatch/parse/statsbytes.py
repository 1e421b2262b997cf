"""The common V1 stats line read straight from the bytes of a buffer: one compiled match, no decoding.

A large log is mostly lines of one layout, vLLM's V1 stats logger behind at most a process prefix
(vllm/v1/metrics/loggers.py ``LoggingStatLogger.log``, read in 0.32.0: "Avg prompt throughput:
%.1f tokens/s, ..., Running: %d reqs, Waiting: %d reqs[, Deferred][, Preemptions], %s KV cache
usage: %.1f%%[, Prefix cache hit rate: %.1f%%]" behind "Engine %03d: "; its optional KV fetch,
Corrupted, External and MM parts are outside this layout and go to the general reader), under
vLLM's header (vllm/logger.py ``_FORMAT``, "LEVEL MM-DD HH:MM:SS [file.py:N] ") and the
"(%(vllm_process_name)s pid=%(process)d) " of the same format (0.8.3+; coloured on a terminal).
``plain_stats_row`` reads such a line from ``data[start:end]`` with one ``fullmatch`` of a
bytes pattern and converts its fields from bytes, where the general reader decodes the line and
runs several searches on it. It gives exactly the row ``log._plain_stats_row`` gives for the decoded
line, or None for any line outside the layout (then the general reader reads it;
tests/test_stats_bytes.py compares the two on every real fixture line and on generated ones).

Why the results are the same: the pattern is ``logpatterns.PLAIN_STATS_LINE`` with a restricted
start (nothing but ANSI colour codes and one ``(NAME pid=N) `` prefix before the header, so no
header, quote or echo marker can come before it; the one literal marker a process name could spell
is checked) and its "any non-space" classes narrowed to printable ASCII. A line it matches is
therefore printable ASCII apart from the colour codes, which UTF-8 decodes to the same characters,
and on which the str pattern, searched, matches at the same place with the same groups.
"""

from __future__ import annotations

import re
from typing import Any

from kvwatch.parse import logpatterns as P
from kvwatch.parse.provenance import logger_allows

# Printable ASCII without space, "[" and "]" (and "/"): the narrowed ``[^\s\[\]]`` / ``[^\s\[\]/]``.
_NOT_SPACE_OR_BRACKET = r"[!-Z\\^-~]"
_NOT_SPACE_BRACKET_OR_SLASH = r"[!-.0-Z\\^-~]"
_ANSI = r"(?:\x1b\[[0-9;]*m)?"
# "(APIServer pid=2871) " (0.8.3+; coloured "\x1b[1;36m(APIServer pid=2871)\x1b[0;0m " on a terminal).
_PREFIX = _ANSI + r"(?:(\([A-Za-z0-9_]+ pid=\d+\)" + _ANSI + r" ))?"
# docker --timestamps / kubectl logs --timestamps put an RFC3339 stamp first (logpatterns.RFC3339,
# whose time the general reader takes over the header's: log._outer_time). Its 7 groups come first.
_STAMP = P.RFC3339.pattern.removeprefix("^")
_STAMP_GROUPS = 7


def _pattern() -> re.Pattern[bytes]:
    body = P.PLAIN_STATS_LINE.pattern
    assert body.endswith(r"\.?\n?$")
    body = body[: -len(r"\.?\n?$")]
    narrowed = body.replace(r"[^\s\[\]/]", _NOT_SPACE_BRACKET_OR_SLASH).replace(r"[^\s\[\]]", _NOT_SPACE_OR_BRACKET)
    # The str reader strips the line's "\r\n"/"\n" ending (``rstrip``), then allows a final ".".
    return re.compile(("(?:" + _STAMP + ")?" + _PREFIX + "(" + narrowed + r")\.?\r*").encode("ascii"))


_LINE = _pattern()
# The literal request markers a process name could spell (``log._PREFIX_SUSPECT`` holds them all).
_NAME_MARKERS = tuple(m.encode() for m in P.REQUEST_MARKERS if re.fullmatch(r"[A-Za-z0-9_]+", m))
_STATS_LOGGER: dict[bytes, bool] = {}
# Process prefix -> whether it spells none of _NAME_MARKERS. A log holds a few processes, each
# prefix on every one of its stats lines (a generator over the markers cost ~0.8 us a line); a
# log of endless pids only refills it.
_PREFIX_CLEAN: dict[bytes, bool] = {}
_PREFIX_CLEAN_MAX = 4096


def plain_stats_row(data: bytes, start: int, end: int) -> tuple[Any, ...] | None:
    """The ``log.StatsRow`` of the line ``data[start:end]`` (no newline) if it has the common layout."""
    m = _LINE.fullmatch(data, start, end)
    if m is None:
        return None
    groups = m.groups()
    stamp, g = groups[:_STAMP_GROUPS], groups[_STAMP_GROUPS:]
    prefix = g[0]
    if prefix is not None:
        clean = _PREFIX_CLEAN.get(prefix)
        if clean is None:
            if len(_PREFIX_CLEAN) >= _PREFIX_CLEAN_MAX:
                _PREFIX_CLEAN.clear()
            clean = _PREFIX_CLEAN[prefix] = not any(marker in prefix for marker in _NAME_MARKERS)
        if not clean:
            return None
    ok = _STATS_LOGGER.get(g[7])
    if ok is None:
        ok = _STATS_LOGGER[g[7]] = logger_allows("stats", g[7].decode("ascii"))
    if not ok:
        return None
    w = g[17]
    device = "gpu" if w == b"GPU" else _device(w)
    ts: tuple[Any, ...]
    if stamp[0] is not None:  # the RFC3339 stamp's time, with its year and zone (log._outer_time)
        y, mo, d, h, mi, sec, tz = stamp
        ts = (int(mo), int(d), int(h), int(mi), float(sec), int(y), tz.decode("ascii") if tz is not None else None)
    else:
        ts = (int(g[2]), int(g[3]), int(g[4]), int(g[5]), float(g[6].replace(b",", b".")), None, None)
    return (
        ts,
        int(g[8]) if g[8] is not None else None,  # engine
        int(g[9]) if g[9] is not None else None,  # engines aggregated
        int(g[12]),  # running
        int(g[14]),  # waiting
        int(g[13]) if g[13] is not None else None,  # swapped
        int(g[15]) if g[15] is not None else None,  # deferred
        int(g[16]) if g[16] is not None else None,  # preemptions
        float(g[18]),  # kv_usage_pct
        # V0's second figure is the CPU swap space, only next to a GPU one (log._fast_stats_values).
        float(g[19]) if g[19] is not None and device == "gpu" else None,  # cpu_kv_usage_pct
        float(g[20]) if g[20] is not None else None,  # prefix_hit_pct
        None,  # external_prefix_hit_pct
        None,  # mm_cache_hit_pct
        float(g[10]),  # prompt_tps
        float(g[11]),  # gen_tps
        device,
        None,  # source
        g[1].startswith(b"DEBUG"),  # debug_level: the header starts at its level word
    )


def _device(word: bytes) -> str:
    # log._device on the three-letter word the layout allows ("GPU", "CPU", "XPU", ...)
    w = word.decode("ascii").lower()
    return "gpu" if w in ("gpu", "cuda", "rocm") else w
