"""A .gz's inflated pieces reach the worker processes as short-lived files (kvwatch.sources.spool).

The documents are the plain file's (tests/test_one_reading.py holds that for every real log);
these tests hold what the files must not do: outlive the read, fill the disk, or stop a read
where the temporary directory cannot be written.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.errors import UsageError
from kvwatch.sources import files, spool

SEED_LOG = Path(__file__).parent / "fixtures" / "vllm-cpu-seed" / "server.log"


def _document(path: Path, jobs: int) -> dict[str, Any]:
    doc = analyze_paths([str(path)], jobs=jobs)
    for entry in doc["inputs"]:
        entry.pop("path")
    return doc


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory kvwatch spools into, empty and watched; pieces of 1 KiB."""
    spool_root = tmp_path / "tmp"
    spool_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_root))
    monkeypatch.setattr(files, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    return spool_root


def _gz(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "server.log.gz"
    path.write_bytes(gzip.compress(data))
    return path


def test_a_spooled_gz_gives_the_plain_document_and_leaves_no_file(private_tmp: Path, tmp_path: Path) -> None:
    data = SEED_LOG.read_bytes()
    assert len(data) > 8 * 1024  # many pieces
    plain = tmp_path / "server.log"
    plain.write_bytes(data)
    assert _document(_gz(tmp_path, data), jobs=2) == _document(plain, jobs=1)
    assert list(private_tmp.iterdir()) == []


def test_a_truncated_spooled_gz_is_a_usage_error_and_leaves_no_file(private_tmp: Path, tmp_path: Path) -> None:
    whole = gzip.compress(SEED_LOG.read_bytes())
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(UsageError, match="truncated gzip"):
        analyze_paths([str(cut)], jobs=2)
    assert list(private_tmp.iterdir()) == []


def test_pieces_go_by_pipe_once_a_spool_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = [(b"a\nb\n", 0, 4), (b"xxc\n", 2, 4), (b"d\n", 0, 2)]
    real_open = open
    writes = 0

    def failing_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        nonlocal writes
        if "w" in mode:
            writes += 1
            if writes == 2:
                raise OSError(28, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    items = list(spool.spooled(iter(pieces), str(tmp_path)))
    monkeypatch.undo()
    assert isinstance(items[0], str)
    assert items[1:] == pieces[1:]  # the failed piece and the rest travel as themselves
    assert [spool.take(item) for item in items] == [(b"a\nb\n", 0, 4), *pieces[1:]]
    assert os.listdir(tmp_path) == []  # the spooled one was deleted once taken, the failed one never kept


def _readers() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "kvwatch-read-ahead"]


def test_a_gz_given_first_is_being_read_when_its_input_is_handed_out(private_tmp: Path, tmp_path: Path) -> None:
    # iter_logs starts the first input's reading (inflate, spool, submit) before yielding it, as the
    # plain files' ranges are sent before: analyze forks its workers and starts them before its imports.
    data = SEED_LOG.read_bytes()
    gz = _gz(tmp_path, data)
    logs = files.iter_logs([str(gz)], jobs=2)
    log = next(logs)
    assert log._started is not None
    assert _readers() == ["kvwatch-read-ahead"]
    records = [r for batch in log.batches() for r in batch]
    logs.close()
    serial = [r for batch in files.LogInput(str(gz), jobs=1).batches() for r in batch]
    assert records == serial
    assert len(records) > 50
    assert _readers() == []
    assert list(private_tmp.iterdir()) == []


def test_a_started_gz_left_unread_stops_its_reader_and_leaves_no_file(private_tmp: Path, tmp_path: Path) -> None:
    gz = _gz(tmp_path, SEED_LOG.read_bytes())
    logs = files.iter_logs([str(gz)], jobs=2)
    next(logs)
    assert _readers() == ["kvwatch-read-ahead"]
    logs.close()  # the caller left (an error before any batch): reader, workers and pieces go
    assert _readers() == []
    assert list(private_tmp.iterdir()) == []
