"""Golden replay of the sidecar: real vLLM output in, the whole kvwatch /metrics exposition out.

The real seed run's log (tests/fixtures/vllm-cpu-seed/server.log) and its 20 recorded /metrics
scrapes go through the same parser, reconciler and collector as ``kvwatch watch``, on the log's
own clock, and the exposition is diffed against tests/golden/. Regenerate only on purpose:
``KVWATCH_UPDATE_GOLDEN=1 pytest tests/test_golden_exposition.py``. ``promtool check metrics``
must pass on it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.export.collector import StateCollector
from kvwatch.export.exposition import samples
from kvwatch.parse.log import LogParser
from kvwatch.parse.metrics import parse_exposition
from kvwatch.reconcile.architecture import resolve_model
from kvwatch.reconcile.live import LiveState
from kvwatch.settings import WatchSettings
from kvwatch.sidecar import expected_for
from kvwatch.sources.replay import line_seconds
from tests.conftest import require_binary

SEED = Path(__file__).parent / "fixtures" / "vllm-cpu-seed"
GOLDEN = Path(__file__).parent / "golden" / "watch-vllm-cpu-seed.prom"


def replay_seed() -> tuple[LiveState, float]:
    """Feed the seed log and, from the first stats record on, one recorded scrape every 10 s."""
    arch = resolve_model(str(SEED / "seedllama"))
    settings = WatchSettings()
    state = LiveState(expected=lambda facts: expected_for(arch, facts, settings), scrape_interval=10.0)
    scrapes = [*sorted(SEED.glob("metrics-[0-9]*.prom")), SEED / "metrics-final.prom"]
    parser = LogParser()
    now = 0.0
    next_scrape: float | None = None
    for line in (SEED / "server.log").read_text(errors="replace").splitlines():
        now = line_seconds(line) or now
        for record in parser.feed_line(line):
            state.on_log_record(record, now)
            if next_scrape is None and type(record).__name__ == "StatsRecord":
                next_scrape = now
        while next_scrape is not None and scrapes and next_scrape <= now:
            state.on_scrape(parse_exposition(scrapes.pop(0).read_text()), next_scrape)
            next_scrape += 10.0
    for record in parser.finish():
        state.on_log_record(record, now)
    return state, now


def exposition() -> bytes:
    state, now = replay_seed()
    registry = CollectorRegistry()
    registry.register(StateCollector(lambda t: samples(state, t), clock=lambda: now))
    return generate_latest(registry)


def test_exposition_matches_the_golden_file() -> None:
    text = exposition()
    if os.environ.get("KVWATCH_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_bytes(text)
    assert text.decode() == GOLDEN.read_text()


def test_promtool_check_metrics_passes_on_the_real_exposition() -> None:
    promtool = require_binary("promtool")
    proc = subprocess.run([promtool, "check", "metrics"], input=exposition(), capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()


def test_the_seed_story_reads_off_the_exposition() -> None:
    state, now = replay_seed()
    values = {(s.name, dict(s.labels).get("source") or dict(s.labels).get("basis") or dict(s.labels).get("check")):
              s.value for s in samples(state, now)}  # fmt: skip
    assert values[("kvwatch_kv_pool_tokens", "log")] == 40960
    assert values[("kvwatch_kv_pool_tokens", "metrics")] == 40960
    assert values[("kvwatch_kv_bytes_per_token", "config")] == 1024
    assert values[("kvwatch_kv_bytes_per_token", "observed")] == 1024  # 1 GiB / (32,768 computed blocks x 32)
    assert values[("kvwatch_preemptions_total", "metrics")] == 14  # vLLM's own counter at the end
    assert values[("kvwatch_reconcile_ratio", "bytes_per_token")] == 1.0
    assert 4.5 < values[("kvwatch_max_concurrency", "observed_p95")] < 5.0  # 40,960 / ~8,500
