"""The sidecar's simulated what-ifs (kvwatch_whatif_waiting_requests, ..._preemptions_per_100_requests).

The seed run (tests/fixtures/vllm-cpu-seed: a real vLLM 0.32.0 CPU server, its log and scrapes)
is fed through the wiring as a live server would feed it: the log lines through the parser, each
scrape through the sidecar's own reader at its instant on a fake clock. The background recompute
is triggered by hand (``recompute_whatif_once``), so no test sleeps or times anything.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from kvwatch.errors import UnusableInput
from kvwatch.export.exposition import samples
from kvwatch.parse.log import LogParser
from kvwatch.parse.scrapeseries import scraped_at
from kvwatch.reconcile.facts import ServerFacts
from kvwatch.reconcile.live import LiveState
from kvwatch.reconcile.simulate.calibrate import EvidencePoint
from kvwatch.reconcile.simulate.whatif import WhatifOutcome
from kvwatch.sidecar import Sidecar, read_exposition_timed, whatif_outcomes
from kvwatch.sources.scrape import ScrapeResult
from tests.conftest import require_binary
from tests.helpers import run

SEED = Path(__file__).parent / "fixtures" / "vllm-cpu-seed"
BASE = 1_800_000_000.0  # a Unix time: the live clock is wall time, the files' instants are offsets
WAITING = "kvwatch_whatif_waiting_requests"
PREEMPT = "kvwatch_whatif_preemptions_per_100_requests"

WhatifFn = Callable[[ServerFacts, tuple[EvidencePoint, ...]], tuple[WhatifOutcome, ...]]


class Clock:
    """A fake wall clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeScraper:
    """Answers each scrape with the next saved exposition, read by the sidecar's own reader."""

    def __init__(self, texts: list[str], clock: Clock) -> None:
        self.texts = list(texts)
        self.clock = clock

    def scrape(self) -> ScrapeResult:
        text = self.texts.pop(0)
        return ScrapeResult(True, read_exposition_timed(text).snapshot, None, 0.001, self.clock(), 200, len(text), True)

    def next_delay(self) -> float:
        return 10.0


def _scrapes(names: list[str] | None = None) -> list[tuple[float, str]]:
    paths = [SEED / n for n in names] if names else list(SEED.glob("metrics-*.prom"))
    out = []
    for p in paths:
        text = p.read_text()
        at = scraped_at(text)
        assert at is not None
        out.append((at, text))
    return sorted(out)


def _live(scrapes: list[tuple[float, str]], whatif: WhatifFn | None = None, log: bool = True) -> tuple[Sidecar, Clock]:
    """A sidecar (no threads started) that has read the seed log and then ``scrapes`` at their instants."""
    clock = Clock(BASE)
    scraper = FakeScraper([text for _t, text in scrapes], clock)
    fn = whatif or (lambda facts, points: whatif_outcomes(facts, points, None))
    sidecar = Sidecar(
        LiveState(scrape_interval=10.0),
        parser=LogParser(),
        lines=None,
        scraper=scraper,  # type: ignore[arg-type]
        listen="127.0.0.1:0",
        clock=clock,
        whatif=fn,
    )
    if log:
        sidecar.feed_lines((SEED / "server.log").read_text().splitlines())
        sidecar.flush_parser()
    for t, _text in scrapes:
        clock.now = BASE + t
        sidecar.scrape_once()
    return sidecar, clock


def _gauges(sidecar: Sidecar, name: str) -> dict[str, float]:
    now = sidecar.clock()
    return {dict(s.labels)["lever"]: s.value for s in samples(sidecar.state, now) if s.name == name}


