"""More real vLLM /metrics scrapes, beyond the shared contract set: each meets its hand-read expectations.

tests/fixtures/real-extra-metrics holds expositions that vLLM users pasted into public issues and PRs
(provenance in its README.md and index.json, same schema as the ``snapshot`` entries of
tests/fixtures/real/index.json), chosen for what the shared set lacks: cache_config_info before the
engine gauges, counters with ``_created`` gauges and both prefix-cache names, a cache_config_info line
split by blank lines, label sets elided with ``...``, two model_names (LoRA) on one server, a
data-parallel engine 1, Ray's ``ray_vllm_`` (underscore) names. The checks are
``tests.contract_rules.check_document`` run in process, as written and in every paste form of
tests/transport_forms.py; these and the shared set's scrapes also in MORE_FORMS below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.contract_rules import ENTRIES as SHARED_ENTRIES
from tests.contract_rules import INDEX as SHARED_INDEX
from tests.contract_rules import check_document
from tests.transport_forms import SCRAPE_FORMS, pasted, snapshot_of

INDEX = Path(__file__).parent / "fixtures" / "real-extra-metrics" / "index.json"
ENTRIES: list[dict[str, Any]] = json.loads(INDEX.read_text())
IDS = [Path(e["file"]).stem for e in ENTRIES]


_document = snapshot_of


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
    source = INDEX.parent / entry["file"]
    path = pasted(source, SCRAPE_FORMS[form], tmp_path / source.name)
    assert check_document(entry, _document(path)) == []


def _hard_wrap(width: int) -> Callable[[str], str]:
    def wrap(text: str) -> str:
        return "".join(
            line[i : i + width] + "\n" for line in text.splitlines() for i in range(0, max(len(line), 1), width)
        )

    return wrap


# More ways a scrape reaches an issue, beyond SCRAPE_FORMS: a terminal's hard wrap (also inside a
# quote), a copy that doubles every line break, tabs or non-breaking spaces before the value,
# trailing spaces, a ```text fence, a collapsed <details> block, quotes escaped for JSON or HTML.
MORE_FORMS: dict[str, Callable[[str], str]] = {
    "hard-wrap-80": _hard_wrap(80),
    "quoted-hard-wrap-120": lambda text: "".join(f"> {line}\n" for line in _hard_wrap(120)(text).splitlines()),
    "double-spaced": lambda text: "\n\n".join(text.splitlines()) + "\n",
    "tab-before-value": lambda text: re.sub(r"\} ", "}\t", text),
    "nbsp-before-value": lambda text: text.replace("} ", "}\u00a0"),
    "trailing-spaces": lambda text: "".join(f"{line}   \n" for line in text.splitlines()),
    "text-fence": lambda text: f"```text\n{text}```\n",
    "details-block": lambda text: f"<details>\n<summary>/metrics</summary>\n\n```\n{text}```\n</details>\n",
    "json-escaped-quotes": lambda text: text.replace('"', '\\"'),
    "html-escaped-quotes": lambda text: text.replace('"', "&quot;"),
}
ALL_SCRAPES = [(INDEX.parent, e) for e in ENTRIES] + [
    (SHARED_INDEX.parent, e) for e in SHARED_ENTRIES if e["command"] == "snapshot"
]


@pytest.mark.parametrize("form", MORE_FORMS)
@pytest.mark.parametrize(("base", "entry"), ALL_SCRAPES, ids=[Path(e["file"]).stem for _b, e in ALL_SCRAPES])
def test_every_real_scrape_survives_more_paste_damage(
    base: Path, entry: dict[str, Any], form: str, tmp_path: Path
) -> None:
    source = base / entry["file"]
    path = pasted(source, MORE_FORMS[form], tmp_path / source.name)
    assert check_document(entry, _document(path)) == []
