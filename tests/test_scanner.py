"""Which log scanner runs, and that the choice changes no document.

The compiled scanner (hyperscan) is used where it imports; ``KVWATCH_SCANNER=python`` or a
platform without its wheel gives the pure-Python one. ``kvwatch --version`` names the one in use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.sources import scanner

FIXTURES = Path(__file__).parent / "fixtures"
SEED_LOG = FIXTURES / "vllm-cpu-seed" / "server.log"
HAS_HYPERSCAN = scanner._compiled() is not None


@pytest.fixture
def without_hyperscan(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as if the hyperscan wheel were not installed (its import fails)."""
    monkeypatch.setitem(sys.modules, "hyperscan", None)  # `import hyperscan` raises ImportError
    scanner._compiled.cache_clear()
    yield
    monkeypatch.undo()
    scanner._compiled.cache_clear()


def test_the_version_names_the_scanner_in_use() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvwatch", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("kvwatch ")
    assert f"(log scanner: {scanner.name()};" in out
    forced = subprocess.run(
        [sys.executable, "-m", "kvwatch", "--version"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, scanner.ENV_VAR: "python"},
    ).stdout
    assert "(log scanner: python;" in forced


@pytest.mark.skipif(not HAS_HYPERSCAN, reason="hyperscan not installed here: the python path is the only one")
def test_the_compiled_scanner_is_used_where_it_imports() -> None:
    assert scanner.name().startswith("hyperscan ")


def test_without_hyperscan_the_pure_python_scanner_gives_the_same_document(without_hyperscan: None) -> None:
    assert scanner.name() == "python"
    fallback = analyze_paths([str(SEED_LOG)])
    scanner._compiled.cache_clear()
    sys.modules.pop("hyperscan", None)
    best = analyze_paths([str(SEED_LOG)])
    assert fallback == best
    assert fallback["stats"]["count"] > 0


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"no candidate here\n",
        b"KV cache usage: 1.0%",  # a last line without its newline
        b"x\nKV cache usage: 1.0%\r\n\n\nEngineDeadError at the end",
        b"throughput cache Cache twice on one line, throughput again\nplain\n",
        b"\n\n\nSIGTERM\n",
    ],
    ids=[
        "empty",
        "no-candidate",
        "no-final-newline",
        "crlf-and-blank-lines",
        "many-anchors-one-line",
        "leading-blanks",
    ],
)
def test_both_scanners_give_the_same_spans_at_the_edges(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(scanner.ENV_VAR, raising=False)
    best = scanner.line_spans(data)
    monkeypatch.setenv(scanner.ENV_VAR, "python")
    assert scanner.line_spans(data) == best
    for start, end in best.items():
        assert b"\n" not in data[start:end]


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty $XDG_CACHE_HOME, and a spy on where each engine's database came from."""
    if not HAS_HYPERSCAN:
        pytest.skip("hyperscan not installed here: nothing is compiled or kept")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    scanner._compiled.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    scanner._compiled.cache_clear()


class _Recording(scanner._Hyperscan):
    """_Hyperscan that records whether it compiled (no database given) or was given one."""

    compiled: ClassVar[list[bool]] = []

    def __init__(self, hyperscan: Any, anchors: tuple[bytes, ...], db: Any = None) -> None:
        _Recording.compiled.append(db is None)
        super().__init__(hyperscan, anchors, db)


def _kept() -> Path:
    import hyperscan

    return Path(scanner.cache_path(scanner.database_key(), hyperscan.__version__))


def test_the_compiled_database_is_kept_and_the_next_process_loads_it(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scanner, "_Hyperscan", _Recording)
    _Recording.compiled.clear()
    first = scanner._compiled()
    assert _kept().is_file()
    assert _kept().is_relative_to(fresh_cache / "kvwatch")
    scanner._compiled.cache_clear()  # the next process
    second = scanner._compiled()
    assert _Recording.compiled == [True, False]  # compiled once, then loaded
    assert first is not None
    assert second is not None
    data = SEED_LOG.read_bytes()
    spans: dict[int, int] = {}
    second.find(data, spans, 0, len(data))
    expected: dict[int, int] = {}
    first.find(data, expected, 0, len(data))
    assert spans == expected
    assert spans


def test_a_damaged_kept_database_is_compiled_again_and_replaced(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kept().parent.mkdir(parents=True)
    _kept().write_bytes(b"\x00not a hyperscan database")
    monkeypatch.setattr(scanner, "_Hyperscan", _Recording)
    _Recording.compiled.clear()
    assert scanner.name().startswith("hyperscan ")
    assert _Recording.compiled == [True]
    import hyperscan

    hyperscan.loadb(_kept().read_bytes(), hyperscan.HS_MODE_BLOCK)  # the replacement loads


def test_a_cache_that_cannot_be_written_is_no_error(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = fresh_cache / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # kvwatch/ cannot be made under a file
    scanner._compiled.cache_clear()
    assert scanner.name().startswith("hyperscan ")
    assert scanner.line_spans(b"GPU KV cache usage: 1.0%\n200 OK\n") == {0: 24}
