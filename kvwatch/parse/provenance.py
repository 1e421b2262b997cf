"""Whose words a piece of a log line is: vLLM's own logger, or a client's text that vLLM echoed.

vLLM writes client-controlled text into the log kvwatch reads (``logpatterns.ECHO_FORMS``): a
prompt, a model's output, a request id from the client's X-Request-Id header, a path. Such text
can spell any record kvwatch reads, vLLM header included. kvwatch.parse.log asks three questions
here before it takes a record from a piece of a line:

* ``echo_cut``: where request-borne text begins on a physical line (nothing from there on is read,
  not even a vLLM header: a request id is written unquoted and may hold one);
* ``quoted_spans`` / ``inside``: whether a position lies inside a quoted string (a Python repr or a
  JSON string, the way vLLM writes client strings in every echo it has; text there never counts);
* ``logger_allows``: whether the module named by a vLLM header writes that kind of record
  (``logpatterns.KIND_LOGGERS``), so a kind's words under another logger are no record.

``valid_label_value`` is the one check a value read from log text passes before it may become a
Prometheus label value (model names).

All pure functions of text.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kvwatch.parse import logpatterns as P

__all__ = ["echo_cut", "header_logger", "inside", "logger_allows", "quoted_spans", "valid_label_value"]

_ANCHORED = tuple((f.marker, f.start) for f in P.ECHO_FORMS if f.start is not None)
_UNANCHORED = tuple(f.marker for f in P.ECHO_FORMS if f.start is None)
# Words one of which every marker above (and the access anchor) holds, so that a line with none of
# them, most lines, is passed in a few ``in`` tests instead of one find per marker (~0.6 against
# ~3.5 us a line): the short words cover today's markers, and any marker they miss is its own word.
_SHORT_WORDS = ("equest", "rompt", "Params(")
_ECHO_WORDS = _SHORT_WORDS + tuple(
    m for m in (*(a for a, _ in _ANCHORED), *_UNANCHORED, P.ACCESS_ANCHOR) if not any(w in m for w in _SHORT_WORDS)
)


def echo_cut(text: str) -> int:
    """Where request-borne text begins on the (cleaned) physical line ``text``; ``len(text)`` if none.

    A known echo (``start`` given) begins at its format's first word: its marker, or the earliest
    ``start`` literal before the marker ("Request " before "JSON body:", the request id between
    them being the client's). An echo whose start is unknown (a "prompt:" field of some other
    message) makes the whole line request-borne, unless a known echo began before it. An access
    line begins at uvicorn's level prefix before the request line (the address before the request
    line may be the client's X-Forwarded-For), or at the start of the line.
    """
    cut = len(text)
    for word in _ECHO_WORDS:
        if word in text:
            break
    else:
        return cut  # no marker can be in it
    known = cut  # the earliest known echo start
    for marker, start in _ANCHORED:
        pos = text.find(marker)
        if pos == -1:
            continue
        if start:
            first = text.find(start, 0, pos)
            if first != -1:
                pos = first
        known = min(known, pos)
    cut = known
    for marker in _UNANCHORED:
        pos = text.find(marker)
        if pos != -1:
            cut = min(cut, known if known <= pos else 0)
    if P.ACCESS_ANCHOR in text:
        m = P.ACCESS_REQUEST.search(text)
        if m is not None:
            # the last level prefix before the request line begins the access record
            levels = [lv.start() for lv in P.ACCESS_LEVEL.finditer(text, 0, m.start())]
            cut = min(cut, levels[-1] if levels else 0)
    return cut


def quoted_spans(text: str, end: int | None = None) -> list[tuple[int, int]]:
    """The quoted strings of ``text[:end]`` as ``(open, close)`` positions (``close`` excluded).

    A string opens at ``'`` or ``"`` that no letter or digit precedes (so "model's" opens none) and
    closes at the next unescaped same quote, as in Python's repr and JSON, the two ways vLLM writes
    client strings (``%r`` in RequestLogger, ``model_dump_json``); one left open runs to the end.
    """
    if end is None:
        end = len(text)
    spans: list[tuple[int, int]] = []
    i = 0
    while True:
        a = text.find("'", i, end)
        b = text.find('"', i, end)
        if a == -1 and b == -1:
            return spans
        pos = b if a == -1 or (b != -1 and b < a) else a
        if pos > 0 and text[pos - 1].isalnum():
            i = pos + 1  # an apostrophe inside a word, or a closing quote of text we do not track
            continue
        quote = text[pos]
        j = pos + 1
        while j < end:
            c = text[j]
            if c == "\\":
                j += 2
                continue
            if c == quote:
                break
            j += 1
        close = min(j, end)
        spans.append((pos, close))
        i = close + 1
        if i >= end:
            return spans


def inside(spans: list[tuple[int, int]], pos: int) -> bool:
    """Whether ``pos`` lies inside one of ``spans`` (from ``quoted_spans``)."""
    return any(a < pos < b for a, b in spans)


_HEADER_FILE = re.compile(r"([^\s\[\]/]+):\d+\[?\] ?$")


@lru_cache(maxsize=4096)
def header_logger(header: str) -> str | None:
    """The module basename a vLLM header names ("[v1/metrics/loggers.py:335] " -> "loggers.py").

    ``header`` may be the whole header or only its "[file:line] " part (the same answer: the stamp
    before it holds no "name:digits]"); kept per text, as the reader passes the part, of which a
    log has one per logging call site, while the search costs ~4 us (it is tried at every offset).
    """
    m = _HEADER_FILE.search(header)
    return m.group(1) if m else None


@lru_cache(maxsize=4096)
def logger_allows(kind: str, logger: str | None) -> bool:
    """Whether a record of ``kind`` (a LINE_KINDS row name, "stats", "prefix_hit_v0", "preemption")
    may come from a piece of line whose vLLM header names module ``logger`` (None: no header).

    Without a header there is no logger to check (pasted logs, continuation lines of a multi-line
    message, tracebacks); echoes and quotes are the only test there. A "paste" kind (a shell
    command line) is read only there.
    """
    family = P.KIND_LOGGERS.get(kind)
    if logger is None:
        return True
    if family is None:  # an error: written by whichever module caught it
        return P.ECHO_LOGGERS.fullmatch(logger) is None
    if family == "paste":
        return False
    return P.LOGGER_FAMILIES[family].fullmatch(logger) is not None


# A model name as vLLM takes it (a Hugging Face repo id "org/name", a local path, an alias given to
# --served-model-name): letters, digits and . _ - / : @ + = ~ \\ (a Windows path), at most 256
# characters (Hugging Face caps a repo id at 96; a path is longer). Anything else (spaces, quotes,
# braces, control characters) is no name vLLM was started with but a piece of some other text, and
# is not made a label value.
_LABEL_VALUE = re.compile(r"[A-Za-z0-9._\-/:@+=~\\]{1,256}")


def valid_label_value(value: object) -> bool:
    """Whether ``value``, read from log text, may become a Prometheus label value."""
    return isinstance(value, str) and _LABEL_VALUE.fullmatch(value) is not None
