"""The reading of a repeated message is kept and relabelled (kvwatch.parse.log._scan_segment_once).

A restart prints its start-up messages again word for word under a new stamp; what a line says
must not depend on whether its message was seen before: the same records, each with its own line
number and time, on every real fixture log read cold (the memo emptied before each line) and warm
(every message already in the memo, read at other line numbers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.parse import log as L
from kvwatch.records import ErrorRecord, FactRecord

FIXTURES = Path(__file__).parent / "fixtures"
REAL_LOGS = sorted(p for d in ("real", "real-extra") for p in (FIXTURES / d / "logs").glob("*") if p.is_file())


def _scans(lines: list[str], base: int, cold: bool) -> list[L.LineScan]:
    out = []
    for i, line in enumerate(lines):
        if cold:
            L._segment_memo.clear()
        out.append(L.scan_line(line, base + i + 1))
    return out


def _view(scan: L.LineScan) -> tuple[object, ...]:
    return (scan.records, scan.kinds, scan.process, scan.ts, scan.shutdown, scan.stop_signal, scan.open_stats,
            scan.open_read, scan.widths)  # fmt: skip


def test_real_fixture_logs_exist() -> None:
    assert len(REAL_LOGS) >= 50


@pytest.mark.parametrize("path", REAL_LOGS, ids=lambda p: p.name)
def test_a_warm_memo_reads_every_real_line_as_a_cold_one(path: Path) -> None:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    cold = [_view(s) for s in _scans(lines, 1000, cold=True)]
    _scans(lines, 0, cold=False)  # every message of the log now in the memo, read at lines 1..n
    warm = [_view(s) for s in _scans(lines, 1000, cold=False)]
    assert warm == cold


def test_the_same_message_under_two_stamps_keeps_each_stamp_and_line() -> None:
    L._segment_memo.clear()
    msg = "[kv_cache_utils.py:1087] GPU KV cache size: 448,224 tokens"
    first = L.scan_line(f"INFO 11-29 08:00:00 {msg}", 10).records
    again = L.scan_line(f"INFO 11-29 09:30:15 {msg}", 9000).records
    assert len(L._segment_memo) >= 1
    assert [(r.line, r.ts and r.ts.hour) for r in first] == [(10, 8)] * 2
    assert [(r.line, r.ts and r.ts.hour, r.ts and r.ts.minute) for r in again] == [(9000, 9, 30)] * 2
    facts = [(r.field, r.value) for r in again if isinstance(r, FactRecord)]
    assert facts == [(r.field, r.value) for r in first if isinstance(r, FactRecord)]
    assert ("capacity.kv_cache_tokens", 448224) in facts
    assert all(a is not b for a, b in zip(again, first, strict=True))


def test_an_engine_tag_set_on_one_line_does_not_leak_to_the_next_copy() -> None:
    # _tag_engine sets the data-parallel rank on the facts of an engine's own line in place: the
    # memo must hand out fresh records, not the ones a line before was given.
    L._segment_memo.clear()
    msg = "INFO 11-29 08:00:00 [kv_cache_utils.py:1087] GPU KV cache size: 448,224 tokens"
    tagged = L.scan_line(f"(EngineCore_DP1 pid=7) {msg}", 1).records
    plain = L.scan_line(msg, 2).records
    assert [r.engine for r in tagged if isinstance(r, FactRecord)] == [1, 1]
    assert [r.engine for r in plain if isinstance(r, FactRecord)] == [None, None]


def test_errors_from_the_memo_keep_their_message() -> None:
    L._segment_memo.clear()
    line = (
        "ERROR 05-01 14:39:06 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB."
    )
    first = L.parse_line(line, 1)
    again = L.parse_line(line.replace("14:39:06", "15:00:00"), 2)
    assert [(type(r), r.kind, r.message) for r in first if isinstance(r, ErrorRecord)] == [
        (type(r), r.kind, r.message) for r in again if isinstance(r, ErrorRecord)
    ]
    assert first
    assert [r.line for r in again] == [2] * len(again)


def test_the_memo_stays_bounded() -> None:
    L._segment_memo.clear()
    for i in range(L._SEGMENT_MEMO_MAX * 2 + 5):
        L.scan_line(f"INFO 11-29 08:00:00 [api_server.py:1] message number {i} with no record", i + 1)
    assert 0 < len(L._segment_memo) <= L._SEGMENT_MEMO_MAX


@pytest.mark.parametrize(
    ("message", "shutdown", "stop_signal"),
    [
        ("[launcher.py:80] Shutting down FastAPI HTTP server.", True, False),
        ("[api_server.py:1900] Received SIGTERM, shutting down", True, True),
        ("[api_server.py:1] Route: /v1/models, Methods: GET", False, False),
    ],
)
def test_shutdown_flags_come_back_from_the_memo(message: str, shutdown: bool, stop_signal: bool) -> None:
    L._segment_memo.clear()
    for n, stamp in enumerate(("08:00:00", "09:00:00"), start=1):
        scan = L.scan_line(f"INFO 11-29 {stamp} {message}", n)
        assert (scan.shutdown, scan.stop_signal) == (shutdown, stop_signal), stamp
