"""The sidecar's followed lines: the scanner marks the lines that can say something, the parser
passes the rest by, and the records are exactly those of every line parsed one by one.

``kvwatch watch`` at thousands of lines/s spent its CPU parsing access and request lines that hold
no line kind of the pattern table. ``anchored_lines`` (one compiled pass per batch, or one ``in``
per anchor without hyperscan) and ``LogParser.feed_lines`` skip them, except where a line matters
for what came before or after it: the rest of a hard-wrapped record, the line that judges a held
EngineDeadError, or a line a terminal cut inside "Avg prompt throughput:". These tests hold the
records to the line-by-line parser's over every real log in every transport form.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvwatch.parse.log import LogParser
from kvwatch.parse.logpatterns import PREFILTER_ANCHORS, STATS_START
from kvwatch.records import LogRecord
from kvwatch.sources import scanner
from tests.transport_forms import FORMS, shipped

FIXTURES = Path(__file__).parent / "fixtures"
REAL_LOGS = sorted(p for d in ("real", "real-extra") for p in (FIXTURES / d / "logs").glob("*") if p.is_file())
SEED_LOG = FIXTURES / "vllm-cpu-seed" / "server.log"


@pytest.fixture(params=["compiled", "python"])
def which_scanner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each scanner in turn (the compiled one is skipped where hyperscan does not import)."""
    if request.param == "compiled" and scanner._compiled() is None:
        pytest.skip("hyperscan does not import here: the python scanner is the only one")
    if request.param == "python":
        monkeypatch.setenv(scanner.ENV_VAR, "python")
    return str(request.param)


def _lines(data: bytes) -> list[str]:
    """What a follower hands the sidecar: lines split at LF, CR dropped, invalid UTF-8 replaced."""
    text = data.decode("utf-8", "replace")
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def _line_by_line(lines: list[str]) -> list[LogRecord]:
    parser = LogParser()
    out = [r for line in lines for r in parser.feed_line(line)]
    return out + parser.finish()


def _prefiltered(lines: list[str], batch: int) -> list[LogRecord]:
    parser = LogParser()
    out: list[LogRecord] = []
    for i in range(0, len(lines), batch):
        part = lines[i : i + batch]
        out += parser.feed_lines(part, scanner.anchored_lines(part))
    return out + parser.finish()


def test_the_real_logs_are_there() -> None:
    assert len(REAL_LOGS) >= 100


@pytest.mark.parametrize("path", [*REAL_LOGS, SEED_LOG], ids=[*(p.name for p in REAL_LOGS), "vllm-cpu-seed"])
def test_a_real_log_followed_gives_the_records_of_every_line(path: Path, which_scanner: str) -> None:
    lines = _lines(path.read_bytes())
    # Batches of 7 lines cut startup blocks, wrapped records and tracebacks at every place.
    assert _prefiltered(lines, 7) == _line_by_line(lines)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_transport_form_of_the_real_logs_followed_gives_the_records_of_every_line(
    form: str, which_scanner: str, tmp_path: Path
) -> None:
    for path in REAL_LOGS:
        lines = _lines(shipped(path, form, tmp_path / path.name).read_bytes())
        assert _prefiltered(lines, 64) == _line_by_line(lines), (form, path.name)


def test_the_line_a_terminal_cut_inside_the_record_start_is_read_though_it_holds_no_anchor(which_scanner: str) -> None:
    record = (
        "INFO 11-29 08:00:10 [loggers.py:336] Engine 000: Avg prompt throughput: 12.5 tokens/s, Avg generation "
        "throughput: 40.0 tokens/s, Running: 7 reqs, Waiting: 3 reqs, GPU KV cache usage: 93.1%, Prefix cache hit "
        "rate: 10.0%"
    )
    cut = record.index(STATS_START) + len("Avg pr")  # "...Engine 000: Avg pr" | "ompt throughput: ..."
    lines = ['INFO:     10.0.0.1:4242 - "POST /v1/completions HTTP/1.1" 200 OK', record[:cut], record[cut:]]
    assert scanner.anchored_lines(lines)[:2] == [False, False]  # the cut line holds no anchor ...
    records = _prefiltered(lines, 10)
    assert records == _line_by_line(lines)
    assert [(r.line, r.running, r.waiting, r.kv_usage_pct) for r in records] == [(2, 7, 3, 93.1)]  # ... and is read


@pytest.mark.parametrize(
    "lines",
    [
        [],
        [""],
        ["", "x cache y", ""],
        ["no anchor here", "ünïcödé cache", "tail\twith throughput"],
        ["a" * 5000 + "Shutting"],
        ["two\nlines", "then cache", "none"],  # a caller's line holding a newline shifts nothing
    ],
    ids=["none", "one-empty", "empty-around", "non-ascii", "long-line", "embedded-newline"],
)
def test_both_scanners_mark_the_same_lines(lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    expected = [any(a.decode() in line for a in PREFILTER_ANCHORS) for line in lines]
    assert scanner.anchored_lines(lines) == expected
    monkeypatch.setenv(scanner.ENV_VAR, "python")
    assert scanner.anchored_lines(lines) == expected


def test_without_hyperscan_the_batch_is_marked_by_the_python_scanner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hyperscan", None)
    scanner._compiled.cache_clear()
    try:
        assert scanner.name() == "python"
        assert scanner.anchored_lines(["GPU KV cache usage", "200 OK"]) == [True, False]
    finally:
        monkeypatch.undo()
        scanner._compiled.cache_clear()


@pytest.fixture
def compiled_elsewhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The scanner as the sidecar loads it on a first start: compiled by a short-lived interpreter
    (no database kept from an earlier run: the cache is empty)."""
    if scanner._compiled() is None:
        pytest.skip("hyperscan does not import here")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(scanner, "_compile_elsewhere", False)
    scanner.compile_out_of_process()
    yield
    monkeypatch.undo()
    scanner._compiled.cache_clear()


def test_the_database_compiled_elsewhere_marks_the_lines_compiled_here_mark(
    compiled_elsewhere: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[bytes] = []
    real = scanner._compiled_elsewhere

    def spy(*args: object) -> bytes:
        compiled.append(serialized := real(*args))  # type: ignore[arg-type]
        return serialized

    monkeypatch.setattr(scanner, "_compiled_elsewhere", spy)
    scanner._compiled.cache_clear()
    engine = scanner._compiled()
    assert engine is not None
    assert len(compiled) == 1
    import hyperscan

    assert hyperscan.dumpb(engine.db) == compiled[0]
    for path in [*REAL_LOGS, SEED_LOG]:
        lines = _lines(path.read_bytes())
        assert scanner.anchored_lines(lines) == [any(a.decode() in line for a in PREFILTER_ANCHORS) for line in lines]


def test_without_an_interpreter_to_compile_in_the_scanner_compiles_here(
    compiled_elsewhere: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    scanner._compiled.cache_clear()
    assert scanner.name().startswith("hyperscan ")
    assert scanner.anchored_lines(["GPU KV cache usage: 1.0%", "200 OK"]) == [True, False]
