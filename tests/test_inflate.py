"""Which inflater reads a .gz log, and that the choice changes no document and no error.

ISA-L (python-isal) is used where it imports; ``KVWATCH_GZIP=zlib`` or a platform without its
wheel gives the standard library's gzip. ``kvwatch --version`` names the one in use.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.errors import UsageError
from kvwatch.sources import files, inflate

FIXTURES = Path(__file__).parent / "fixtures"
SEED_LOG = FIXTURES / "vllm-cpu-seed" / "server.log"
REAL_LOGS = sorted(p for d in ("real", "real-extra") for p in (FIXTURES / d / "logs").glob("*") if p.is_file())
HAS_ISAL = inflate._isal() is not None


@pytest.fixture
def without_isal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as if python-isal were not installed (its import fails)."""
    monkeypatch.setitem(sys.modules, "isal", None)  # `from isal import ...` raises ImportError
    inflate._isal.cache_clear()
    yield
    monkeypatch.undo()
    inflate._isal.cache_clear()


def _document(path: Path, jobs: int = 1) -> dict[str, Any]:
    doc = analyze_paths([str(path)], jobs=jobs)
    for entry in doc["inputs"]:
        entry.pop("path")
    return doc


def _both(path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int = 1) -> tuple[dict[str, Any], dict[str, Any]]:
    """The document read by the best inflater, then by zlib (KVWATCH_GZIP=zlib)."""
    best = _document(path, jobs)
    monkeypatch.setenv(inflate.ENV_VAR, "zlib")
    assert inflate.name().startswith("zlib ")
    forced = _document(path, jobs)
    monkeypatch.delenv(inflate.ENV_VAR)
    return best, forced


def test_the_version_names_the_inflater_in_use() -> None:
    run = [sys.executable, "-m", "kvwatch", "--version"]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert f"gzip: {inflate.name()})" in out
    forced = subprocess.run(
        run, capture_output=True, text=True, check=True, env={**os.environ, inflate.ENV_VAR: "zlib"}
    ).stdout
    assert f"gzip: zlib {__import__('zlib').ZLIB_RUNTIME_VERSION})" in forced


@pytest.mark.skipif(not HAS_ISAL, reason="python-isal has no wheel here: zlib is the only inflater")
def test_isal_is_used_where_it_imports(tmp_path: Path) -> None:
    assert inflate.name().startswith("isal ")
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(SEED_LOG.read_bytes()))
    with inflate.open_gzip(str(gz)) as fh:
        assert type(fh).__module__.startswith("isal")
        assert fh.read() == SEED_LOG.read_bytes()


@pytest.mark.parametrize("log", [*REAL_LOGS[::7], SEED_LOG], ids=lambda p: p.name)
def test_every_inflater_gives_the_plain_files_document(
    log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(log.read_bytes()))
    plain = tmp_path / "server.log"
    plain.write_bytes(log.read_bytes())
    best, forced = _both(gz, monkeypatch)
    assert best == forced == _document(plain)


def test_many_members_and_spooled_pieces_read_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # logrotate's compressed copies concatenated (`cat a.gz b.gz`): two gzip members, one stream;
    # cut into 1 KiB pieces scanned by two workers (the spooled path of a large .gz).
    data = SEED_LOG.read_bytes()
    half = data.index(b"\n", len(data) // 2) + 1
    gz = tmp_path / "rotated.log.gz"
    gz.write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    plain = tmp_path / "rotated.log"
    plain.write_bytes(data)
    monkeypatch.setattr(files, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    best, forced = _both(gz, monkeypatch, jobs=2)
    assert best == forced == _document(plain)
    assert best["stats"]["count"] > 0


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gz_is_the_same_one_line_error_for_every_inflater(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = gzip.compress(SEED_LOG.read_bytes())
    cut = tmp_path / "bad.log.gz"
    # corrupt: the deflate stream's bytes overwritten after the 10-byte header
    cut.write_bytes(whole[: len(whole) // 2] if damage == "truncated" else whole[:10] + b"\xff" * 64 + whole[74:])
    for forced in (False, True):
        if forced:
            monkeypatch.setenv(inflate.ENV_VAR, "zlib")
        with pytest.raises(UsageError, match=r"damaged or truncated gzip .*re-copy the file"):
            analyze_paths([str(cut)])


def test_without_isal_zlib_reads_the_same_document(without_isal: None, tmp_path: Path) -> None:
    assert inflate.name().startswith("zlib ")
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(SEED_LOG.read_bytes()))
    fallback = _document(gz)
    inflate._isal.cache_clear()
    sys.modules.pop("isal", None)
    assert fallback == _document(gz)
    assert fallback["stats"]["count"] > 0
