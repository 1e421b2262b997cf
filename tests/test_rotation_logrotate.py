"""Rotation under real logrotate: every record that survived on disk is read exactly once.

Debian's ``/usr/sbin/logrotate`` (3.21 here) rotates the log 20 times per setup with ``-f`` and a
state file in tmp_path, while a writer appends about 1,000 numbered records a second (O_APPEND,
as vLLM's stdout redirected with ``>>`` or ``tee -a``). The oracle is a second reader that, at the
end, reads every file logrotate left on disk (the log, ``.N`` and ``.N.gz``): each record found
there must have been returned by the follower exactly once. Records logrotate itself dropped
(written between its copy and its truncate, ``copyTruncate`` in logrotate.c) are on no disk and
so are not asked for; they are counted and printed, which is where docs/deploy.md's loss
windows come from. Waits are on counts (records written, records read) with generous ceilings.
"""

from __future__ import annotations

import collections
import gzip
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvwatch.sources.tail import LogFollower
from tests.conftest import require_binary

ROTATIONS = 20
RECORDS_BETWEEN_ROTATIONS = 250  # ~0.25 s at 1,000 records/s
PER_TICK = 10  # records per 10 ms tick
RECORD = re.compile(rb"^INFO 12-01 21:50:00 \[loggers\.py:123\] record (\d+) \.{150}$")
CEILING = 120.0  # seconds; only ever reached when something is broken

pytestmark = pytest.mark.logrotate

SETUPS = {
    "copytruncate": ["copytruncate"],
    "copytruncate_compress": ["copytruncate", "compress"],
    "copytruncate_compress_delaycompress": ["copytruncate", "compress", "delaycompress"],
    "create": ["create"],
}


class Writer(threading.Thread):
    """Appends numbered records at ~1,000/s until stopped; reopens the path when it is renamed away.

    Reopening stands in for the application's reaction to ``create`` rotation (a postrotate
    signal); until it notices, its records still land in the renamed file, as they would.
    """

    def __init__(self, log: Path) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.written = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            ino = os.fstat(fd).st_ino
            while not self.stop.is_set():
                for _ in range(PER_TICK):
                    os.write(fd, b"INFO 12-01 21:50:00 [loggers.py:123] record %d " % self.written + b"." * 150 + b"\n")
                    self.written += 1
                time.sleep(0.01)
                try:
                    now_ino = os.stat(self.log).st_ino
                except FileNotFoundError:
                    now_ino = -1
                if now_ino != ino:
                    os.close(fd)
                    fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    ino = os.fstat(fd).st_ino
            os.close(fd)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


class Reader(threading.Thread):
    """The sidecar's log loop: wait, poll, count, commit."""

    def __init__(self, follower: LogFollower) -> None:
        super().__init__(daemon=True)
        self.follower = follower
        self.seen: list[int] = []
        self.garbled: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.follower.wait(0.1)
            for line in self.follower.poll():
                match = RECORD.match(line.text.encode())
                if match:
                    self.seen.append(int(match.group(1)))
                else:
                    self.garbled.append(line.text[:80])
            self.follower.commit()


def on_disk(directory: Path, name: str) -> list[int]:
    """The oracle: every whole record in every file logrotate left, decompressing .gz."""
    out: list[int] = []
    for path in sorted(directory.iterdir()):
        if not path.name.startswith(name):
            continue
        data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        for raw in data.split(b"\n")[:-1]:  # a last piece without its newline is not a record yet
            match = RECORD.match(raw)
            if match:
                out.append(int(match.group(1)))
    return out


def wait_for(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + CEILING
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_written(writer: Writer, target: int) -> None:
    wait_for(lambda: writer.written >= target or writer.error is not None, "the writer")


@pytest.mark.parametrize("directives", list(SETUPS.values()), ids=list(SETUPS))
def test_real_logrotate_20_rotations_at_1000_records_per_second_lose_and_double_nothing_on_disk(
    tmp_path: Path, directives: list[str]
) -> None:
    logrotate = require_binary("logrotate")  # skipped locally, a failure under CI, when missing
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    log = logs / "vllm.log"
    log.touch()
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{log} {{\n  rotate 1000\n  missingok\n" + "".join(f"  {d}\n" for d in directives) + "}\n")
    conf.chmod(0o644)  # logrotate refuses a config others may write
    state = tmp_path / "logrotate.status"

    follower = LogFollower(log, state_dir=tmp_path / "kvwatch", from_start=True)
    reader, writer = Reader(follower), Writer(log)
    reader.start()
    writer.start()
    try:
        for _ in range(ROTATIONS):
            wait_written(writer, writer.written + RECORDS_BETWEEN_ROTATIONS)
            done = subprocess.run(
                [logrotate, "-f", "-s", str(state), str(conf)], check=False, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
        wait_written(writer, writer.written + RECORDS_BETWEEN_ROTATIONS)
        writer.stop.set()
        writer.join(timeout=CEILING)
        assert writer.error is None
        oracle = on_disk(logs, log.name)
        wait_for(lambda: set(oracle) <= set(reader.seen), "the follower to read every record on disk")
    finally:
        reader.stop.set()
        reader.join(timeout=CEILING)
    try:
        # Whatever might still come twice (a copy read again, a rotated file's end) comes now.
        for _ in range(3):
            for line in follower.poll():
                match = RECORD.match(line.text.encode())
                (reader.seen.append(int(match.group(1))) if match else reader.garbled.append(line.text[:80]))
    finally:
        follower.close()
    counts = collections.Counter(reader.seen)
    missing = sorted(set(oracle) - counts.keys())
    doubled = sorted(n for n, c in counts.items() if c > 1)
    assert len(set(oracle)) == len(oracle), "the oracle itself holds a record twice"
    assert (missing, doubled, reader.garbled) == ([], [], [])
    assert set(counts) <= set(range(writer.written))
    on_disk_count = len(oracle)
    gz_files = sorted(p.name for p in logs.iterdir() if p.name.endswith(".gz"))
    if "compress" in directives:
        assert len(gz_files) >= ROTATIONS - 1  # logrotate really compressed the copies
    lost = writer.written - on_disk_count
    print(  # docs/deploy.md's loss windows: what logrotate itself dropped, never kvwatch
        f"\n{'+'.join(directives)}: written {writer.written}, on disk {on_disk_count}, "
        f"lost by logrotate {lost} ({100 * lost / writer.written:.3f} %), read by kvwatch {len(counts)}"
    )
