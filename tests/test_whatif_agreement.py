"""`analyze`, `capacity --from-log` and the sidecar give one what-if per lever, on one stated basis.

The real seed run (tests/fixtures/vllm-cpu-seed: 20 users x 8,500 tokens on a 40,960-token pool)
replayed without /metrics: the request size is the log's, pool x KV usage / running at the last
stats record with requests running (kvwatch.reconcile.expectation.request_from_stats), and all
three call the same lever functions with it. Before, analyze used max_model_len (fp8 8.89), the
sidecar the observed request (11.66), and neither said which.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.cli import main
from kvwatch.export.exposition import samples
from kvwatch.parse.log import LogParser
from kvwatch.reconcile.architecture import resolve_model
from kvwatch.reconcile.levers import LEVERS
from kvwatch.reconcile.live import LiveState
from kvwatch.reconcile.pool import RequestShape
from kvwatch.settings import WatchSettings
from kvwatch.sidecar import expected_for

SEED = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu-seed"
LOG, CONFIG = SEED / "server.log", SEED / "seedllama" / "config.json"


def _sidecar_whatifs() -> dict[str, float]:
    arch = resolve_model(str(CONFIG))
    settings = WatchSettings()
    state = LiveState(expected=lambda facts: expected_for(arch, facts, settings))
    parser = LogParser()
    for n, line in enumerate(LOG.read_text(errors="replace").splitlines()):
        for record in parser.feed_line(line):
            state.on_log_record(record, float(n))
    for record in parser.finish():
        state.on_log_record(record, 0.0)
    return {dict(s.labels)["lever"]: s.value for s in samples(state, 0.0) if s.name == "kvwatch_whatif_max_concurrency"}


def _capacity_from_log(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    with pytest.raises(SystemExit) as info:
        main(["capacity", "--from-log", str(LOG), "--model-config", str(CONFIG), "--format", "json"])
    out = capsys.readouterr()
    assert info.value.code in (0, None), out.err
    doc: dict[str, object] = json.loads(out.out)
    return doc


def test_analyze_capacity_and_the_sidecar_agree_per_lever_on_one_basis(capsys: pytest.CaptureFixture[str]) -> None:
    analyzed = analyze_paths([str(LOG)], model=str(CONFIG))
    basis = analyzed["whatif_basis"]
    assert basis == {"prompt_tokens": basis["prompt_tokens"], "output_tokens": 0, "source": "log"}
    assert 8_000 <= basis["prompt_tokens"] <= 8_600  # the seed's 8,500-token requests, as the log sees them
    from_analyze = {r["lever"]: r for r in analyzed["diagnosis"]["levers"]}
    capacity = _capacity_from_log(capsys)
    from_capacity = {r["lever"]: r for r in capacity["levers"]}  # type: ignore[union-attr]
    sidecar = _sidecar_whatifs()

    sized = [lever for lever in LEVERS if from_analyze[lever]["max_concurrency"] is not None]
    assert {"fp8_kv_cache", "prefix_caching", "tensor_parallel_x2", "max_model_len_half"} <= set(sized)
    for lever in sized:
        a, c = from_analyze[lever], from_capacity[lever]
        assert a["basis"] == c["basis"] == "request", lever
        assert a["basis_request"] == c["basis_request"], lever
        assert a["basis_request"]["prompt_tokens"] == basis["prompt_tokens"]
        assert a["max_concurrency"] == c["max_concurrency"], lever
        assert sidecar[lever] == pytest.approx(a["max_concurrency"], abs=1e-4), lever
    assert set(sidecar) == set(sized)  # the sidecar exports exactly the levers the others size
    # and the postmortem says so in words
    assert capacity["request"]["source"] == "log"  # type: ignore[index]


def test_a_log_only_basis_cannot_size_the_prompt_lever() -> None:
    """The log gives one footprint, not a prompt/output split: cutting "the prompt" is unknowable."""
    analyzed = analyze_paths([str(LOG)], model=str(CONFIG))
    row = next(r for r in analyzed["diagnosis"]["levers"] if r["lever"] == "fewer_prompt_tokens")
    assert row["max_concurrency"] is None
    assert "prompt/output split" in row["note"]


def test_fewer_prompt_tokens_changes_only_the_prompt() -> None:
    from kvwatch.reconcile.levers import levers
    from kvwatch.reconcile.pool import Deployment, estimate

    arch = resolve_model(str(CONFIG))
    request = RequestShape(7_500, 1_000, source="flags")
    dep = Deployment(block_size=32, pool_tokens=40_960, max_model_len=9_216, request=request)
    row = next(r for r in levers(arch, dep) if r.lever == "fewer_prompt_tokens")
    # 40,960 tokens / (7,500 x 3/4 + 1,000 output) = 40,960 / 6,625: the output is not cut
    assert row.max_concurrency == pytest.approx(40_960 / 6_625)
    cut_everything = estimate(arch, Deployment(block_size=32, pool_tokens=40_960, request=RequestShape(6_375, 0)))
    assert row.max_concurrency != pytest.approx(cut_everything.max_concurrency)
