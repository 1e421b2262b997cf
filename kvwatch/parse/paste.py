"""Undoing what pasting does to a /metrics exposition (pure: text in, text out).

Users paste scrapes into GitHub issues, chats and wikis, and the paste changes the text: Markdown
block quotes and list markers, fences, tables copied from Prometheus' web UI, "smart" quotes and
dashes, HTML/JSON escaping, long lines (``vllm:cache_config_info`` is 1-2 KB) hard-wrapped, label
sets shortened with "...". ``repair_exposition`` returns every line with what could be restored
and why, so the reader (``kvwatch.parse.metrics``) parses the repaired text and counts what it
could not restore. Typography shared with the log reader is undone by the same table
(``TYPOGRAPHY``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvwatch.parse.metricnames import split_prefix
from kvwatch.parse.textformat import read_families, refuses

_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_BLOCKQUOTE = re.compile(r"^(?:>\s?)+")  # GitHub/Markdown quote markers, possibly nested
# "# HELP"/"# TYPE" rendered as a Markdown heading and copied back loses its "#" (or gains more):
_BARE_META = re.compile(rf"^#*\s*(HELP|TYPE)\s+({_METRIC_NAME})(\s.*)?$")
_TYPE_WORDS = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "info", "stateset", "gaugehistogram", "unknown"}
)
_FENCE = re.compile(r"^(```|~~~)")
# A Prometheus query result copied from its web UI's table into Markdown: 'series | value' rows,
# optionally '| series | value |', and a '-- | --' separator row (vLLM PR 24049, 0.10.2, eight
# data-parallel engines). The series part must end the label set (or be a bare name) right
# before the bar, so a '|' inside a label value never matches.
_TABLE_ROW = re.compile(rf"^\|?\s*({_METRIC_NAME}(?:\{{.*\}})?)\s*\|\s*([-+]?[0-9.eE+-]+|NaN|[-+]?Inf)\s*\|?$")
_TABLE_RULE = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?$")
# A Markdown list item ('- vllm:num_requests_running{...} 3', '* # HELP ...'): no exposition
# line starts with a list marker, so it is dropped when a metric name or '#' follows it.
_LIST_MARKER = re.compile(rf"^[-*+]\s+(?=#|{_METRIC_NAME}(?:\{{|\s))")
_NAME_START = re.compile(rf"^({_METRIC_NAME})")
MAX_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class RepairedLine:
    """One line after repair: its 1-based number in the input, and the text to parse (or a skip)."""

    number: int
    text: str
    skip_reason: str | None = None


def repair_exposition(text: str) -> list[RepairedLine]:
    """Undo damage that pasting does, where the intent is unambiguous.

    - ``> `` blockquote markers (nested too) are removed: no exposition line starts with ``>``.
    - ``HELP name ...`` / ``TYPE name kind`` without ``#`` (a Markdown heading copied back), or
      with ``##``, become comments again: a sample line can never read ``HELP name text``.
    - Code fences and inline-code backticks around a whole line are removed.
    - Markdown table rows ``series | value`` (a Prometheus UI table copied into an issue) become
      ``series value``; the table's ``-- | --`` rule is dropped.
    - A Markdown list marker (``- ``, ``* ``, ``+ ``) before a sample or comment is dropped.
    - CR/CRLF endings and surrounding whitespace are dropped.

    Everything else is left for the parser; nothing is guessed. (Later, only for lines the parser
    rejects: lines a terminal hard-wrapped are glued back and curly quotes / non-breaking spaces
    from a rich-text copy straightened, each only where the result then reads.)
    """
    out: list[RepairedLine] = []
    for number, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), start=1):
        line = raw.strip().lstrip("\ufeff")
        line = _BLOCKQUOTE.sub("", line).strip()
        if _FENCE.match(line) or _TABLE_RULE.match(line):
            continue
        if len(line) > 1 and line.startswith("`") and line.endswith("`"):
            line = _BLOCKQUOTE.sub("", line.strip("`").strip()).strip()
        line = _LIST_MARKER.sub("", line)
        row = _TABLE_ROW.match(line)
        if row:
            line = f"{row.group(1)} {row.group(2)}"
        meta = _BARE_META.match(line)
        # a bare "HELP word ..." is prose unless the word looks like a metric name (has _ or :)
        if meta and not line.startswith("# ") and re.search(r"[_:]", meta.group(2)):
            keyword, name, rest = meta.group(1), meta.group(2), (meta.group(3) or "").strip()
            if keyword == "TYPE" and rest not in _TYPE_WORDS:
                out.append(RepairedLine(number, "", "TYPE line without a known metric type"))
                continue
            line = f"# {keyword} {name} {rest}".rstrip()
        out.append(RepairedLine(number, line))
    return out


# Spaces a rendered web page (forum, chat, wiki) puts where the text had plain ones; the log
# reader undoes the same (kvwatch.parse.log.clean), with this table.
WEB_SPACES: dict[int, str | None] = {0x00A0: " ", 0x2009: " ", 0x202F: " "}
_TYPOGRAPHY = str.maketrans(
    {
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u2033": '"',
        **{chr(k): v for k, v in WEB_SPACES.items()},
        "\u200b": None,
        "\u2060": None,
    }
)
_SAMPLE_START = re.compile(rf"^{_METRIC_NAME}(\{{|\s|$)")
_SAMPLE_NAME = re.compile(rf"^({_METRIC_NAME})(?:\{{|\s)")
# Label sets a user shortened with "..." (or "…") in place of labels: '{...,reason="capacity"}',
# '{block_size="16", ...}' (vllm-metal issue 479, vLLM issue 42966). Not exposition syntax, but
# what the remaining labels state is unambiguous.
_ELIDED_SAMPLE = re.compile(rf"^({_METRIC_NAME})\{{(.*)\}}(\s+\S+.*)?$")
_ELISION = re.compile(r"(?:^|,)\s*(?:\.\.\.|\u2026)\s*(?=,|$)")
# ... or cut short with a trailing "..." where the line grew too long to show whole, which for
# the 1-2 KB cache_config_info is common: 'vllm:cache_config_info{block_size="16",...'.
_ELIDED_TAIL = re.compile(rf"^({_METRIC_NAME}_info)\{{(.*?)\s*,?\s*(?:\.\.\.|\u2026)\s*\}}?\s*$")
ELIDED_LABEL = "kvwatch_elided"  # marks a sample whose label set was shortened; see _collect
_MAX_WRAP_PIECES = 40  # a 1,500-character cache_config_info line wrapped at 40 columns


def rejoin_wrapped(lines: list[RepairedLine], start: int) -> tuple[RepairedLine, int] | None:
    """A sample or TYPE line hard-wrapped by a terminal, glued back: (line, pieces used) or None.

    Long lines (``vllm:cache_config_info`` is 1-2 KB) arrive cut into pieces with newlines where
    the terminal wrapped them. The pieces are joined only when the first piece is an unreadable
    sample start, no later piece is a readable line or comment of its own, and the joined text
    reads as one sample; otherwise nothing is guessed and the pieces are skipped.
    """
    first = lines[start].text
    if not (_SAMPLE_START.match(first) or first.startswith("# TYPE ")):
        return None
    text = first
    for j in range(start + 1, min(start + _MAX_WRAP_PIECES, len(lines))):
        piece = lines[j].text
        if not piece:
            # a blank line inside a cut sample: users split a long cache_config_info around the
            # label they report (vLLM issue 16560, 0.8.x, 'num_gpu_blocks="None"' set apart by
            # blank lines), and Markdown renderers add blank lines between wrapped pieces. It
            # joins nothing; the joined text must still read as one sample.
            continue
        if piece.startswith("#") or line_problem(piece) is None or _starts_vllm_sample(piece):
            return None
        text += piece
        readable = _readable_form(text)
        if readable is not None:
            return RepairedLine(lines[start].number, readable), j - start + 1
    return None


def _plain_forms(line: str) -> list[str]:
    """``line`` with paste typography undone, then also JSON (``\\"``) or HTML (``&quot;``)
    escaping, each a candidate only when it differs from the line."""
    straight = line.translate(_TYPOGRAPHY)
    import html  # local: only a line that does not read gets here (html.entities: ~1.4 ms of snapshot's start-up)

    forms = [straight, straight.replace('\\"', '"'), html.unescape(straight)]
    return [f for i, f in enumerate(forms) if f != line and f not in forms[:i]]


def _starts_vllm_sample(piece: str) -> bool:
    """Whether a piece begins a sample of its own (a vLLM name, then labels or a value)."""
    match = _SAMPLE_NAME.match(piece)
    return match is not None and split_prefix(match.group(1)) is not None


def _readable_form(text: str) -> str | None:
    """``text`` as it reads: itself, or as a table row or elided label set would; else None.

    The name must be a whole metric name: prometheus_client's parser also takes names with dots
    in them, which a stray piece glued in front ('ime_to...vllm:...') would otherwise make.
    """
    if not _SAMPLE_NAME.match(text) and not text.startswith("# TYPE "):
        return None
    if line_problem(text) is None:
        return text
    return repaired_line(text)


def repaired_line(line: str) -> str | None:
    """``line`` as it reads once what a paste did to it alone is undone, else None.

    In order: curly quotes and no-break spaces of a rich-text copy, or JSON (``\\"``) or HTML
    (``&quot;``) escaping; then, on the line or those forms, a Markdown table row or a label set
    elided with ``...``. Each is used only when the result then reads.
    """
    for plain in _plain_forms(line):
        if line_problem(plain) is None:
            return plain
    for form in (line, *_plain_forms(line)):
        row = _TABLE_ROW.match(form)
        if row and line_problem(f"{row.group(1)} {row.group(2)}") is None:
            return f"{row.group(1)} {row.group(2)}"
        unelided = _unelide(form)
        if unelided is not None and line_problem(unelided) is None:
            return unelided
    return None


def _unelide(line: str) -> str | None:
    """A sample line with its ``...`` label placeholders removed and :data:`ELIDED_LABEL` added.

    None when the line has no placeholder. Only lines the parser rejects get here, and the result
    is used only when it then reads. Which engine the sample belonged to is settled in
    :func:`_collect`, from the other samples.
    """
    match = _ELIDED_SAMPLE.match(line)
    if match is None:
        tail = _ELIDED_TAIL.match(line)
        if tail is None:
            return None
        name, labels = tail.groups()
        labels = labels.strip().rstrip(",")
        kept = f'{labels},{ELIDED_LABEL}="1"' if labels else f'{ELIDED_LABEL}="1"'
        return f"{name}{{{kept}}} 1"
    name, labels, rest = match.groups()
    kept = _ELISION.sub("", labels).strip().lstrip(",").strip()
    if kept == labels.strip():
        return None
    if rest is None:
        if not name.endswith("_info"):
            return None
        rest = " 1"  # an *_info series is 1 by definition; the shortened paste dropped it
    kept = f'{kept},{ELIDED_LABEL}="1"' if kept else f'{ELIDED_LABEL}="1"'
    return f"{name}{{{kept}}}{rest}"


def line_problem(line: str) -> str | None:
    """Why one line cannot be read on its own, or None when it can."""
    if read_families(line) is not None:
        return None  # the plain form, read as prometheus_client reads it (kvwatch.parse.textformat)
    if not refuses(line):
        # local: the log reader imports this module for WEB_SPACES, and prometheus_client's package
        # import (its HTTP exposition, http.server, ssl) is a fifth of `kvwatch analyze`'s start-up
        from prometheus_client.parser import text_string_to_metric_families

        try:
            list(text_string_to_metric_families(line + "\n"))
        except Exception:  # see _read_samples
            pass
        else:
            return None
    name = _NAME_START.match(line)
    if line.startswith("#"):
        return "malformed HELP/TYPE line"
    if name and split_prefix(name.group(1)) is not None:
        return f"unreadable sample of {name.group(1)} (damaged labels or value)"
    return "not an exposition line"
