"""More real vLLM /metrics scrapes, beyond the shared contract set: each meets its hand-read expectations.

tests/fixtures/real-extra-metrics holds expositions that vLLM users pasted into public issues and PRs
(provenance in its README.md and index.json, same schema as the ``snapshot`` entries of
tests/fixtures/real/index.json), chosen for what the shared set lacks: cache_config_info before the
engine gauges, counters with ``_created`` gauges and both prefix-cache names, a cache_config_info line
split by blank lines, label sets elided with ``...``, two model_names (LoRA) on one server, a
data-parallel engine 1, Ray's ``ray_vllm_`` (underscore) names. The checks are
``tests.test_contract.check_document`` run in process, as written and in every paste form of
tests/test_transport_forms.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.commands.snapshot import load, snapshot_document
from tests.test_contract import check_document
from tests.test_transport_forms import SCRAPE_FORMS

INDEX = Path(__file__).parent / "fixtures" / "real-extra-metrics" / "index.json"
ENTRIES: list[dict[str, Any]] = json.loads(INDEX.read_text())
IDS = [Path(e["file"]).stem for e in ENTRIES]


def _document(path: Path) -> Any:
    reading, origin = load(str(path))
    return json.loads(json.dumps(snapshot_document(reading, origin)))


def test_index_is_snapshot_entries_with_provenance() -> None:
    assert len(ENTRIES) >= 8
    for entry in ENTRIES:
        assert entry["command"] == "snapshot"
        assert entry["source_url"].startswith("https://github.com/")
        assert entry["expect"]
        assert entry["notes"]
        assert entry["vllm_version"]
        assert (INDEX.parent / entry["file"]).is_file()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_extra_real_scrape_meets_every_hand_read_expectation(entry: dict[str, Any]) -> None:
    assert check_document(entry, _document(INDEX.parent / entry["file"])) == []


@pytest.mark.parametrize("form", SCRAPE_FORMS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_extra_real_scrape_meets_its_expectations_however_it_was_pasted(
    entry: dict[str, Any], form: str, tmp_path: Path
) -> None:
    source = (INDEX.parent / entry["file"]).read_text(encoding="utf-8")
    path = tmp_path / Path(entry["file"]).name
    path.write_text(SCRAPE_FORMS[form](source), encoding="utf-8")
    assert check_document(entry, _document(path)) == []
