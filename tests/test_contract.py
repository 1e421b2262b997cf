"""The real-fixture contract: ../shared/tools/check_contract.py's rules over tests/fixtures/real/index.json.

Each entry names a real vLLM log or /metrics scrape (copied with its provenance, see
tests/fixtures/real/README.md), the kvwatch command to run and hand-read expectations. The rules
are the tool's, restated here so the suite runs from a clean clone: a float matches within 0.011
absolute or 0.1 % relative; an expected null means null or absent (never invented);
``errors.kinds_include: K`` means some error has ``kind == K``. Every check of every entry must pass
(the tool's 100 %). kvwatch runs as the installed console script, as a user would run it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

INDEX = Path(__file__).parent / "fixtures" / "real" / "index.json"
ENTRIES: list[dict[str, Any]] = json.loads(INDEX.read_text())
MISSING = object()


def kvwatch_command() -> list[str]:
    """The console script installed next to this interpreter, else ``python -m kvwatch``."""
    script = Path(sys.executable).with_name("kvwatch")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvwatch"]


def resolve(doc: Any, path: str) -> Any:
    """A dotted path into the JSON document (list indices are digits); MISSING when absent."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part, MISSING)
        elif isinstance(cur, list) and part.isdigit():
            i = int(part)
            cur = cur[i] if i < len(cur) else MISSING
        else:
            return MISSING
        if cur is MISSING:
            return MISSING
    return cur


def same(expected: Any, actual: Any) -> bool:
    """check_contract.py's comparison."""
    if expected is None:
        return actual is None or actual is MISSING
    if actual is MISSING or actual is None:
        return False
    if isinstance(expected, bool) or isinstance(actual, bool):
        return bool(expected == actual)
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return abs(expected - actual) <= max(0.011, abs(expected) * 1e-3)
    return bool(expected == actual)


def failures_of(entry: dict[str, Any]) -> list[str]:
    """The checks of one index entry that kvwatch gets wrong."""
    path = INDEX.parent / entry["file"]
    proc = subprocess.run(
        [*kvwatch_command(), entry["command"], "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # exit 1 (no vLLM lines) still prints the document; the checks decide
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return check_document(entry, json.loads(proc.stdout))


def check_document(entry: dict[str, Any], doc: Any) -> list[str]:
    """The checks of one index entry that the JSON document ``doc`` fails."""
    failed = []
    for key, expected in entry["expect"].items():
        if key == "errors.kinds_include":
            kinds = [e.get("kind") for e in doc.get("errors") or [] if isinstance(e, dict)]
            ok, actual = expected in kinds, kinds
        else:
            actual = resolve(doc, key)
            ok = same(expected, actual)
        if not ok:
            shown = "absent" if actual is MISSING else json.dumps(actual)
            failed.append(f"{key}: expected {json.dumps(expected)}, got {shown}")
    return failed


@pytest.mark.parametrize("entry", ENTRIES, ids=[Path(e["file"]).name for e in ENTRIES])
def test_real_fixture_meets_every_hand_read_expectation(entry: dict[str, Any]) -> None:
    assert failures_of(entry) == []


def test_index_covers_both_commands_and_many_versions() -> None:
    # The score means something only over a broad index: guard against it being trimmed.
    assert sum(e["command"] == "analyze" for e in ENTRIES) >= 30
    assert sum(len(e["expect"]) for e in ENTRIES) >= 300
