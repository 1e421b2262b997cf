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
