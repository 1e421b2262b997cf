"""The real-fixture contract: ../shared/tools/check_contract.py's rules over tests/fixtures/real/index.json.

Each entry names a real vLLM log or /metrics scrape (copied with its provenance, see
tests/fixtures/real/README.md), the kvwatch command to run and hand-read expectations. The rules
are the tool's, restated here so the suite runs from a clean clone: a float matches within 0.011
absolute or 0.1 % relative; an expected null means null or absent (never invented);
``errors.kinds_include: K`` means some error has ``kind == K``. Every check of every entry must pass
(the tool's 100 %). kvwatch runs as the installed console script, as a user would run it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.contract_rules import ENTRIES, failures_of


@pytest.mark.parametrize("entry", ENTRIES, ids=[Path(e["file"]).name for e in ENTRIES])
def test_real_fixture_meets_every_hand_read_expectation(entry: dict[str, Any]) -> None:
    assert failures_of(entry) == []


def test_index_covers_both_commands_and_many_versions() -> None:
    # The score means something only over a broad index: guard against it being trimmed.
    assert sum(e["command"] == "analyze" for e in ENTRIES) >= 30
    assert sum(len(e["expect"]) for e in ENTRIES) >= 300
