"""Replay paces a saved log by its own timestamps; tests drive the clock, nothing sleeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.sources.replay import ReplaySource, line_seconds

SEED_LOG = Path(__file__).parent / "fixtures" / "vllm-cpu-seed" / "server.log"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("INFO 11-29 14:05:10 metrics.py:351] Avg prompt", ((332 * 24 + 14) * 60 + 5) * 60 + 10),
        ("(APIServer pid=1) INFO 01-01 00:00:07 [loggers.py:1] x", 7),
        ("2025-10-14T17:02:38.123456789Z (APIServer pid=1) INFO 10-14 10:02:38 [x.py:1] y", 1760461358.123456),
        ("no timestamp here", None),
        ("INFO 13-45 99:00:00 bogus", None),
    ],
    ids=["vllm-stamp", "vllm-stamp-after-process-prefix", "rfc3339-outer-stamp-wins", "none", "impossible-date"],
)
def test_line_seconds_reads_vllm_and_rfc3339_stamps(line: str, expected: float | None) -> None:
    got = line_seconds(line)
    assert got == (pytest.approx(expected) if expected is not None else None)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_replays_the_real_seed_log_at_ten_times_its_pace(tmp_path: Path) -> None:
    clock = FakeClock()
    source = ReplaySource(SEED_LOG, 10.0, clock=clock, sleep=clock.sleep, max_wait=1.0)
    seen: list[str] = []
    while not source.done:
        seen.extend(line.text for line in source.poll())
    original = SEED_LOG.read_text(encoding="utf-8", errors="replace").splitlines()
    assert seen == original
    stamps = [s for s in (line_seconds(x) for x in original) if s is not None]
    assert clock.now == pytest.approx((stamps[-1] - stamps[0]) / 10.0, abs=1.0)
    assert max(clock.slept) <= 1.0  # never blocks longer than max_wait, so shutdown stays prompt


def test_lines_without_timestamps_travel_with_their_neighbours(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("INFO 01-01 00:00:00 a.py:1] first\ncontinuation\nINFO 01-01 00:00:10 a.py:1] later\n")
    clock = FakeClock()
    source = ReplaySource(log, 1.0, clock=clock, sleep=clock.sleep, max_wait=100)
    assert source.poll_text() == ["INFO 01-01 00:00:00 a.py:1] first", "continuation"]
    assert source.poll_text() == ["INFO 01-01 00:00:10 a.py:1] later"]
    assert source.poll_text() == []
    assert source.status().eof
    assert clock.now == pytest.approx(10.0)
