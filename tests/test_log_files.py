"""The fast file reader: candidate lines, windows, chunking and parallel byte ranges.

Every shortcut of kvwatch.sources.files must give exactly what reading every line would: these
tests compare the shortcuts against ``LogParser`` fed every physical line.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvwatch.parse.log import LogParser
from kvwatch.records import LogRecord, StatsRecord
from kvwatch.sources import files

FIXTURES = Path(__file__).parent / "fixtures"
SEED_LOG = FIXTURES / "vllm-cpu-seed" / "server.log"
WRAPPED = FIXTURES / "real" / "logs" / "026-v011-docker-rfc3339-hardwrapped.log"
FILLER = '(APIServer pid=1) INFO:     10.0.0.{n}:4242 - "POST /v1/completions HTTP/1.1" 200 OK'


def every_line(data: bytes) -> list[LogRecord]:
    """The reference: every physical line through the parser."""
    parser = LogParser()
    out: list[LogRecord] = []
    for i, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
        out.extend(parser.feed_line(line, i))
    return out + parser.finish()


def via_input(path: Path, jobs: int) -> tuple[list[LogRecord], int]:
    log = files.LogInput(str(path), jobs=jobs)
    records = [r for batch in log.batches() for r in batch]
    return records, log.lines


@pytest.fixture
def big_log(tmp_path: Path) -> Path:
    """The real seed log with 40 filler lines after each of its lines, twice (two server starts)."""
    rng = random.Random(3)
    out: list[str] = []
    for _ in range(2):
        for line in SEED_LOG.read_text().splitlines():
            out.append(line)
            out.extend(FILLER.format(n=rng.randint(1, 254)) for _ in range(40))
    path = tmp_path / "big.log"
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.mark.parametrize("scanner", ["best", "python"], ids=["compiled-scanner", "pure-python-scanner"])
def test_candidate_scan_finds_what_every_line_finds(
    big_log: Path, scanner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVWATCH_SCANNER", scanner)
    data = big_log.read_bytes()
    scan = files.candidate_lines(data)
    parser = LogParser()
    got = [r for rel, text, s in scan.candidates for r in parser.feed_scan(s, rel + 1, text)] + parser.finish()
    assert got == every_line(data)
    assert scan.lines == data.count(b"\n")
    assert sum(isinstance(r, StatsRecord) for r in got) == 42


def test_scan_keeps_the_first_half_of_a_hard_wrapped_record() -> None:
    data = WRAPPED.read_bytes()
    scan = files.candidate_lines(data)
    parser = LogParser()
    got = [r for rel, text, s in scan.candidates for r in parser.feed_scan(s, rel + 1, text)] + parser.finish()
    stats = [r for r in got if isinstance(r, StatsRecord)]
    assert [(r.line, r.gen_tps, r.kv_usage_pct) for r in stats] == [
        (1, 843.6, 88.5),
        (5, 852.1, 89.8),
        (9, 794.7, 93.2),
    ]


@pytest.mark.parametrize("width", [73, 76, 80, 100, 140])
@pytest.mark.parametrize("scanner", ["best", "python"], ids=["compiled-scanner", "pure-python-scanner"])
def test_records_a_narrow_terminal_cut_into_lines_read_as_whole(
    width: int, scanner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed log's stats records copied from a terminal of ``width`` columns: 73 and 76 cut
    inside "Avg prompt throughput:" (its prefixes are 72 characters), 80 into five lines."""
    out: list[str] = []
    for line in SEED_LOG.read_text().splitlines():
        pieces = [line[i : i + width] for i in range(0, len(line), width)] if "Avg prompt" in line else [line]
        out.extend(pieces)
        out.append(FILLER.format(n=len(out) % 254))
    data = ("\n".join(out) + "\n").encode()
    monkeypatch.setenv("KVWATCH_SCANNER", scanner)
    scan = files.candidate_lines(data)
    parser = LogParser()
    got = [r for rel, text, s in scan.candidates for r in parser.feed_scan(s, rel + 1, text)] + parser.finish()
    whole = [r._replace(line=0) for r in every_line(SEED_LOG.read_bytes()) if isinstance(r, StatsRecord)]
    assert [r._replace(line=0) for r in got if isinstance(r, StatsRecord)] == whole
    assert got == every_line(data)


@pytest.mark.parametrize(
    ("jobs", "scanner"),
    [(1, "best"), (2, "best"), (1, "python"), (2, "python")],
    ids=["serial-small-chunks", "two-workers-byte-ranges", "serial-pure-python", "two-workers-pure-python"],
)
def test_chunks_and_byte_ranges_change_nothing(
    big_log: Path, jobs: int, scanner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = every_line(big_log.read_bytes())
    # Tiny chunks and ranges put boundaries inside startup blocks and between wrapped halves.
    monkeypatch.setenv("KVWATCH_SCANNER", scanner)
    monkeypatch.setattr(files, "CHUNK_BYTES", 200 << 10)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    records, lines = via_input(big_log, jobs)
    assert records == reference
    assert lines == big_log.read_bytes().count(b"\n")


def test_a_line_longer_than_the_chunk_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "CHUNK_BYTES", 1 << 10)
    record = SEED_LOG.read_text().splitlines()[112]
    path = tmp_path / "long.log"
    path.write_text("y" * 3000 + " " + record + "\n" + record + "\n")
    records, lines = via_input(path, 1)
    assert lines == 2
    assert [r.line for r in records if isinstance(r, StatsRecord)] == [1, 2]


def test_a_line_beyond_the_memory_bound_is_cut_not_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "CHUNK_BYTES", 1 << 10)
    record = SEED_LOG.read_text().splitlines()[112]
    path = tmp_path / "endless.log"
    path.write_text("z" * 50_000 + "\n" + record + "\n")
    with path.open("rb") as fh:
        chunks = list(files._chunks(fh))
    assert max(len(c) for c in chunks) <= 5 * (1 << 10)  # never more than the bound in memory
    assert b"".join(chunks) == path.read_bytes()  # and nothing lost or doubled
    records, _ = via_input(path, 1)
    assert sum(isinstance(r, StatsRecord) for r in records) == 1


def test_progress_reports_every_byte(tmp_path: Path) -> None:
    seen: list[int] = []
    log = files.LogInput(str(SEED_LOG), progress=seen.append)
    for _ in log.batches():
        pass
    assert sum(seen) == SEED_LOG.stat().st_size == log.bytes


def test_many_small_inputs_read_in_parallel_come_back_in_order(tmp_path: Path) -> None:
    from kvwatch.batch import analyze_paths

    paths = [str(SEED_LOG), str(WRAPPED), str(FIXTURES / "vllm-cpu" / "server.log"), str(SEED_LOG)]
    serial = analyze_paths(paths, jobs=1)
    parallel = analyze_paths(paths, jobs=2)
    assert parallel == serial
    assert [i["lines"] for i in parallel["inputs"]] == [231, 10, 350, 231]
