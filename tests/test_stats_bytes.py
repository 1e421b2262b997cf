"""The common V1 stats line read from bytes (kvwatch.parse.statsbytes) gives the general reader's row.

Every line of every real fixture, of a generated log, and hand-made edge cases: where the bytes
reader gives a row it is exactly ``log._plain_stats_row`` of the decoded line; and a chunk read
with it holds the same candidates as one read without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvwatch.parse import log as L
from kvwatch.parse.statsbytes import plain_stats_row
from kvwatch.sources import files

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from gen_log import generate  # type: ignore[import-not-found]  # noqa: E402  (benchmarks/ is not a package)

V1 = (
    "INFO 11-29 08:00:10 [loggers.py:336] Engine 000: Avg prompt throughput: 272.5 tokens/s, Avg generation "
    "throughput: 1232.4 tokens/s, Running: 61 reqs, Waiting: 24 reqs, GPU KV cache usage: 81.2%, Prefix cache "
    "hit rate: 46.0%"
)
CASES = [
    V1,
    "(APIServer pid=2871) " + V1,
    "\x1b[1;36m(APIServer pid=2871)\x1b[0;0m " + V1,
    V1 + "\r",
    V1 + ".",
    V1.replace("INFO", "DEBUG"),
    V1.replace("Engine 000: ", "2 Engines Aggregated: "),
    V1.replace("Engine 000: ", ""),
    V1.replace("[loggers.py:336]", "[v1/metrics/loggers.py:336]"),
    V1.replace("08:00:10", "08:00:10,123"),
    V1.replace("GPU KV", "XPU KV"),
    V1.replace("Waiting: 24 reqs, ", "Waiting: 24 reqs, Preemptions: 3, "),
    # V0 (0.4.3-0.10.2 engine/metrics.py): swapped and the CPU swap space
    "INFO 06-01 10:00:00 metrics.py:345] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 5.1 "
    "tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.4%, CPU KV cache usage: 0.0%.",
    # docker --timestamps / kubectl logs --timestamps: the stamp's time, year and zone
    "2025-01-01T00:00:00.123456789Z " + V1,
    "2025-01-01T00:00:00.123456789Z (APIServer pid=2871) " + V1,
    "2025-06-30T23:59:59+02:00 \x1b[1;36m(APIServer pid=2871)\x1b[0;0m " + V1,
    "2025-06-30T23:59:59 " + V1,
    # outside the layout: the general reader decides
    "(prompt_token_ids pid=1) " + V1,
    '("x" pid=1) ' + V1,
    "2025-01-01T00:00:00Z 2025-01-01T00:00:00Z " + V1,
    "2025-01-01 00:00:00 " + V1,
    V1.replace("[loggers.py:336]", "[api_server.py:336]"),
    V1.replace("[loggers.py:336]", "[lôggers.py:336]"),
    V1 + " MFU 3%",
    V1 + "\rjunk",
    V1.replace("Running", "Running\x1c"),
    "INFO 11-29 08:00:10 [loggers.py:336] " + V1,
]


def _agrees(line: bytes) -> bool:
    row = plain_stats_row(line, 0, len(line))
    return row is None or row == L._plain_stats_row(line.decode("utf-8", "replace"))


@pytest.mark.parametrize("line", CASES)
def test_edge_cases_read_as_the_general_reader_reads_them(line: str) -> None:
    assert _agrees(line.encode())


def test_the_common_layouts_take_the_bytes_path() -> None:
    hits = [plain_stats_row(c.encode(), 0, len(c.encode())) is not None for c in CASES[:17]]
    assert all(hits)
    outside = [plain_stats_row(c.encode(), 0, len(c.encode())) for c in CASES[17:]]
    assert outside == [None] * len(outside)


def test_every_real_fixture_line_agrees() -> None:
    hits = 0
    for path in sorted(p for p in FIXTURES.rglob("*.log") if p.is_file()):
        for line in path.read_bytes().split(b"\n"):
            assert _agrees(line), (path.name, line[:120])
            hits += plain_stats_row(line, 0, len(line)) is not None
    assert hits > 100


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("gen") / "gen.log"
    generate(str(path), 60_000)
    return path.read_bytes()


def test_every_generated_line_agrees(generated: bytes) -> None:
    lines = generated.split(b"\n")
    assert all(_agrees(line) for line in lines)
    assert sum(plain_stats_row(line, 0, len(line)) is not None for line in lines) > 1000


def test_a_chunk_holds_the_same_candidates_with_and_without_the_bytes_path(
    generated: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = b"".join(
        p.read_bytes().rstrip(b"\n") + b"\n"
        for d in ("real", "real-extra")
        for p in sorted((FIXTURES / d / "logs").glob("*"))
    )
    data = generated + block
    with_bytes = files.candidate_lines(data)
    monkeypatch.setattr(files, "plain_stats_row", lambda data, start, end: None)
    without = files.candidate_lines(data)
    assert with_bytes.lines == without.lines
    assert [(i, t, s) for i, t, s in with_bytes.candidates] == [(i, t, s) for i, t, s in without.candidates]


def test_a_docker_or_kubectl_stamped_stats_line_takes_the_bytes_path_with_the_stamps_time() -> None:
    line = ("2025-01-01T00:00:00.123456789Z (APIServer pid=2871) " + V1).encode()
    row = plain_stats_row(line, 0, len(line))
    assert row is not None
    assert row[0] == (1, 1, 0, 0, 0.123456789, 2025, "Z")  # the stamp's, as log._outer_time reads it
    real = FIXTURES / "real-extra" / "logs" / "208-v1-docker-rfc3339-nanos-apiserver.log"
    lines = [ln for ln in real.read_bytes().split(b"\n") if b"Avg prompt throughput" in ln]
    fast = [plain_stats_row(ln, 0, len(ln)) for ln in lines]
    assert lines
    assert all(r is not None for r in fast)  # every stats line of the real docker log
    assert fast == [L._plain_stats_row(ln.decode()) for ln in lines]


def test_the_kept_prefix_verdicts_refuse_a_marker_every_time_and_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvwatch.parse import statsbytes

    monkeypatch.setattr(statsbytes, "_PREFIX_CLEAN", {})
    monkeypatch.setattr(statsbytes, "_PREFIX_CLEAN_MAX", 3)
    suspect = ("(prompt_token_ids pid=1) " + V1).encode()
    clean = ("(APIServer pid=1) " + V1).encode()
    for _ in range(2):  # the second time from the kept verdicts
        assert plain_stats_row(suspect, 0, len(suspect)) is None
        assert plain_stats_row(clean, 0, len(clean)) is not None
    for pid in range(10):  # a log of endless pids never grows the kept verdicts past their bound
        line = (f"(APIServer pid={pid + 2}) " + V1).encode()
        assert plain_stats_row(line, 0, len(line)) is not None
        assert len(statsbytes._PREFIX_CLEAN) <= 3
    assert plain_stats_row(suspect, 0, len(suspect)) is None
