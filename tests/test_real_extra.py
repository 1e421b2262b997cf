"""More real vLLM logs, beyond the shared contract set: each still meets its hand-read expectations.

tests/fixtures/real-extra holds logs that vLLM users pasted into public issues and PRs (provenance
in its README.md and index.json, same schema as tests/fixtures/real/index.json), chosen for what the
shared set lacks: V0 inside 0.8's bracket header, TorchServe and markdown-list wrappers, Ray's
``pid=N, ip=ADDR`` prefix, a command line behind environment assignments, the pre-OpenAI demo server,
an engine death followed by uvicorn's own "Shutting down", V1 scheduler preemption/resume lines. The
checks are ``tests.contract_rules.check_document`` run in process, as written and in every transport
form of tests/transport_forms.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from tests.contract_rules import check_document
from tests.transport_forms import FORMS, shipped

INDEX = Path(__file__).parent / "fixtures" / "real-extra" / "index.json"
ENTRIES: list[dict[str, Any]] = json.loads(INDEX.read_text())
IDS = [Path(e["file"]).stem for e in ENTRIES]


def _document(path: Path) -> Any:
    return json.loads(json.dumps(analyze_paths([str(path)])))


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_extra_real_log_meets_every_hand_read_expectation(entry: dict[str, Any]) -> None:
    assert check_document(entry, _document(INDEX.parent / entry["file"])) == []


# A command line the user typed above the log (233: "vllm serve ..."): no shipper writes it, so it stays
# as pasted while the server's lines around it take the form.
TYPED = re.compile(r"^(?:\$ |vllm |python3? -m |[A-Z_][A-Z0-9_]*=)")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_extra_real_log_meets_its_expectations_in_every_transport_form(
    entry: dict[str, Any], form: str, tmp_path: Path
) -> None:
    source = INDEX.parent / entry["file"]
    lines = source.read_text(encoding="utf-8").splitlines()
    if not any(TYPED.match(line) for line in lines):
        path = shipped(source, form, tmp_path / source.name)
    else:
        server = tmp_path / "server.log"
        server.write_text("".join(f"{line}\n" for line in lines if not TYPED.match(line)), encoding="utf-8")
        out = shipped(server, form, tmp_path / source.name).read_bytes().decode("utf-8").splitlines(keepends=True)
        newline = "\r\n" if out and out[0].endswith("\r\n") else "\n"
        rest = iter(out)
        path = tmp_path / f"with-command-{source.name}"
        path.write_text("".join(line + newline if TYPED.match(line) else next(rest, "") for line in lines), "utf-8")
    assert check_document(entry, _document(path)) == []


def test_every_extra_entry_has_provenance_and_uses_the_contract_schema() -> None:
    keys = {"file", "source_url", "vllm_version", "engine", "command", "expect", "notes"}
    for entry in ENTRIES:
        assert set(entry) == keys
        assert entry["source_url"].startswith(("https://github.com/", "https://discuss.vllm.ai/"))
        assert entry["command"] == "analyze"
        assert entry["expect"]
        assert (INDEX.parent / entry["file"]).is_file()
