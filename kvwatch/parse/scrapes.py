"""Is this text a ``/metrics`` exposition, and when did its process start? (pure)

``kvwatch analyze`` takes logs and saved scrapes in one list, by any name, so each input is
recognised by its content. A scrape is a text whose readable lines (after the same paste repair
:func:`kvwatch.parse.metrics.repair_exposition` applies: blockquotes, Markdown tables, fences)
are mostly vLLM samples and HELP/TYPE comments -- one is enough when nothing else reads as a log,
since issue threads paste a single ``vllm:cache_config_info`` line; a log that merely quotes a few
samples stays a log, since its vLLM log lines outnumber them.
"""

from __future__ import annotations

import re

from kvwatch.parse.metricnames import split_prefix
from kvwatch.parse.paste import repair_exposition

# A sample: a name, then labels (possibly elided with "...", value cut off) or a value.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s+\S)")
_COMMENT = re.compile(r"^#\s*(HELP|TYPE)\s+([a-zA-Z_:][a-zA-Z0-9_:]*)")
# A vLLM log record: level and vLLM's MM-DD stamp, or the glog-style prefix of its workers.
_LOG_LINE = re.compile(r"\b(INFO|WARNING|ERROR|DEBUG|CRITICAL)\b\s+\d\d-\d\d\s|^[IWEF]\d{4}\s\d\d:")
# prometheus_client (0.4+) exposes a <counter/histogram>_created sample holding the Unix time the
# series was created; vLLM creates its series when the engine starts, so every scrape of one
# process carries the same stamps and a restart carries later ones.
_CREATED = re.compile(r"^(?:vllm:|ray_vllm:|ray_vllm_)[a-zA-Z0-9_:]*_created(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$")
_PROCESS_START = re.compile(r"^process_start_time_seconds(?:\{[^}]*\})?\s+([0-9.eE+]+)\s*$")
# Every vLLM series name holds one of these (metricnames.PREFIXES: "vllm:", "ray_vllm:",
# "ray_vllm_"); paste repair can only complete a name through what it removes or undoes inside one
# (zero-width characters, HTML entities), so a text holding none of them, nor those, has no vLLM sample.
_NAME_MARKS = ("vllm:", "vllm_", "\u200b", "\u2060", "&")


def looks_like_exposition(text: str) -> bool:
    """Whether ``text`` reads as a vLLM ``/metrics`` exposition rather than a log."""
    if not any(mark in text for mark in _NAME_MARKS):
        # No vLLM name can come out of the repair: a log's 256 KiB head is not repaired line by
        # line for nothing (29 ms of every analyze of a log, before any line was read).
        return False
    return _reads_as_exposition(text)


def _reads_as_exposition(text: str) -> bool:
    """looks_like_exposition without its quick refusal: every line repaired and counted."""
    vllm_lines = log_lines = 0
    for line in repair_exposition(text):
        if line.skip_reason is not None or not line.text:
            continue
        body = line.text
        if _LOG_LINE.search(body):
            log_lines += 1
            continue
        comment = _COMMENT.match(body)
        name = comment.group(2) if comment else None
        if name is None:
            sample = _SAMPLE.match(body)
            name = sample.group(1) if sample else None
        if name is not None and split_prefix(name) is not None:
            vllm_lines += 1
    return vllm_lines >= 1 and vllm_lines > 2 * log_lines


def creation_stamp(text: str) -> float | None:
    """When the serving process started: the earliest vLLM ``*_created`` stamp, else
    ``process_start_time_seconds``; None when the scrape carries neither."""
    created: float | None = None
    start: float | None = None
    for repaired in repair_exposition(text):  # a pasted scrape (blockquote, table) keeps its stamps
        line = repaired.text
        if repaired.skip_reason is not None or not line or line[0] == "#":
            continue
        m = _CREATED.match(line)
        if m:
            try:
                value = float(m.group(1))
            except ValueError:
                continue
            created = value if created is None else min(created, value)
            continue
        m = _PROCESS_START.match(line)
        if m:
            try:
                start = float(m.group(1))
            except ValueError:
                continue
    return created if created is not None else start
