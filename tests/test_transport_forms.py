"""The real fixtures still meet their hand-read expectations when shipped or pasted another way.

The same vLLM output reaches an operator through docker (``--timestamps``), kubectl (``--prefix``),
stern, journald, the kubelet's pod log files, a colour terminal, a console that hard-wraps at 80 or
120 columns, or a Windows editor. Each form below rewrites every real log of
tests/fixtures/real the way that tool would, and every expectation of its index entry must still
hold. The hidden logs kvwatch is checked against come through the same tools, so a reader that
only knows the forms the fixtures happen to use fails here first.

A terminal's hard wrap (fixture 026) happens after the shipper wrote its prefix, so a wrapped
record's continuation line is left as it is; in a file the shipper writes itself (docker's
json-file) there is no terminal, so the record is one line again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from tests.contract_rules import INDEX, check_document
from tests.transport_forms import FORMS, LOGS, SCRAPE_FORMS, SCRAPES, pasted, shipped, snapshot_of


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("entry", LOGS, ids=[Path(e["file"]).stem for e in LOGS])
def test_real_log_meets_its_expectations_in_every_transport_form(
    entry: dict[str, Any], form: str, tmp_path: Path
) -> None:
    path = shipped(INDEX.parent / entry["file"], form, tmp_path / Path(entry["file"]).name)
    doc = json.loads(json.dumps(analyze_paths([str(path)])))
    assert check_document(entry, doc) == []


# ------------------------------------------------------------------------------ /metrics pastes


@pytest.mark.parametrize("form", SCRAPE_FORMS)
@pytest.mark.parametrize("entry", SCRAPES, ids=[Path(e["file"]).stem for e in SCRAPES])
def test_real_scrape_meets_its_expectations_however_it_was_pasted(
    entry: dict[str, Any], form: str, tmp_path: Path
) -> None:
    source = INDEX.parent / entry["file"]
    path = pasted(source, SCRAPE_FORMS[form], tmp_path / source.name)
    assert check_document(entry, snapshot_of(path)) == []
