"""The file follower (kvwatch.sources.tail): start position, partial and bad lines, rotation, positions.

Every test drives ``poll()`` directly, so none waits for a timer; the few that exercise
``wait()`` bound it with a timeout. Tests that do not depend on how the follower wakes up run
both with watchdog (inotify) and with the polling fallback.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvwatch.errors import UsageError
from kvwatch.sources.lines import Line
from kvwatch.sources.tail import LogFollower, positions_file

MODES = [pytest.param(True, id="inotify"), pytest.param(False, id="poll")]


def append(path: Path, data: bytes) -> None:
    """What a writer with O_APPEND (shell ``>>``, Python's "a") does."""
    with open(path, "ab") as fh:
        fh.write(data)


def texts(lines: list[Line]) -> list[str]:
    return [line.text for line in lines]


class Clock:
    """An injected monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


FollowerFactory = Callable[..., LogFollower]


@pytest.fixture(params=MODES)
def follow(request: pytest.FixtureRequest) -> Iterator[FollowerFactory]:
    """Make followers (closed after the test) in the parametrized wake-up mode."""
    made: list[LogFollower] = []

    def make(path: Path, **kwargs: object) -> LogFollower:
        kwargs.setdefault("use_watchdog", request.param)
        follower = LogFollower(path, **kwargs)  # type: ignore[arg-type]
        made.append(follower)
        return follower

    yield make
    for follower in made:
        follower.close()


# ----------------------------------------------------------------------------- where reading starts


@pytest.mark.parametrize(
    ("from_start", "expected"),
    [(False, ["new"]), (True, ["old 1", "old 2", "new"])],
    ids=["starts_at_end_by_default", "from_start_reads_what_is_there"],
)
def test_start_position(tmp_path: Path, follow: FollowerFactory, from_start: bool, expected: list[str]) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"old 1\nold 2\n")
    follower = follow(log, from_start=from_start)
    append(log, b"new\n")
    assert texts(follower.poll()) == expected


def test_starting_at_end_mid_line_drops_the_fragment(tmp_path: Path, follow: FollowerFactory) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"whole\nhalf a li")
    follower = follow(log)
    append(log, b"ne\nnext\n")
    assert texts(follower.poll()) == ["next"]


def test_file_appearing_late_is_waited_for_without_error(tmp_path: Path, follow: FollowerFactory) -> None:
    log = tmp_path / "later" / "vllm.log"  # not even its directory exists yet
    follower = follow(log)
    assert follower.poll() == []
    status = follower.status()
    assert (status.up, status.last_error) == (False, None)
    log.parent.mkdir()
    log.write_bytes(b"INFO first\nINFO second\n")
    assert texts(follower.poll()) == ["INFO first", "INFO second"]  # a new file is read from its start
    assert follower.status().up


def test_watchdog_starts_once_the_directory_appears(tmp_path: Path) -> None:
    log = tmp_path / "later" / "vllm.log"
    with LogFollower(log, use_watchdog=True) as follower:
        assert follower.status().mode == "poll"
        log.parent.mkdir()
        follower.poll()
        assert follower.status().mode == "inotify"


# ----------------------------------------------------------------------------- what a line is


@pytest.mark.parametrize(
    ("writes", "expected"),
    [
        ([b"INFO partial", b" line\n"], [[], ["INFO partial line"]]),
        ([b"a\r\nb\r\n"], [["a", "b"]]),
        ([b"ok \xff\xfe bytes\n"], [["ok \ufffd\ufffd bytes"]]),
        ([b"split \xe2\x82", b"\xac euro\n"], [[], ["split \u20ac euro"]]),
        ([b"\n\n"], [["", ""]]),
    ],
    ids=[
        "partial_last_line_waits_for_its_newline",
        "crlf_loses_its_cr",
        "invalid_utf8_is_replaced",
        "utf8_char_split_across_writes_is_kept_whole",
        "empty_lines_are_lines",
    ],
)
def test_line_shapes(tmp_path: Path, follow: FollowerFactory, writes: list[bytes], expected: list[list[str]]) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    follower = follow(log)
    got = []
    for data in writes:
        append(log, data)
        got.append(texts(follower.poll()))
    assert got == expected


def test_ten_megabyte_line_is_truncated_to_the_bound_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    bound = 1 << 20
    with LogFollower(log, use_watchdog=False, max_line_bytes=bound) as follower:
        append(log, b"x" * (10 << 20) + b"\nafter\n")
        tracemalloc.start()
        try:
            lines: list[Line] = []
            for _ in range(5):  # one poll reads at most 8 MiB; the rest comes with the next
                lines += follower.poll()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert [(len(line.text), line.truncated) for line in lines] == [(bound, True), (5, False)]
    assert lines[1].text == "after"
    assert peak < 5 * bound  # a 10 MiB line never sits in memory whole
    assert follower.status().truncated_lines_total == 1


def test_a_directory_is_reported_not_followed(tmp_path: Path, follow: FollowerFactory) -> None:
    follower = follow(tmp_path)
    assert follower.poll() == []
    status = follower.status()
    assert status.up is False
    assert status.last_error is not None
    assert "is a directory" in status.last_error


# ----------------------------------------------------------------------------- rotation


def rotate_rename(log: Path) -> None:
    os.rename(log, log.with_name(log.name + ".1"))
    log.touch()


def rotate_copytruncate(log: Path) -> None:
    shutil.copyfile(log, log.with_name(log.name + ".1"))
    os.truncate(log, 0)


def rotate_delete(log: Path) -> None:
    log.unlink()
    log.touch()


ROTATIONS = [
    pytest.param(rotate_rename, id="rename"),
    pytest.param(rotate_copytruncate, id="copytruncate"),
    pytest.param(rotate_delete, id="delete_and_recreate"),
]


@pytest.mark.parametrize("rotate", ROTATIONS)
@pytest.mark.parametrize(
    "after", [b"new 1\n", b"new record that is longer than everything read before\n"], ids=["short", "regrown"]
)
def test_rotation_loses_and_doubles_nothing(
    tmp_path: Path, follow: FollowerFactory, rotate: Callable[[Path], None], after: bytes
) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    follower = follow(log, rotate_wait=0)
    append(log, b"old 1\nold 2\n")
    assert texts(follower.poll()) == ["old 1", "old 2"]
    append(log, b"old 3, written before the rotation, unread\n")
    rotate(log)
    append(log, after)
    assert texts(follower.poll()) == ["old 3, written before the rotation, unread", after.decode().rstrip("\n")]
    append(log, b"new 2\n")
    assert texts(follower.poll()) == ["new 2"]
    renames, truncations = follower.rotations
    assert renames + truncations == 1


def test_rotated_file_is_still_read_for_rotate_wait_then_let_go(tmp_path: Path, follow: FollowerFactory) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    follower = follow(log, rotate_wait=5.0, clock=clock)
    rotate_rename(log)
    old = log.with_name("vllm.log.1")
    append(old, b"late line from a writer that has not reopened yet\npartial")
    append(log, b"new 1\n")
    assert texts(follower.poll()) == ["late line from a writer that has not reopened yet", "new 1"]
    clock.now += 5.0
    assert texts(follower.poll()) == ["partial"]  # given up on: its last partial line is delivered
    append(old, b"too late\n")
    clock.now += 60
    assert follower.poll() == []


def test_renamed_away_and_back_keeps_its_position(tmp_path: Path, follow: FollowerFactory) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    follower = follow(log)
    append(log, b"1\n")
    assert texts(follower.poll()) == ["1"]
    os.rename(log, tmp_path / "vllm.log.tmp")
    assert follower.poll() == []
    os.rename(tmp_path / "vllm.log.tmp", log)
    append(log, b"2\n")
    assert texts(follower.poll()) == ["2"]


def test_copytruncate_by_a_writer_without_o_append_skips_the_hole(tmp_path: Path, follow: FollowerFactory) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    follower = follow(log, max_line_bytes=8192)  # the hole is far longer than a line may be
    with open(log, "r+b") as fh:  # shell ">" redirect: no O_APPEND, the offset survives the truncate
        fh.write(b"x" * 100_000 + b"\n")
        fh.flush()
        assert len(follower.poll()) == 1
        os.truncate(log, 0)
        fh.write(b"after the hole\n")
        fh.flush()
        assert texts(follower.poll()) == ["after the hole"]


# ----------------------------------------------------------------------------- wake-up


def test_wait_returns_on_a_write_when_watching_events(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    with LogFollower(log, use_watchdog=True, poll_interval=30, coalesce=0) as follower:
        assert follower.status().mode == "inotify"
        append(log, b"x\n")
        assert follower.wait(timeout=10) is True
        assert texts(follower.poll()) == ["x"]


def test_wait_times_out_after_the_poll_interval_without_watchdog(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    with LogFollower(log, use_watchdog=False, poll_interval=0.01) as follower:
        assert follower.status().mode == "poll"
        append(log, b"x\n")
        assert follower.wait(timeout=10) is False  # nothing wakes it but the interval ...
        assert texts(follower.poll()) == ["x"]  # ... after which the poll finds the line


# ----------------------------------------------------------------------------- positions


def restart(follower: LogFollower, log: Path, state: Path, **kwargs: object) -> LogFollower:
    """kvwatch killed and started again: the old follower's memory is gone, only the positions remain."""
    follower.close()
    return LogFollower(log, state_dir=state, use_watchdog=False, **kwargs)  # type: ignore[arg-type]


def test_restart_resumes_after_the_last_committed_line(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"before kvwatch\n")
    follower = LogFollower(log, state_dir=state, use_watchdog=False)
    append(log, b"1\n2\n")
    assert texts(follower.poll()) == ["1", "2"]
    follower.commit()
    append(log, b"3\n4\npart")
    follower = restart(follower, log, state)
    assert texts(follower.poll()) == ["3", "4"]
    follower.commit()
    append(log, b"ial\n")
    follower = restart(follower, log, state)
    assert texts(follower.poll()) == ["partial"]
    follower.close()


def test_restart_before_the_first_commit_resumes_where_reading_started(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"before kvwatch\n")
    follower = LogFollower(log, state_dir=state, use_watchdog=False)  # starts at the end
    append(log, b"written while kvwatch was down\n")
    follower = restart(follower, log, state)
    assert texts(follower.poll()) == ["written while kvwatch was down"]
    follower.close()


def test_a_batch_returned_but_not_committed_is_returned_again(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()
    follower = LogFollower(log, state_dir=state, use_watchdog=False)
    append(log, b"1\n")
    follower.poll()
    follower.commit()
    append(log, b"2\n")
    assert texts(follower.poll()) == ["2"]  # crash before this batch was processed and committed
    follower = restart(follower, log, state)
    assert texts(follower.poll()) == ["2"]
    follower.close()


@pytest.mark.parametrize(
    ("rotate", "expected"),
    [
        pytest.param(rotate_rename, ["unread old", "new"], id="rename_old_file_found_by_inode"),
        pytest.param(rotate_copytruncate, ["unread old", "new"], id="copytruncate_rest_read_from_copy"),
        pytest.param(rotate_delete, ["new"], id="delete_unread_end_is_gone"),
    ],
)
def test_restart_across_a_rotation_that_happened_while_down(
    tmp_path: Path, rotate: Callable[[Path], None], expected: list[str]
) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()
    follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=0)
    append(log, b"read\n")
    assert texts(follower.poll()) == ["read"]
    follower.commit()
    follower.close()
    append(log, b"unread old\n")
    rotate(log)
    append(log, b"new\n")
    follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=0)
    assert texts(follower.poll()) == expected
    append(log, b"newer\n")
    assert texts(follower.poll()) == ["newer"]
    follower.close()


