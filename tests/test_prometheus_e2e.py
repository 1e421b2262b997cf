"""A real Prometheus scrapes kvwatch replaying the real seed vLLM run: panels get data, alerts fire.

Three local servers on 127.0.0.1, all started and stopped here:

- a tiny HTTP server standing in for vLLM's /metrics: it serves the recorded
  tests/fixtures/vllm-cpu-seed/metrics-NN.prom in sequence, on the replay's clock;
- ``kvwatch watch --replay server.log --speed X`` scraping that server;
- ``prometheus`` (Debian's 2.42) scraping both every second with the rules loaded. The rules are
  generated from the same source as deploy/prometheus/kvwatch-rules.yaml with only the ``for``
  durations and the memory-bound window shortened (the replay runs X times faster than the real
  4-minute run).

Then every dashboard panel query must return data at some point of the replay, and
KvwatchMemoryBound and KvwatchPreemptionSpike must reach ``firing`` in /api/v1/alerts.
Bounded: the whole test gives up after DEADLINE_SECONDS and always stops every process (with
the real-vLLM harness's process-tree stop, tests/e2e/server.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import FIXTURES, ROOT, require_binary
from tests.e2e.server import (
    StartedProcess,
    free_port,
    start_process,
    start_prometheus,
    stop_process_tree,
)
from tests.generated_files import DASHBOARDS, GEN, queries
from tests.helpers import MetricsEndpoint

SEED = FIXTURES / "vllm-cpu-seed"
SPEED = 5.0  # the 264 s log replays in about 53 s; the memory-bound stretch (140 s) in 28 s
DEADLINE_SECONDS = 150.0
# The load (and metrics-00) started at 14:44:59 in the log, 33 s after its first timestamped line.
LOAD_START_LOG_SECONDS = 33.0
E2E_SETTINGS = {"memory_bound_for": "5s", "memory_bound_window": "10s", "preemption_for": "5s"}
MUST_FIRE = ("KvwatchMemoryBound", "KvwatchPreemptionSpike")


def recorded_scrapes() -> list[tuple[float, bytes]]:
    """(seconds since the log's start, exposition) for each recorded /metrics, in order."""
    scrapes = []
    for path in sorted(SEED.glob("metrics-*.prom")):
        text = path.read_bytes()
        header = re.match(rb"# scraped at t=\+([0-9.]+)s", text)
        assert header, path
        scrapes.append((LOAD_START_LOG_SECONDS + float(header.group(1)), text))
    return sorted(scrapes, key=lambda s: s[0])


def scrape_at(scrapes: list[tuple[float, bytes]], log_seconds: float) -> bytes:
    """The newest recorded scrape at ``log_seconds`` (the first one before the load started)."""
    current = scrapes[0][1]
    for at, text in scrapes:
        if at <= log_seconds:
            current = text
    return current


@pytest.mark.parametrize(
    ("log_seconds", "expected"),
    [(0.0, "metrics-00"), (33.0 + 10.1, "metrics-01"), (33.0 + 125.0, "metrics-12"), (400.0, "metrics-final")],
    ids=["before-load", "first-interval", "mid-load", "after-drain"],
)
def test_recorded_metrics_follow_the_replay_clock(log_seconds: float, expected: str) -> None:
    scrapes = recorded_scrapes()
    assert scrape_at(scrapes, log_seconds) == (SEED / f"{expected}.prom").read_bytes()


class RecordedVllm(MetricsEndpoint):
    """vLLM's /metrics as recorded, advancing at SPEED x the recorded pace from start()."""

    def __init__(self, speed: float) -> None:
        self.scrapes = recorded_scrapes()
        self.speed = speed
        self.started = time.monotonic()
        super().__init__(lambda: scrape_at(self.scrapes, (time.monotonic() - self.started) * self.speed))

    def start(self) -> None:
        """Serve from now on; the clock starts now."""
        self.started = time.monotonic()
        super().start()


@dataclass
class Observed:
    """What the test saw while polling Prometheus."""

    with_data: set[str] = field(default_factory=set)
    fired: set[str] = field(default_factory=set)
    last_empty: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, StartedProcess]]:
    """Recorded vLLM + kvwatch replay + Prometheus; yields Prometheus's base URL and kvwatch."""
    prometheus = require_binary("prometheus")
    kvwatch_port = free_port()
    rules = tmp_path / "rules.yaml"
    rules.write_text(GEN.rules_text(GEN.with_settings(**E2E_SETTINGS)), encoding="utf-8")
    vllm = RecordedVllm(SPEED)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "kvwatch", "static_configs": [{"targets": [f"127.0.0.1:{kvwatch_port}"],
                                                        "labels": {"pod": "seed-0"}}]},
            {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{vllm.port}"],
                                                     "labels": {"pod": "seed-0"}}]},
        ],
    }  # fmt: skip
    started: list[StartedProcess] = []
    try:
        prom, url = start_prometheus(prometheus, tmp_path, config)
        started.append(prom)
        vllm.start()
        kvwatch = start_process(
            "kvwatch",
            [
                str(ROOT / ".venv" / "bin" / "kvwatch"),
                "watch",
                f"--replay={SEED / 'server.log'}",
                f"--speed={SPEED}",
                f"--metrics-url=http://127.0.0.1:{vllm.port}/metrics",
                f"--model-config={SEED / 'seedllama' / 'config.json'}",
                f"--listen=127.0.0.1:{kvwatch_port}",
                "--scrape-interval=0.5",
            ],
            tmp_path / "kvwatch.log",
        )
        started.append(kvwatch)
        yield url, kvwatch
    finally:
        for proc in reversed(started):
            stop_process_tree(proc, grace_seconds=5)
        vllm.stop()


def panel_queries() -> dict[str, str]:
    """Every panel query of every dashboard as Grafana sends it (variables at All), by a readable id."""
    out = {}
    for name, dashboard in DASHBOARDS.items():
        for i, expr in enumerate(queries(dashboard)):
            out[f"{name}#{i}"] = GEN.as_promql(expr, rate_interval="30s")
    return out


def poll(url: str, queries: dict[str, str], observed: Observed, session: requests.Session) -> None:
    """One round: every query not yet seen with data, and the alerts."""
    for key, expr in queries.items():
        if key in observed.with_data:
            continue
        body = session.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert body["status"] == "success", (expr, body)
        if body["data"]["result"]:
            observed.with_data.add(key)
        else:
            observed.last_empty[key] = expr
    alerts = session.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    observed.fired |= {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}


@pytest.mark.prometheus
def test_real_prometheus_gets_data_for_every_panel_and_fires_memory_bound_and_preemption(
    stack: tuple[str, StartedProcess],
) -> None:
    url, kvwatch = stack
    queries = panel_queries()
    observed = Observed()
    session = requests.Session()
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        poll(url, queries, observed, session)
        if observed.with_data == set(queries) and set(MUST_FIRE) <= observed.fired:
            break
        if kvwatch.popen.poll() not in (None, 0):
            pytest.fail(f"kvwatch exited {kvwatch.popen.returncode}: {kvwatch.output_tail(30)}")
        time.sleep(1.0)
    missing = {k: observed.last_empty[k] for k in sorted(set(queries) - observed.with_data)}
    not_fired = sorted(set(MUST_FIRE) - observed.fired)
    assert not missing, f"panel queries that never returned data: {missing}; alerts not fired: {not_fired}"
    assert not not_fired, f"alerts that never reached firing: {not_fired}; fired: {sorted(observed.fired)}"
