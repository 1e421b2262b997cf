"""The positions file as untrusted, crash-prone state: corrupt, empty, symlinked, never fsync-less.

A corrupt or empty positions file means kvwatch was here before but does not know where: one
line in kvwatch's log, and the current file is read from its start (nothing lost). The temp file
is created O_EXCL|O_NOFOLLOW, so a symlink planted at its predictable name is never written
through; a symlink in place of the positions file itself is not read through either.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from kvwatch.sources.tail import LogFollower, positions_file


def texts(lines: list) -> list[str]:  # type: ignore[type-arg]
    return [line.text for line in lines]


@pytest.mark.parametrize(
    "content",
    [b"", b"   \n", b"{not json", b"\x00\x00\x00\x00", b'["a", "list"]', b'{"version": 1, "files": "x"}'],
    ids=["empty", "blank", "garbage", "zeros_after_power_loss", "not_an_object", "bad_shape"],
)
def test_corrupt_positions_are_logged_once_and_read_from_the_start_without_loss(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"written while kvwatch was down 1\nwritten while kvwatch was down 2\n")
    state.mkdir()
    positions_file(state, log).write_bytes(content)
    # Not --from-start: without positions the default would be the end of the file.
    with caplog.at_level(logging.INFO, logger="kvwatch"), LogFollower(log, state_dir=state, use_watchdog=False) as f:
        assert texts(f.poll()) == ["written while kvwatch was down 1", "written while kvwatch was down 2"]
        f.commit()
        f.commit()
        with log.open("ab") as fh:
            fh.write(b"new\n")
        assert texts(f.poll()) == ["new"]
        f.commit()
    ours = [r for r in caplog.records if r.name == "kvwatch"]
    assert len(ours) == 1, [r.getMessage() for r in ours]
    assert "positions file" in ours[0].getMessage()
    assert "from its start" in ours[0].getMessage()
    # And the file is whole again: a restart resumes after "new" without a word.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvwatch"), LogFollower(log, state_dir=state, use_watchdog=False) as f2:
        assert texts(f2.poll()) == []
    assert [r for r in caplog.records if r.name == "kvwatch"] == []


def test_a_symlink_planted_at_the_temp_name_is_not_followed(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"a\n")
    state.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    positions = positions_file(state, log)
    tmp = positions.with_name(positions.name + ".tmp")
    os.symlink(victim, tmp)
    with LogFollower(log, state_dir=state, use_watchdog=False, from_start=True) as follower:
        assert texts(follower.poll()) == ["a"]
        follower.commit()
    assert victim.read_bytes() == b"precious\n"
    assert not positions.is_symlink()
    assert positions.is_file()
    assert json.loads(positions.read_text())["files"][0]["offset"] == 2
    assert not os.path.lexists(tmp)


def test_a_symlink_in_place_of_the_positions_file_is_neither_read_nor_written_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"a\n")
    state.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"version": 1, "files": []}))
    positions = positions_file(state, log)
    os.symlink(victim, positions)
    with caplog.at_level(logging.INFO, logger="kvwatch"), LogFollower(log, state_dir=state, use_watchdog=False) as f:
        assert texts(f.poll()) == ["a"]  # unreadable -> from the start
        f.commit()
    assert json.loads(victim.read_text()) == {"version": 1, "files": []}
    assert not positions.is_symlink()
    assert len([r for r in caplog.records if r.name == "kvwatch"]) == 1


def test_positions_are_fsynced_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"a\n")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with LogFollower(log, state_dir=state, use_watchdog=False, from_start=True) as follower:
        calls.clear()
        follower.poll()
        follower.commit()
    assert calls == ["fsync", "replace", "fsync"]  # the data, the rename, the directory
    assert oct(state.stat().st_mode & 0o777) == "0o700"


def test_a_checkpoint_is_saved_with_the_positions_and_restored_with_them(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(b"a\nb\n")
    with LogFollower(log, state_dir=state, use_watchdog=False, from_start=True) as follower:
        assert follower.restored_checkpoint is None
        follower.poll()
        follower.checkpoint = {"preemptions_log": {"0": 7.0}}
        follower.commit()
    with LogFollower(log, state_dir=state, use_watchdog=False) as again:
        assert again.restored_checkpoint == {"preemptions_log": {"0": 7.0}}
        assert texts(again.poll()) == []
