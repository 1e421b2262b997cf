"""Rotations the follower never saw at path: two rotations between two looks, or while kvwatch was down.

A busy log under logrotate can be rotated twice between two polls (a rename, then the new file
renamed or copytruncated before any poll saw it), and a restarted kvwatch can find several
rotations done while it was down. The file in the middle was never open and has no marks; it is
found by its rotation name and its mtime after our last look, read whole, and in order. Each
scenario is driven by ``poll()`` directly, with the record numbers as the oracle.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from kvwatch.sources.tail import LogFollower


def write(path: Path, first: int, last: int) -> None:
    """Append records ``first..last-1`` (O_APPEND, like a redirected stdout)."""
    with open(path, "ab") as fh:
        for n in range(first, last):
            fh.write(f"INFO 12-02 01:00:00 [loggers.py:123] record {n} ".encode() + b"." * 100 + b"\n")


def numbers(follower: LogFollower) -> list[int]:
    return [int(line.text.split("record ")[1].split()[0]) for line in follower.poll()]


def drain(follower: LogFollower) -> list[int]:
    """Every record the follower still has, its rotated files let go (rotate_wait is 0)."""
    got: list[int] = []
    for _ in range(4):
        got += numbers(follower)
    return got


def rename(log: Path, to: str) -> None:
    os.rename(log, log.with_name(to))


def copytruncate(log: Path, to: str) -> None:
    shutil.copyfile(log, log.with_name(to))
    os.truncate(log, 0)


ROTATIONS = {
    "rename_then_rename": [rename, rename],
    "rename_then_copytruncate": [rename, copytruncate],
    "copytruncate_then_copytruncate": [copytruncate, copytruncate],
    "copytruncate_then_rename": [copytruncate, rename],
}


#: Two copytruncates between two looks of a running follower stay the known limit (kvwatch.sources.
#: tail's docstring): the copy in the middle is told from our own content only by marks a busy
#: writer may have moved past, and reading it whole doubled records under load. Across a restart
#: the positions say exactly what was read, so there it is recovered.
CASES = [
    pytest.param(name, restart, id=f"{name}-{'while_kvwatch_was_down' if restart else 'between_two_polls'}")
    for name in ROTATIONS
    for restart in (False, True)
    if restart or name != "copytruncate_then_copytruncate"
]


@pytest.mark.parametrize(("rotations", "restart"), CASES)
def test_two_rotations_before_the_next_look_lose_and_double_nothing(
    tmp_path: Path, rotations: str, restart: bool
) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    write(log, 0, 100)
    follower = LogFollower(log, state_dir=state, from_start=True, use_watchdog=False, rotate_wait=0.0)
    seen = numbers(follower)
    follower.commit()
    if restart:
        follower.close()
    first, second = ROTATIONS[rotations]
    write(log, 100, 150)  # written after the last look: not read yet
    first(log, "vllm.log.1")
    write(log, 150, 200)  # the file nobody looked at (or the copy's successor)
    second(log, "vllm.log.2")
    write(log, 200, 250)
    if restart:
        follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=0.0)
    try:
        seen += drain(follower)
    finally:
        follower.close()
    assert seen == list(range(250))


def test_a_restart_rereads_no_rotated_file_it_had_finished(tmp_path: Path) -> None:
    """Finished rotated files are remembered in the positions (identity and head hash only)."""
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    write(log, 0, 50)
    follower = LogFollower(log, state_dir=state, from_start=True, use_watchdog=False, rotate_wait=0.0)
    seen = numbers(follower)
    rename(log, "vllm.log.1")
    write(log, 50, 100)
    seen += drain(follower)  # vllm.log.1 read to its end and let go
    follower.commit()
    follower.close()
    write(log, 100, 120)
    follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=0.0)
    try:
        seen += drain(follower)
    finally:
        follower.close()
    assert seen == list(range(120))


def test_old_rotations_and_other_logs_next_to_it_are_never_read(tmp_path: Path) -> None:
    """Only this file's rotation names written after our last look count: an old vllm.log.3 and
    another server's vllm-2.log.1 written since stay unread."""
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    old = tmp_path / "vllm.log.3"
    write(old, 900, 910)
    past = time.time() - 3600
    os.utime(old, (past, past))
    write(log, 0, 10)
    follower = LogFollower(log, state_dir=state, from_start=True, use_watchdog=False, rotate_wait=0.0)
    seen = numbers(follower)
    follower.commit()
    follower.close()
    write(tmp_path / "vllm-2.log.1", 800, 810)  # another log's rotation, written while we were down
    write(log, 10, 20)
    rename(log, "vllm.log.1")
    write(log, 20, 30)
    follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=0.0)
    try:
        seen += drain(follower)
    finally:
        follower.close()
    assert seen == list(range(30))


def test_a_copy_still_being_written_is_not_taken_for_an_unseen_rotation(tmp_path: Path) -> None:
    """A copytruncate copy that is shorter than what we read (still being written, or cut) starts
    like our file: it is our file's copy, never a rotation to read whole (that would double it)."""
    log = tmp_path / "vllm.log"
    write(log, 0, 100)
    follower = LogFollower(log, from_start=True, use_watchdog=False, rotate_wait=0.0)
    try:
        seen = numbers(follower)
        with open(log, "rb") as src:
            half = src.read(os.path.getsize(log) // 2)
        log.with_name("vllm.log.1").write_bytes(half)  # the copy, half written
        os.truncate(log, 0)
        write(log, 100, 120)
        seen += drain(follower)
    finally:
        follower.close()
    assert seen == list(range(120))


def test_a_short_finished_file_renamed_again_is_not_read_twice(tmp_path: Path) -> None:
    """A rotated file of one short line, finished, then shifted by logrotate (.1 to .2): its head is
    too short to tell copies apart, but its inode and that head say it is the file we finished."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"record 0 short\n")  # 15 bytes: shorter than any head worth comparing
    follower = LogFollower(log, from_start=True, use_watchdog=False, rotate_wait=0.0)
    try:
        got = [line.text for line in follower.poll()]
        rename(log, "vllm.log.1")
        write(log, 1, 20)
        got += [line.text for _ in range(3) for line in follower.poll()]  # vllm.log.1 finished
        rename(log.with_name("vllm.log.1"), "vllm.log.2")  # logrotate shifts the old rotation
        rename(log, "vllm.log.1")
        write(log, 20, 30)
        got += [line.text for _ in range(3) for line in follower.poll()]
    finally:
        follower.close()
    assert got.count("record 0 short") == 1
    assert [int(t.split("record ")[1].split()[0]) for t in got[1:]] == list(range(1, 30))
