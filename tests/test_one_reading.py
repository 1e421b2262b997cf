"""One reading of a log, whatever its size, its storage and however the reader cuts it.

A postmortem must not depend on the file's size: the reader searches every line kind of the
pattern table in every byte, for a 10 KB file, a 10 GB one, a .gz and stdin alike. These tests
hold it to that:

* the document for a file equals the document for the same lines read in pieces (tiny chunks cut
  inside startup blocks and wrapped records, byte ranges in worker processes, stdin, .gz), over
  every real fixture and over generated logs;
* a log made by concatenating every real fixture, with access-log filler between them, read with
  the big-file machinery at work (chunk and worker thresholds lowered so a few MB cross them),
  holds every run start, error and stats record that each fixture gives read alone;
* the compiled scanner and the pure-Python one (``KVWATCH_SCANNER=python``) give the same
  documents.

``../shared/fixtures/real/logs`` is the same set as ``tests/fixtures/real/logs`` (byte for byte
when this was written), so the tests read the repository's copies.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import itertools
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.errors import UsageError
from kvwatch.parse.log import SHUTDOWN_NEAR_LINES, LogParser
from kvwatch.records import ErrorRecord, LogRecord, RunStartRecord, StatsRecord
from kvwatch.sources import files, scanner

FIXTURES = Path(__file__).parent / "fixtures"
REAL_LOGS = sorted(p for d in ("real", "real-extra") for p in (FIXTURES / d / "logs").glob("*") if p.is_file())
FILLER = '(APIServer pid=1) INFO:     10.0.0.{n}:4242 - "POST /v1/completions HTTP/1.1" 200 OK'
COUNTED = (RunStartRecord, ErrorRecord, StatsRecord)  # what the acceptance counts


@pytest.fixture(autouse=True)
def _years_from_the_lines_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The property is about the lines: a year taken from a file's modification time belongs to the
    file, not to its lines (stdin and the pieces' temp files have none or another), so it is left out."""
    from kvwatch.reconcile import evidence  # batch imports infer_years from here when it runs

    real = evidence.infer_years

    def lines_only(doc: dict[str, Any], *, created: float | None, log_mtime: float | None) -> None:
        real(doc, created=created, log_mtime=None)

    monkeypatch.setattr(evidence, "infer_years", lines_only)


def _records(path: Path | str, jobs: int = 1) -> list[LogRecord]:
    log = files.LogInput(str(path), jobs=jobs)
    return [r for batch in log.batches() for r in batch]


def _document(paths: list[str], jobs: int = 1) -> dict[str, Any]:
    doc = analyze_paths(paths, jobs=jobs)
    for entry in doc["inputs"]:
        entry.pop("path")  # "-" for stdin, a .gz's own name: the same bytes all the same
    return doc


def _every_line(data: bytes) -> list[LogRecord]:
    """The reference: every physical line through the parser, no scanner at all."""
    parser = LogParser()
    out: list[LogRecord] = []
    for i, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
        out.extend(parser.feed_line(line, i))
    return out + parser.finish()