def test_restart_while_a_rotated_file_was_still_being_read(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()
    clock = Clock()
    follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=5, clock=clock)
    rotate_rename(log)
    append(log, b"new 1\n")
    assert texts(follower.poll()) == ["new 1"]
    follower.commit()
    append(log.with_name("vllm.log.1"), b"late old\n")
    append(log, b"new 2\n")
    follower = restart(follower, log, state, rotate_wait=5, clock=clock)
    assert texts(follower.poll()) == ["late old", "new 2"]
    follower.close()


def test_positions_file_holds_offsets_and_hashes_never_log_text(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()
    with LogFollower(log, state_dir=state, use_watchdog=False) as follower:
        append(log, b"INFO Received request cmpl-1: prompt: 'my secret prompt'\n")
        follower.poll()
        follower.commit()
    text = positions_file(state, log).read_text()
    assert "secret" not in text
    assert json.loads(text)["files"][0]["offset"] == log.stat().st_size


@pytest.mark.parametrize(
    "content", [b"{not json", b'{"version": 99, "files": []}', b'{"version": 1}'], ids=["garbage", "version", "shape"]
)
def test_unreadable_positions_file_is_ignored_with_a_note(tmp_path: Path, content: bytes) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"old\n")
    state.mkdir()
    positions_file(state, log).write_bytes(content)
    with LogFollower(log, state_dir=state, use_watchdog=False, from_start=True) as follower:
        assert texts(follower.poll()) == ["old"]
        assert any("ignored unreadable positions file" in note for note in follower.notes)


