"""A real vLLM CPU server under load, scraped by a real Prometheus; then ``kvwatch analyze``
reads the same run four ways -- Prometheus history, the log with its first and last scrapes, the
log with a scrape every second saved as files, and vLLM's own counters read directly -- and they
must agree (the verdict where the evidence is equally dense).

vLLM runs with the e2e harness's tiny pool (32 blocks x 32 tokens: two 512-token requests fit,
twelve clients send, so it preempts constantly; tests/e2e/server.py ServeConfig). Prometheus
(Debian's) scrapes its /metrics every second. After the load drained, the test waits until
Prometheus holds vLLM's final counter (an event, not a sleep) before analyzing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import require_binary
from tests.helpers import run

from .load import ClosedLoopLoad, LoadConfig
from .server import (
    StartedProcess,
    VllmServer,
    start_prometheus,
    stop_process_tree,
)
from .vllm_env import VllmEnv

LOAD_SECONDS = 30.0
VLLM_READY_TIMEOUT = 300.0  # generous: the machine is shared
CATCH_UP_TIMEOUT = 60.0


@dataclass
class Run:
    """What the run left behind for the checks."""

    prometheus_url: str
    log: Path
    first_scrape: Path
    last_scrape: Path
    scrapes: tuple[Path, ...]  # first, every second of the load and drain (as Prometheus saw it), last
    final: dict[str, float]  # vLLM's own counters at the end, read directly


def _counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in (
            "vllm:num_preemptions_total",
            "vllm:request_prompt_tokens_sum",
            "vllm:request_prompt_tokens_count",
            "vllm:request_generation_tokens_sum",
            "vllm:request_generation_tokens_count",
        ):
            if line.startswith(name + "{"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture(scope="module")
def real_run(vllm_env: VllmEnv, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """vLLM + Prometheus + load; yields once Prometheus holds vLLM's final counters."""
    binary = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("vllm-prom")
    log = tmp / "vllm-server.log"
    server = VllmServer(vllm_env.vllm_bin, tiny_llama_dir, log, cache_dir=vllm_env.cache_dir)
    prom: StartedProcess | None = None
    try:
        server.start(VLLM_READY_TIMEOUT)
        metrics = server.metrics_url
        first = tmp / "scrape-first.prom"
        first.write_text(requests.get(metrics, timeout=10).text)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {"job_name": "vllm", "static_configs": [{"targets": [metrics.split("//")[1].split("/")[0]]}]}
            ],
        }
        prom, url = start_prometheus(binary, tmp, config)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while time.monotonic() < deadline and not _prom_value(url, "vllm:num_requests_running"):
            time.sleep(0.5)
        saved: list[Path] = [first]
        stop_saving = threading.Event()

        def save_scrapes() -> None:
            # The same evidence Prometheus gets, as files: one scrape a second, skipped when vLLM's
            # /metrics is slower than that under load (Prometheus' 1 s scrape_timeout skips it too).
            while not stop_saving.wait(1.0):
                try:
                    text = requests.get(metrics, timeout=5).text
                except requests.RequestException:
                    continue
                path = tmp / f"scrape-{len(saved):03d}.prom"
                path.write_text(text)
                saved.append(path)

        saver = threading.Thread(target=save_scrapes, name="save-scrapes", daemon=True)
        saver.start()
        load = ClosedLoopLoad(LoadConfig(base_url=server.base_url, duration_seconds=LOAD_SECONDS))
        load.start()  # it sends for LOAD_SECONDS, then lets the requests in flight finish
        end = time.monotonic() + LOAD_SECONDS + 120
        while load.in_flight_or_running() and time.monotonic() < end:
            time.sleep(1.0)
        load.stop()
        load.wait(timeout_seconds=120.0)
        stop_saving.set()
        saver.join(timeout=10)
        final_text = requests.get(metrics, timeout=10).text
        last = tmp / "scrape-last.prom"
        last.write_text(final_text)
        final = _counters(final_text)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        # Every counter the checks compare, not only the preemptions: the last request can finish
        # after the last preemption, one scrape later (seen: 92 of 93 requests in the history).
        while time.monotonic() < deadline and not all(_prom_holds(url, name, value) for name, value in final.items()):
            time.sleep(0.5)
        yield Run(url, log, first, last, (*saved, last), final)
    finally:
        if prom is not None:
            stop_process_tree(prom, grace_seconds=5)
        server.stop()


def _prom_holds(url: str, name: str, value: float) -> bool:
    """Whether Prometheus' latest sum of ``name`` is ``value``."""
    got = _prom_value(url, f"sum({name})")
    return bool(got) and float(got[0]["value"][1]) == value


def _prom_value(url: str, expr: str) -> list[dict[str, Any]]:
    try:
        body = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
    except (requests.RequestException, ValueError):
        return []
    result: list[dict[str, Any]] = body.get("data", {}).get("result", [])
    return result


def _analyze(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run(["analyze", "--format", "json", *argv], capsys)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


@pytest.mark.vllm
@pytest.mark.prometheus
def test_prometheus_history_of_a_real_vllm_equals_its_own_counters(
    real_run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    final = real_run.final
    assert final["vllm:num_preemptions_total"] > 0  # the tiny pool preempts: there is something to count
    prom = _analyze(["--prometheus", real_run.prometheus_url, "--since", "15m", "--selector", '{job="vllm"}'], capsys)
    ends = _analyze([str(real_run.log), str(real_run.first_scrape), str(real_run.last_scrape)], capsys)
    files = _analyze([str(real_run.log), *map(str, real_run.scrapes)], capsys)
    for doc in (prom, ends, files):
        # vLLM started inside the range with its counters at 0: the increase is the final value
        assert doc["preemptions"]["from_metrics"] == final["vllm:num_preemptions_total"]
        assert doc["requests"]["finished"] == final["vllm:request_prompt_tokens_count"]
        prompt_mean = final["vllm:request_prompt_tokens_sum"] / final["vllm:request_prompt_tokens_count"]
        gen_mean = final["vllm:request_generation_tokens_sum"] / final["vllm:request_generation_tokens_count"]
        assert doc["requests"]["prompt_tokens"]["mean"] == pytest.approx(prompt_mean, abs=0.05)
        assert doc["requests"]["generation_tokens"]["mean"] == pytest.approx(gen_mean, abs=0.05)
    # The verdict is judged on KV usage peaks inside the window: it can only agree where the
    # evidence is as dense. The log's stats lines (every 10 s) and two scrapes can miss a peak a
    # 1 s history shows, so the verdict is compared with the log and the same 1 s scrapes as files.
    assert prom["diagnosis"]["verdict"] == files["diagnosis"]["verdict"], (
        f"with only the first and last scrape: {ends['diagnosis']['verdict']}"
    )