def _simulate_same_evidence(scrapes: list[tuple[float, str]], tmp: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """``kvwatch simulate`` on the evidence the sidecar saw: the same scrapes, timed from the first.

    A live server's load has no known start, so the sidecar's window starts at its first scrape;
    the copies state exactly those instants (the same float arithmetic, written round-trip).
    """
    t0 = BASE + scrapes[0][0]
    files = []
    for i, (t, text) in enumerate(scrapes):
        body = text.split("\n", 1)[1]
        path = tmp / f"scrape-{i:02d}.prom"
        path.write_text(f"# scraped at t=+{(BASE + t) - t0!r}s\n{body}")
        files.append(str(path))
    code, out, err = run(["simulate", str(SEED / "server.log"), *files, "--format", "json", "--seed", "0"], capsys)
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def seed_sidecar() -> Any:
    sidecar, _clock = _live(_scrapes())
    assert sidecar.recompute_whatif_once()
    yield sidecar
    sidecar.server.close()


def test_gauges_equal_what_simulate_gives_on_the_same_evidence(
    seed_sidecar: Sidecar, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _simulate_same_evidence(_scrapes(), tmp_path, capsys)
    expected = {s["name"]: s["result"] for s in doc["scenarios"] if s["result"] is not None}
    waiting, preempt = _gauges(seed_sidecar, WAITING), _gauges(seed_sidecar, PREEMPT)
    assert {"observed", "fp8_kv_cache"} <= set(waiting)
    assert set(waiting) == set(expected)  # every scenario simulate could simulate, and only those
    for lever, result in expected.items():
        assert waiting[lever] == result["mean_waiting"], lever
        assert preempt[lever] == result["preemptions_per_100_requests"], lever
    # The figures themselves (the seed run: 14 preemptions of 46 requests observed; fp8 halves them).
    assert preempt["fp8_kv_cache"] < preempt["observed"]
    assert waiting["fp8_kv_cache"] < waiting["observed"]


def test_gauges_are_per_engine_with_the_what_if_labels(seed_sidecar: Sidecar) -> None:
    now = seed_sidecar.clock()
    rows = [s for s in samples(seed_sidecar.state, now) if s.name in (WAITING, PREEMPT)]
    assert rows
    for s in rows:
        assert [k for k, _v in s.labels] == ["model_name", "engine", "lever"]
        assert dict(s.labels)["model_name"] == "llama-3.1-8b-sim"


def test_promtool_check_metrics_passes_with_the_what_ifs(seed_sidecar: Sidecar) -> None:
    promtool = require_binary("promtool")
    text = generate_latest(seed_sidecar.registry)
    assert WAITING.encode() in text
    assert PREEMPT.encode() in text
    assert b"kvwatch_whatif_errors_total 0.0" in text
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_recomputes_at_most_once_a_minute() -> None:
    calls: list[float] = []

    def counting(facts: ServerFacts, points: tuple[EvidencePoint, ...]) -> tuple[WhatifOutcome, ...]:
        calls.append(points[-1].t)
        return (WhatifOutcome("observed", 1.0, 2.0),)

    sidecar, clock = _live(_scrapes(["metrics-01.prom", "metrics-02.prom"]), counting, log=False)
    try:
        assert sidecar.recompute_whatif_once()
        clock.now += 59.0
        assert not sidecar.recompute_whatif_once()
        clock.now += 1.0
        assert sidecar.recompute_whatif_once()
        assert len(calls) == 2
    finally:
        sidecar.server.close()


def test_a_costly_recompute_stretches_the_interval_to_keep_the_cpu_budget() -> None:
    cpu = Clock(0.0)

    def costly(facts: ServerFacts, points: tuple[EvidencePoint, ...]) -> tuple[WhatifOutcome, ...]:
        cpu.now += 6.0  # six CPU seconds: at 5 % of a core the next may run 120 s later
        return ()

    sidecar, clock = _live(_scrapes(["metrics-01.prom", "metrics-02.prom"]), costly, log=False)
    sidecar.cpu_clock = cpu
    try:
        assert sidecar.recompute_whatif_once()
        assert sidecar.whatif_cpu_seconds == 6.0
        clock.now += 119.0
        assert not sidecar.recompute_whatif_once()
        clock.now += 1.0
        assert sidecar.recompute_whatif_once()
    finally:
        sidecar.server.close()


def test_the_recompute_runs_without_the_state_lock() -> None:
    held: list[bool] = []

    def probe(facts: ServerFacts, points: tuple[EvidencePoint, ...]) -> tuple[WhatifOutcome, ...]:
        held.append(sidecar.lock.locked())
        return ()

    sidecar, _clock = _live(_scrapes(["metrics-01.prom", "metrics-02.prom"]), probe, log=False)
    try:
        sidecar.recompute_whatif_once()
        assert held == [False]  # a scrape or the log thread is never waiting on a simulation
    finally:
        sidecar.server.close()


@pytest.mark.parametrize(
    ("names", "log"),
    [
        ([], True),
        (["metrics-05.prom"], True),
        (["metrics-00.prom", "metrics-01.prom"], True),  # no request finished yet: no sizes
    ],
    ids=["no-scrapes", "one-scrape", "nothing-finished"],
)
def test_bad_or_missing_evidence_leaves_the_gauges_absent_never_zero(names: list[str], log: bool) -> None:
    sidecar, _clock = _live(_scrapes(names) if names else [], log=log)
    try:
        assert sidecar.recompute_whatif_once()
        assert _gauges(sidecar, WAITING) == {}
        assert _gauges(sidecar, PREEMPT) == {}
        assert sidecar.state.whatif_errors == 0.0  # missing evidence is not an error
    finally:
        sidecar.server.close()


def test_scrapes_read_without_the_timing_counters_give_no_what_ifs() -> None:
    # Only the sidecar's reader times the run; a snapshot without timing is no simulator evidence.
    from kvwatch.parse.metrics import parse_exposition

    state = LiveState(scrape_interval=10.0)
    for t, text in _scrapes():
        state.on_scrape(parse_exposition(text), BASE + t)
    assert all(len(points) == 0 for _e, _f, points in state.whatif_inputs())


def test_without_a_log_the_pool_comes_from_cache_config_info_as_simulate_reads_it() -> None:
    sidecar, _clock = _live(_scrapes(), log=False)
    try:
        assert sidecar.recompute_whatif_once()
        assert "observed" in _gauges(sidecar, WAITING)
    finally:
        sidecar.server.close()


def test_an_exception_is_one_line_and_counted_and_the_next_recompute_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers: list[Any] = [RuntimeError("boom"), (WhatifOutcome("observed", 3.0, None),)]

    def flaky(facts: ServerFacts, points: tuple[EvidencePoint, ...]) -> tuple[WhatifOutcome, ...]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return tuple(answer)

    sidecar, clock = _live(_scrapes(["metrics-01.prom", "metrics-02.prom"]), flaky, log=False)
    try:
        with caplog.at_level(logging.WARNING, logger="kvwatch"):
            assert sidecar.recompute_whatif_once()
        lines = [r.getMessage() for r in caplog.records if "whatif" in r.getMessage()]
        assert len(lines) == 1
        assert "RuntimeError: boom" in lines[0]
        assert sidecar.state.whatif_errors == 1.0
        assert _gauges(sidecar, WAITING) == {}
        clock.now += 60.0
        assert sidecar.recompute_whatif_once()
        assert _gauges(sidecar, WAITING) == {"observed": 3.0}
        assert _gauges(sidecar, PREEMPT) == {}  # no preemption rate known: absent, not 0
    finally:
        sidecar.server.close()


def test_a_stale_outcome_is_dropped_when_the_window_stops_calibrating() -> None:
    answers: list[Any] = [(WhatifOutcome("observed", 3.0, 1.0),), UnusableInput("the scrapes show no finished request")]

    def fn(facts: ServerFacts, points: tuple[EvidencePoint, ...]) -> tuple[WhatifOutcome, ...]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return tuple(answer)

    sidecar, clock = _live(_scrapes(["metrics-01.prom", "metrics-02.prom"]), fn, log=False)
    try:
        sidecar.recompute_whatif_once()
        assert _gauges(sidecar, WAITING) == {"observed": 3.0}
        clock.now += 60.0
        sidecar.recompute_whatif_once()
        assert _gauges(sidecar, WAITING) == {}
        assert sidecar.state.whatif_errors == 0.0
    finally:
        sidecar.server.close()