def test_state_dir_that_cannot_be_created_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.touch()
    with pytest.raises(UsageError, match="cannot use --state-dir"):
        LogFollower(tmp_path / "vllm.log", state_dir=blocker / "state")


def test_symlinked_log_rotated_where_it_really_lives(tmp_path: Path, follow: FollowerFactory) -> None:
    # Kubernetes: /var/log/containers/<pod>.log -> /var/log/pods/<pod>/<container>/0.log
    pods = tmp_path / "pods"
    pods.mkdir()
    real = pods / "0.log"
    real.touch()
    link = tmp_path / "containers.log"
    link.symlink_to(real)
    follower = follow(link, rotate_wait=0)
    append(real, b"1\n")
    assert texts(follower.poll()) == ["1"]
    append(real, b"2\n")
    rotate_copytruncate(real)  # the copy lands next to the real file, not next to the link
    append(real, b"3\n")
    assert texts(follower.poll()) == ["2", "3"]


def test_busy_log_is_polled_on_a_timer_and_a_quiet_one_rearms_the_watch(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    with LogFollower(log, use_watchdog=True, poll_interval=30, busy_interval=0.01, coalesce=0) as follower:
        assert follower.armed
        append(log, b"x\n")
        assert follower.wait(timeout=10) is True  # woken by the write event
        assert texts(follower.poll()) == ["x"]
        append(log, b"y\n")
        assert follower.wait(timeout=10) is True  # one line is not a stream: still on events
        assert texts(follower.poll()) == ["y"]
        assert follower.wait(timeout=10) is False  # busy: the busy_interval timer, not an event
        assert not follower.armed  # no event per write while lines keep coming
        append(log, b"w\n")
        assert texts(follower.poll()) == ["w"]
        follower.wait(timeout=10)
        assert follower.poll() == []  # quiet again
        assert follower.wait(timeout=10) is True  # re-armed, and one more look for a write in between
        assert follower.armed
        append(log, b"z\n")
        assert follower.wait(timeout=10) is True
        assert texts(follower.poll()) == ["z"]


def test_close_from_another_thread_unblocks_wait(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    follower = LogFollower(log, poll_interval=60)
    closer = threading.Thread(target=follower.close)
    closer.start()
    assert follower.wait(timeout=60) is True  # not the 60 s interval
    closer.join()
    assert follower.poll() == []
    assert follower.status().up is False


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
def test_copytruncate_rewritten_with_an_identical_head_is_still_noticed(tmp_path: Path, restarted: bool) -> None:
    # A restarted server writes the same banner again: the first 512 bytes match, and the new
    # file regrows past our offset before we look. Only the bytes where we stand tell them apart.
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    banner = b"=" * 600 + b"\n"
    log.write_bytes(banner + b"a 1\n")
    follower = LogFollower(log, state_dir=state, from_start=True, use_watchdog=False)
    assert texts(follower.poll()) == ["=" * 600, "a 1"]
    follower.commit()
    append(log, b"a 2\n")
    if restarted:
        follower.close()
    rotate_copytruncate(log)
    append(log, banner + b"b 1\nb 2\n")
    if restarted:
        follower = LogFollower(log, state_dir=state, use_watchdog=False)
    assert texts(follower.poll()) == ["a 2", "=" * 600, "b 1", "b 2"]
    follower.close()


def test_restart_racing_a_rename_still_finds_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()
    follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=0)
    append(log, b"read\n")
    follower.poll()
    follower.commit()
    follower.close()
    append(log, b"unread old\n")
    stat_path = LogFollower._stat_path
    rotated: list[bool] = []

    def stat_then_rotate(self: LogFollower) -> os.stat_result | None:
        st = stat_path(self)
        if not rotated:  # the writer rotates right after the restore looked at the path
            rotate_rename(log)
            append(log, b"new\n")
            rotated.append(True)
        return st

    monkeypatch.setattr(LogFollower, "_stat_path", stat_then_rotate)
    follower = LogFollower(log, state_dir=state, use_watchdog=False, rotate_wait=0)
    assert texts(follower.poll()) == ["unread old", "new"]
    follower.close()


def test_lines_recovered_from_a_copy_at_restart_survive_a_second_crash(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()
    follower = LogFollower(log, state_dir=state, use_watchdog=False)
    append(log, b"read\n")
    follower.poll()
    follower.commit()
    follower.close()
    append(log, b"unread old\n")
    rotate_copytruncate(log)
    append(log, b"new\n")
    follower = LogFollower(log, state_dir=state, use_watchdog=False)
    assert texts(follower.poll()) == ["unread old", "new"]
    follower = restart(follower, log, state)  # killed before processing that batch
    assert texts(follower.poll()) == ["unread old", "new"]
    follower.close()


def test_copytruncate_between_the_check_and_the_read_is_caught_after_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    follower = LogFollower(log, use_watchdog=False, rotate_wait=0)
    append(log, b"old 1\n")
    assert texts(follower.poll()) == ["old 1"]
    append(log, b"old 2, unread\n")
    check = LogFollower._check_truncated
    done: list[bool] = []

    def check_then_rotate(self: LogFollower, cur: object, now: float) -> None:
        check(self, cur, now)  # type: ignore[arg-type]
        if not done:  # the follower stalls here while logrotate runs and the writer writes on
            rotate_copytruncate(log)
            append(log, b"new 1, long enough to regrow past the old offset\nnew 2\n")
            done.append(True)

    monkeypatch.setattr(LogFollower, "_check_truncated", check_then_rotate)
    assert texts(follower.poll()) == ["old 2, unread", "new 1, long enough to regrow past the old offset", "new 2"]
    follower.close()


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        ("InotifyEmitter.queue_events() called when the thread is inactive", False),
        ("Inotify queue overflowed; filesystem events were lost", True),
    ],
    ids=["unschedule_race_is_noise", "real_trouble_is_kept"],
)
def test_watchdog_noise_from_dropping_the_watch_is_filtered(tmp_path: Path, message: str, kept: bool) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    with LogFollower(log, use_watchdog=True):
        logger = logging.getLogger("watchdog.observers.inotify")
        record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, None, None)
        assert bool(logger.filter(record)) is kept


