"""`kvwatch analyze`'s levers carry the simulated outcome beside the static ceiling.

The seed run (tests/fixtures/vllm-cpu-seed: real vLLM 0.32.0, its log and 20 scrapes) is the
evidence; the outcome must be what `kvwatch simulate` gives on the same evidence, only where the
cause table names the KV pool, and the reason is said where the evidence does not allow it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.parse.metrics import parse_exposition
from kvwatch.parse.scrapeseries import scraped_at
from kvwatch.reconcile.simulate.levers import LOG_ONLY, from_history, from_scrapes
from tests.helpers import run

FIXTURES = Path(__file__).parent / "fixtures"
SEED = FIXTURES / "vllm-cpu-seed"
LOG = str(SEED / "server.log")
SCRAPES = sorted(str(p) for p in SEED.glob("metrics-*.prom"))


@pytest.fixture(scope="module")
def seed_doc() -> dict[str, Any]:
    return analyze_paths([LOG, *SCRAPES])


def _rebased_copies(tmp: Path) -> list[str]:
    """The scrapes with instants from the first (the simulator's origin in analyze and the sidecar)."""
    texts = [(scraped_at(Path(p).read_text()) or 0.0, Path(p).read_text()) for p in SCRAPES]
    texts.sort()
    t0 = texts[0][0]
    out = []
    for i, (t, text) in enumerate(texts):
        path = tmp / f"s-{i:02d}.prom"
        path.write_text(f"# scraped at t=+{t - t0!r}s\n" + text.split("\n", 1)[1])
        out.append(str(path))
    return out


def test_each_simulated_lever_is_what_simulate_gives_on_the_same_evidence(
    seed_doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["simulate", LOG, *_rebased_copies(tmp_path), "--format", "json"], capsys)
    assert code == 0, err
    scenarios = {s["name"]: s["result"] for s in json.loads(out)["scenarios"]}
    diag = seed_doc["diagnosis"]
    assert diag["cause"] == "kv_pool_too_small"
    observed = scenarios["observed"]
    assert diag["simulation"]["observed"] == {
        "mean_waiting": observed["mean_waiting"],
        "preemptions_per_100_requests": observed["preemptions_per_100_requests"],
        "e2e_p95_s": observed["e2e_s"]["p95"],
    }
    simulated = {r["lever"]: r for r in diag["levers"] if r["simulated"] is not None}
    assert "fp8_kv_cache" in simulated
    for name, row in simulated.items():
        want = scenarios[name]
        assert row["simulated"] == {
            "mean_waiting": want["mean_waiting"],
            "preemptions_per_100_requests": want["preemptions_per_100_requests"],
            "e2e_p95_s": want["e2e_s"]["p95"],
        }, name
        assert row["simulated_why_not"] is None
        assert row["max_concurrency"] is not None or name == "fewer_prompt_tokens"  # the ceiling stays beside it
    # fp8 doubles the ceiling but does not end the preemptions (admission by prompt): the simulated figure says so.
    fp8 = simulated["fp8_kv_cache"]["simulated"]
    assert 0 < fp8["preemptions_per_100_requests"] < diag["simulation"]["observed"]["preemptions_per_100_requests"]


def test_a_lever_simulate_cannot_size_says_why(seed_doc: dict[str, Any]) -> None:
    rows = {r["lever"]: r for r in seed_doc["diagnosis"]["levers"]}
    assert rows["int4_weights"]["simulated"] is None
    assert "weights" in rows["int4_weights"]["simulated_why_not"]
    assert "4,608" in rows["max_model_len_half"]["simulated_why_not"]  # vLLM would refuse every request


def test_a_log_alone_says_it_states_no_request_sizes() -> None:
    diag = analyze_paths([LOG])["diagnosis"]
    assert diag["simulation"] == {"observed": None, "why_not": LOG_ONLY, "max_load_s": 300.0, "seed": 0}
    assert all(r["simulated"] is None and r["simulated_why_not"] == LOG_ONLY for r in diag["levers"])


@pytest.mark.parametrize(
    "log",
    ["real-engine-dead-v011-fatal-error.log", "real-healthy-v0-tenstorrent-16-running.log"],
    ids=["engine-dead", "healthy"],
)
def test_no_simulation_when_the_cause_is_not_the_kv_pool(log: str) -> None:
    diag = analyze_paths([str(FIXTURES / "incidents" / log)])["diagnosis"]
    assert diag["levers"] == []
    assert diag["simulation"] is None


def test_text_and_markdown_show_the_outcome_beside_the_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, err = run(["analyze", LOG, *SCRAPES], capsys)
    assert code == 0, err
    fp8 = next(line for line in text.splitlines() if line.strip().startswith("- fp8_kv_cache"))
    assert "max concurrency 9.6 (2x)" in fp8  # 2 x 40,960 / 8,500: sized on the histograms (7,500 + 1,000)
    assert "simulated: 7.5 waiting, 10.0 preempted per 100 requests, e2e p95 97.3 s" in fp8
    assert "as observed: 11.2 waiting, 30.4 preempted per 100 requests" in text
    code, md, err = run(["analyze", LOG, *SCRAPES, "--format", "markdown"], capsys)
    assert code == 0, err
    assert "Simulated on the evidence" in md
    assert "simulated: 7.5 waiting" in md
    code, md, err = run(["analyze", LOG, "--format", "markdown"], capsys)
    assert "Not simulated: a log states no request sizes" in md


def test_scrapes_without_instants_say_so() -> None:
    scrapes = [(Path(p).read_text().split("\n", 1)[1], None, parse_exposition(Path(p).read_text())) for p in SCRAPES]
    evidence = from_scrapes(scrapes)
    assert evidence.points == ()
    assert evidence.why_not is not None
    assert "instants are unknown" in evidence.why_not


def test_history_of_one_engine_calibrates_and_of_two_says_why() -> None:
    samples = []
    for p in SCRAPES:
        text = Path(p).read_text()
        samples.append((1_800_000_000.0 + (scraped_at(text) or 0.0), parse_exposition(text).engines[0]))
    one = from_history([("0", samples)])
    assert one.why_not is None
    assert len(one.points) == len(SCRAPES)
    assert one.points[0].t == 0.0
    two = from_history([("0", samples), ("1", samples)])
    assert two.why_not is not None
    assert "2 engines" in two.why_not
