"""The Prometheus text format as servers write it, read without prometheus_client (pure).

vLLM's ``/metrics`` is written by prometheus_client's own exposition: ``# HELP``/``# TYPE`` lines,
then samples ``name{label="value",...} value``. kvwatch reads expositions with
``prometheus_client.parser.text_string_to_metric_families`` (0.2x), whose rules decide what a damaged
paste yields (kvwatch.parse.metrics). Importing it runs prometheus_client's package ``__init__``
(its HTTP exposition: http.server, ssl, wsgiref), about a third of ``kvwatch snapshot FILE``'s
start-up (benchmarks/startup_speed.py), and it reads character by character.

:func:`read_families` reads a text only when every line is of the strict form below, and then
gives exactly what that parser gives (tests/test_textformat.py compares the two on every real
exposition in tests/fixtures and on each line changed one way or another); for any other text it
returns None and the caller asks prometheus_client. The strict form:

- blank lines, and comments (``# word ...``, the word not HELP or TYPE);
- ``# HELP name`` or ``# HELP name text``; ``# TYPE name kind`` with kind counter, gauge,
  histogram, summary or untyped (single spaces);
- ``name value`` or ``name{l="v",...} value``: a legacy metric name, label names that are legacy
  and not reserved (``__``), no label twice, values with escapes, one space, a Go-syntax float.

Families follow the parser's rules (``text_fd_to_metric_families``): a HELP or TYPE of a new name
opens a family; a sample whose name the family's type does not allow (``_bucket``/``_sum``/
``_count`` of a histogram, ``_sum``/``_count`` of a summary) is a family of its own; a counter's
family is named without ``_total`` and its samples with it.
"""

from __future__ import annotations

import re

Sample = tuple[str, dict[str, str], float]
"""(sample name, labels, value)."""

Family = tuple[str, list[Sample]]
"""(family name, its samples)."""

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"'
_LABEL_NC = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
_VALUE = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN"
_SAMPLE = re.compile(rf"({_NAME})(?:\{{((?:{_LABEL_NC}(?:,{_LABEL_NC})*)?)\}})? ({_VALUE})")
_LABELS = re.compile(_LABEL)
_HELP = re.compile(rf"# HELP ({_NAME})(?: .*)?", re.DOTALL)
_TYPE = re.compile(rf"# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)")
# A comment: the parser ignores a "#" line whose second word (split on string.whitespace, quotes
# kept together) is not HELP or TYPE; here, a single space, a word without quotes, anything after.
_COMMENT = re.compile(r'#|# ([^ \t\n\r\x0b\x0c"]+)(?:[ \t\n\r\x0b\x0c].*)?', re.DOTALL)
# The escapes the parser undoes in a label value (prometheus_client.parser.ESCAPING_RE); any
# other backslash stays as written.
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# The sample names each type admits into its family (text_fd_to_metric_families' allowed_names).
_SUFFIXES = {"summary": ("_count", "_sum", ""), "histogram": ("_count", "_sum", "_bucket")}


def read_families(text: str) -> list[Family] | None:
    """The families of ``text``, or None when a line is not of the strict form (see module)."""
    families: list[Family] = []
    # the family being read: its name, type, samples and the sample names it admits
    name, kind = "", "untyped"
    samples: list[Sample] = []
    allowed: tuple[str, ...] = ()
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            meta = _HELP.fullmatch(line) or _TYPE.fullmatch(line)
            if meta is None:
                comment = _COMMENT.fullmatch(line)
                if comment is None or comment.group(1) in ("HELP", "TYPE"):
                    return None
                continue
            candidate = meta.group(1)
            if candidate != name:
                if name and not _close(families, name, kind, samples):
                    return None
                name, kind, samples = candidate, "untyped", []
                allowed = (candidate,)
            if line[2] == "T":
                kind = meta.group(2)
                allowed = tuple(name + s for s in _SUFFIXES.get(kind, ("",)))
            continue
        sample = _sample(line)
        if sample is None:
            return None
        if sample[0] in allowed:
            samples.append(sample)
            continue
        if name and not _close(families, name, kind, samples):
            return None
        name, kind, samples, allowed = "", "untyped", [], ()
        families.append((sample[0], [sample]))
    if name and not _close(families, name, kind, samples):
        return None
    return families


# A line the parser refuses whatever follows: no "{" or quote (so no label set and no quoting), a
# first word up to whitespace that is not a legacy metric name (_parse_sample: "invalid metric
# name"). A shell prompt or prose pasted with a scrape ("$ curl http://...") is one.
_WORD_THEN_SPACE = re.compile(r'([^{"# \t\n\r\x0b\x0c][^{" \t\n\r\x0b\x0c]*)[ \t\n\r\x0b\x0c][^{"]*', re.DOTALL)
_LEGACY_NAME = re.compile(_NAME)


def refuses(text: str) -> bool:
    """Whether prometheus_client's parser certainly refuses ``text``: a line as described above."""
    for raw in text.split("\n"):
        line = raw.strip()
        word = _WORD_THEN_SPACE.fullmatch(line)
        if word is not None and _LEGACY_NAME.fullmatch(word.group(1)) is None:
            return True
    return False


def _close(families: list[Family], name: str, kind: str, samples: list[Sample]) -> bool:
    """Append the family as the parser builds it (build_metric); False where it would raise."""
    if kind == "counter":
        if name.endswith("_total"):
            name = name[:-6]
            if not name:
                return False  # "metric name cannot be empty"
        else:
            samples = [(s[0] + "_total", s[1], s[2]) for s in samples]
    families.append((name, samples))
    return True


def _sample(line: str) -> Sample | None:
    match = _SAMPLE.fullmatch(line)
    if match is None:
        return None
    name, label_text, value = match.groups()
    labels: dict[str, str] = {}
    if label_text:
        for label in _LABELS.finditer(label_text):
            key, quoted = label.groups()
            if key in labels or key.startswith("__"):
                return None  # a label twice, or a reserved name: the parser refuses the line
            labels[key] = _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], quoted) if "\\" in quoted else quoted
    return name, labels, float(value)