def _small_pieces(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """The big-file machinery on small inputs: ``chunk``-byte pieces and ranges, workers for any size."""
    monkeypatch.setattr(files, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(files, "RANGE_SLACK", 64)


def test_the_real_fixtures_are_there() -> None:
    assert len(REAL_LOGS) >= 90  # tests/fixtures/real and real-extra; a lost glob must not pass silently


@pytest.mark.parametrize("path", REAL_LOGS, ids=[p.name for p in REAL_LOGS])
def test_a_real_log_read_in_pieces_gives_the_document_read_whole(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _document([str(path)])
    # Pieces of 1 KiB (a stream) cut inside nearly every startup block and wrapped record.
    _small_pieces(monkeypatch, 1 << 10)
    assert _document([str(path)]) == whole
    gz = tmp_path / (path.name + ".gz")
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert _document([str(gz)]) == whole
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    assert _document(["-"]) == whole


def _generated_log(rng: random.Random) -> bytes:
    """Real lines (startup blocks, stats, errors, wrapped records) in random order and runs, with
    random filler between, CRLF on some lines and no newline after the last one sometimes."""
    sources = rng.sample(REAL_LOGS, 6)
    out: list[str] = []
    for src in sources:
        lines = src.read_text(encoding="utf-8", errors="replace").splitlines()
        start = rng.randrange(len(lines))
        for line in lines[start : start + rng.randint(20, 400)]:
            out.append(line + ("\r" if rng.random() < 0.05 else ""))
            out.extend(FILLER.format(n=rng.randint(1, 254)) for _ in range(rng.choice((0, 0, 1, 5))))
    text = "\n".join(out)
    return (text if rng.random() < 0.3 else text + "\n").encode()


@pytest.mark.parametrize("seed", range(8))
def test_a_generated_log_read_in_pieces_gives_what_every_line_gives(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    data = _generated_log(rng)
    path = tmp_path / "gen.log"
    path.write_bytes(data)
    reference = _every_line(data)
    assert reference == _records(path)
    whole = _document([str(path)])
    _small_pieces(monkeypatch, rng.choice((300, 1 << 10, 5000)))
    assert _records(path) == reference
    assert _records(path, jobs=2) == reference  # byte ranges in worker processes
    assert _document([str(path)], jobs=2) == whole


@pytest.fixture(scope="module")
def concatenated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[Path, int]]]:
    """Every real fixture, each followed by access-log filler; where each fixture's lines start."""
    rng = random.Random(12)
    path = tmp_path_factory.mktemp("concat") / "all-real.log"
    starts: list[tuple[Path, int]] = []
    line = 0
    with path.open("wb") as out:
        for src in REAL_LOGS:
            data = src.read_bytes()
            if not data.endswith(b"\n"):
                data += b"\n"
            starts.append((src, line))
            out.write(data)
            line += data.count(b"\n")
            # More filler than any "what follows" rule looks at (shutdown noise, wrapped records).
            n = SHUTDOWN_NEAR_LINES + rng.randint(50, 400)
            out.write(("\n".join(FILLER.format(n=rng.randint(1, 254)) for _ in range(n)) + "\n").encode())
            line += n
    return path, starts


def _shifted(rec: LogRecord, shift: int) -> LogRecord:
    if isinstance(rec, StatsRecord):  # a NamedTuple; the other records are frozen dataclasses
        return rec._replace(line=rec.line - shift)
    return dataclasses.replace(rec, line=rec.line - shift)


def _counted(records: list[LogRecord], lo: int, hi: int, shift: int) -> list[LogRecord]:
    return [_shifted(r, shift) for r in records if isinstance(r, COUNTED) and lo < r.line <= hi]


@pytest.mark.parametrize("jobs", [1, 2], ids=["serial-pieces", "two-workers-byte-ranges"])
def test_concatenated_real_logs_hold_every_run_error_and_stats_record_of_each(
    concatenated: tuple[Path, list[tuple[Path, int]]], jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, starts = concatenated
    alone = {src: [r for r in _records(src) if isinstance(r, COUNTED)] for src, _ in starts}
    _small_pieces(monkeypatch, 64 << 10)  # ~30 pieces / ranges: the machinery of a multi-GB log
    together = _records(path, jobs=jobs)
    bounds = [*(line for _, line in starts[1:]), 10**12]
    extra_starts = 0
    for (src, first), nxt in zip(starts, bounds, strict=True):
        got = _counted(together, first, nxt, first)
        if got[:1] != alone[src][:1] and isinstance(got[0], RunStartRecord):
            # A fixture's first start is a restart once another log precedes it; read alone it
            # opens the log's first run, which no record marks.
            got = got[1:]
            extra_starts += 1
        assert got == alone[src], src.name
    total = sum(len(v) for v in alone.values())
    assert sum(isinstance(r, COUNTED) for r in together) == total + extra_starts
    assert sum(isinstance(r, ErrorRecord) for r in together) > 20  # crashes far from any "cache" line
    doc = _document([str(path)], jobs=jobs)
    assert doc["stats"]["count"] == sum(isinstance(r, StatsRecord) for v in alone.values() for r in v)
    assert doc["errors_total"] == sum(isinstance(r, ErrorRecord) for v in alone.values() for r in v)


@pytest.mark.parametrize("jobs", [1, 2], ids=["serial", "two-workers"])
def test_the_pure_python_scanner_gives_the_same_documents(
    concatenated: tuple[Path, list[tuple[Path, int]]], jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = concatenated
    _small_pieces(monkeypatch, 256 << 10)
    best = _document([str(path)], jobs=jobs)
    monkeypatch.setenv(scanner.ENV_VAR, "python")
    assert scanner.name() == "python"
    assert _document([str(path)], jobs=jobs) == best


def test_the_scanners_find_the_same_lines_in_every_real_log(monkeypatch: pytest.MonkeyPatch) -> None:
    for src in REAL_LOGS:
        data = src.read_bytes()
        for a, b in ((0, len(data)), (0, len(data) // 2), (len(data) // 3, len(data))):
            # Whole lines: from a line start to just after a newline (or the end).
            lo = data.rfind(b"\n", 0, a) + 1
            cut = data.find(b"\n", b)
            hi = len(data) if cut == -1 else cut + 1
            monkeypatch.delenv(scanner.ENV_VAR, raising=False)
            best = scanner.line_spans(data, lo, hi)
            monkeypatch.setenv(scanner.ENV_VAR, "python")
            assert scanner.line_spans(data, lo, hi) == best, src.name
            if (lo, hi) == (0, len(data)):
                assert best, src.name  # every real log has a candidate line


def test_many_inputs_shared_by_the_workers_give_the_serial_document(
    concatenated: tuple[Path, list[tuple[Path, int]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pod logs of uneven sizes (one empty, one .gz) cut into byte ranges that two workers share."""
    path, starts = concatenated
    lines = path.read_bytes().splitlines(keepends=True)
    cuts = [0, *sorted({line for _, line in starts[1::17]}), len(lines)]
    pods: list[str] = []
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        pod = tmp_path / f"pod-{k}.log"
        data = b"".join(lines[a:b])
        if k == 2:
            pod = pod.with_suffix(".log.gz")
            data = gzip.compress(data)
        pod.write_bytes(data)
        pods.append(str(pod))
    (tmp_path / "empty.log").write_bytes(b"")
    pods.insert(1, str(tmp_path / "empty.log"))
    serial = _document(pods, jobs=1)
    _small_pieces(monkeypatch, 32 << 10)
    assert _document(pods, jobs=2) == serial
    assert serial["stats"]["count"] > 100
    assert [i["lines"] for i in serial["inputs"]][1] == 0


@pytest.mark.parametrize("jobs", [1, 2], ids=["reader-thread", "reader-thread-and-workers"])
def test_a_gz_inflated_while_scanned_gives_the_plain_document(
    concatenated: tuple[Path, list[tuple[Path, int]]], tmp_path: Path, jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = concatenated
    plain = _document([str(path)], jobs=1)
    gz = tmp_path / "all-real.log.gz"
    gz.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))
    _small_pieces(monkeypatch, 128 << 10)  # many pieces in flight between the thread and the workers
    assert _document([str(gz)], jobs=jobs) == plain


@pytest.mark.parametrize("jobs", [1, 2], ids=["reader-thread", "reader-thread-and-workers"])
def test_a_truncated_gz_is_a_one_line_usage_error_whoever_inflates_it(
    concatenated: tuple[Path, list[tuple[Path, int]]], tmp_path: Path, jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = concatenated
    gz = tmp_path / "cut.log.gz"
    whole = gzip.compress(path.read_bytes(), compresslevel=1)
    gz.write_bytes(whole[: len(whole) // 2])
    _small_pieces(monkeypatch, 16 << 10)
    with pytest.raises(UsageError, match="damaged or truncated gzip"):
        _document([str(gz)], jobs=jobs)
