"""../shared/tools/check_contract.py's rules, restated so the suite runs from a clean clone.

A float matches within 0.011 absolute or 0.1 % relative; an expected null means null or absent
(never invented); ``errors.kinds_include: K`` means some error has ``kind == K``. Shared by the
contract, transport-form and real-extra tests (test modules never import each other).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