def test_a_big_backlog_comes_in_bounded_batches_without_waiting(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    line = b"INFO " + b"." * 1018 + b"\n"  # 1 KiB
    log.write_bytes(line * 9 * 1024)  # 9 MiB: more than one poll reads
    with LogFollower(log, use_watchdog=False, from_start=True, poll_interval=60) as follower:
        first = follower.poll()
        assert 0 < len(first) < 9 * 1024
        assert follower.wait(timeout=60) is True  # more is there: no interval to sit out
        second = follower.poll()
        assert len(first) + len(second) == 9 * 1024


def test_a_deleted_log_is_let_go_after_rotate_wait_and_reported_down(tmp_path: Path, follow: FollowerFactory) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    clock = Clock()
    follower = follow(log, rotate_wait=5.0, clock=clock)
    append(log, b"last words, no newline")
    log.unlink()
    assert follower.poll() == []
    assert (follower.status().up, follower.status().last_error) == (False, None)
    clock.now += 5.0
    assert texts(follower.poll()) == ["last words, no newline"]


def test_positions_that_cannot_be_saved_are_reported(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.touch()
    with LogFollower(log, state_dir=state, use_watchdog=False) as follower:
        shutil.rmtree(state)
        state.write_bytes(b"not a directory any more")
        append(log, b"x\n")
        follower.poll()
        follower.commit()
        error = follower.status().last_error
        assert error is not None
        assert error.startswith("cannot save log positions")
