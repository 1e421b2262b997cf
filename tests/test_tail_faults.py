"""Fault acceptance of the log follower: rotations under load and restarts mid-stream.

A writer thread appends numbered records at about 1,000 a second and rotates the log 20 times,
alternating rename and copytruncate; the follower (with inotify, and with the polling fallback)
must see every number exactly once, also when kvwatch is killed and restarted mid-stream,
including a crash after a batch was read but before it was processed and committed.
The writer paces itself with short sleeps; the assertions are about counts, never about time.
"""

from __future__ import annotations

import collections
import io
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from kvwatch.sources.tail import LogFollower

RECORDS = 3_000
ROTATIONS = 20
PER_TICK = 10  # records written per 10 ms tick: ~1,000 records/s
RECORD = re.compile(r"record (\d+) ")


class Writer(threading.Thread):
    """Appends RECORDS numbered lines at ~1,000/s, rotating every RECORDS/(ROTATIONS+1) records."""

    def __init__(self, log: Path) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.rotations: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._write()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _write(self) -> None:
        every = RECORDS // (ROTATIONS + 1)
        # O_APPEND, like vLLM's stdout redirected with >>. Not a with-block: rotation swaps it.
        fh = open(self.log, "ab")  # noqa: SIM115
        try:
            for n in range(RECORDS):
                if n and n % every == 0 and len(self.rotations) < ROTATIONS:
                    fh = self._rotate(fh, len(self.rotations))
                # vLLM-sized lines (a stats record is ~250 bytes); some are written in two parts,
                # so the follower also meets partial last lines.
                line = f"INFO 11-29 15:05:55 [loggers.py:123] record {n} ".encode() + b"." * 200 + b"\n"
                if n % 7 == 0:
                    fh.write(line[:40])
                    fh.flush()
                    fh.write(line[40:])
                else:
                    fh.write(line)
                fh.flush()
                if n % PER_TICK == PER_TICK - 1:
                    time.sleep(0.01)
        finally:
            fh.close()

    def _rotate(self, fh: io.BufferedWriter, index: int) -> io.BufferedWriter:
        rotated = self.log.with_name(f"{self.log.name}.{index + 1}")
        if index % 2 == 0:  # rename rotation: the writer reopens the path (logrotate "create")
            fh.close()
            os.rename(self.log, rotated)
            self.rotations.append("rename")
            return open(self.log, "ab")
        shutil.copyfile(self.log, rotated)  # copytruncate: the writer keeps its descriptor
        os.truncate(self.log, 0)
        self.rotations.append("copytruncate")
        return fh


def numbers(lines: list[str]) -> list[int]:
    out = []
    for text in lines:
        match = RECORD.search(text)
        assert match, f"not a whole record: {text[:80]!r}"
        out.append(int(match.group(1)))
    return out


@pytest.mark.parametrize(
    ("use_watchdog", "restarts"),
    [(True, False), (False, False), (True, True), (False, True)],
    ids=["inotify", "poll", "inotify_killed_and_restarted", "poll_killed_and_restarted"],
)
def test_twenty_rotations_at_1000_records_per_second_count_every_record_once(
    tmp_path: Path, use_watchdog: bool, restarts: bool
) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()

    def start() -> LogFollower:
        return LogFollower(
            log, state_dir=state, use_watchdog=use_watchdog, poll_interval=0.05, rotate_wait=0.5, coalesce=0.01
        )

    follower = start()
    writer = Writer(log)
    writer.start()
    seen: list[int] = []
    crashes = 0
    loops = 0
    try:
        while writer.is_alive():
            follower.wait(timeout=0.05)
            batch = follower.poll()
            loops += 1
            if restarts and loops % 10 == 0:
                if crashes % 2 == 0:
                    # Killed after reading a batch but before processing it: it is not counted,
                    # not committed, and must come back after the restart.
                    follower.close()
                else:
                    seen += numbers([line.text for line in batch])
                    follower.commit()
                    follower.close()
                crashes += 1
                follower = start()
                continue
            seen += numbers([line.text for line in batch])
            follower.commit()
        writer.join()
        for _ in range(3):  # the writer has finished: whatever is left is readable now
            seen += numbers([line.text for line in follower.poll()])
            follower.commit()
    finally:
        follower.close()
    assert writer.error is None
    assert writer.rotations == ["rename", "copytruncate"] * (ROTATIONS // 2)
    counts = collections.Counter(seen)
    missing = sorted(set(range(RECORDS)) - counts.keys())
    doubled = sorted(n for n, c in counts.items() if c > 1)
    assert (missing, doubled) == ([], [])
    assert len(seen) == RECORDS
    if restarts:
        assert crashes >= 3
