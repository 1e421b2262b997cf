"""``kvwatch watch`` as a process: follow + scrape + export, replay, restarts, faults, privacy.

Each test starts the real command on 127.0.0.1 and reads its /metrics with prometheus_client's
parser. Waits are bounded polls on the condition, never fixed sleeps.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.server import free_port
from tests.helpers import EVENT_CEILING_SECONDS, Kvwatch, value, wait_for

FIXTURES = Path(__file__).parent / "fixtures"
SEED = FIXTURES / "vllm-cpu-seed"
KVWATCH = [sys.executable, "-m", "kvwatch"]
CANARY = "CANARY-7f3a9c-do-not-leak"


class FakeVllm:
    """Serves a sequence of recorded /metrics scrapes; ``mode`` injects faults."""

    def __init__(self, scrapes: list[Path]) -> None:
        self.bodies = [p.read_bytes() for p in scrapes]
        self.index = 0
        self.mode = "ok"
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if fake.mode == "500":
                    self.send_response(500)
                    self.end_headers()
                    return
                if fake.mode == "slow":
                    time.sleep(1.5)
                body = fake.bodies[min(fake.index, len(fake.bodies) - 1)]
                if fake.mode == "garbage":
                    body = os.urandom(4096)
                if fake.mode == "truncated":
                    body = body[: len(body) // 3]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm([*sorted(SEED.glob("metrics-[0-9]*.prom")), SEED / "metrics-final.prom"])
    yield fake
    fake.close()


def test_follows_a_log_and_scrapes_metrics_into_reconciled_gauges(
    tmp_path: Path, kvwatch: Callable[..., Kvwatch], fake_vllm: FakeVllm
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    fake_vllm.index = 5  # 5 running, 15 waiting (capacity), KV 0.95
    k = kvwatch(
        "--log",
        str(log),
        "--metrics-url",
        fake_vllm.url,
        "--scrape-interval",
        "0.2",
        "--model-config",
        str(SEED / "seedllama" / "config.json"),
    )
    startup = [
        line for line in (SEED / "server.log").read_text().splitlines(keepends=True) if "Engine 000:" not in line
    ]
    with log.open("a") as f:
        f.writelines(startup[:60])
    wait_for(lambda: value(k.port, "kvwatch_kv_pool_tokens", source="log") == 40960, what="pool from the log")
    wait_for(lambda: value(k.port, "kvwatch_kv_pool_tokens", source="metrics") == 40960, what="pool from metrics")
    assert value(k.port, "kvwatch_kv_bytes_per_token", source="config") == 1024
    wait_for(lambda: value(k.port, "kvwatch_memory_bound") == 1, what="memory_bound under load")
    assert value(k.port, "kvwatch_observed_waiting_requests") == 15
    assert value(k.port, "kvwatch_source_up", source="metrics") == 1
    assert value(k.port, "kvwatch_source_up", source="log") == 1
    fake_vllm.index = len(fake_vllm.bodies) - 1  # after the drain: nothing waits
    wait_for(lambda: value(k.port, "kvwatch_memory_bound") == 0, what="memory_bound to clear after the drain")
    assert k.stop() == 0
    assert "-> memory_bound" in k.stderr


@pytest.mark.parametrize("mode", ["down", "500", "slow", "garbage", "truncated"])
def test_a_failing_metrics_endpoint_is_reported_and_never_stops_the_log(
    mode: str, tmp_path: Path, kvwatch: Callable[..., Kvwatch], fake_vllm: FakeVllm
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    url = fake_vllm.url
    if mode == "down":
        url = f"http://127.0.0.1:{free_port()}/metrics"
    else:
        fake_vllm.mode = mode
    k = kvwatch("--log", str(log), "--metrics-url", url, "--scrape-interval", "0.2", "--scrape-timeout", "0.5")
    wait_for(lambda: value(k.port, "kvwatch_source_up", source="metrics") == 0, what="metrics source down")
    with log.open("a") as f:
        f.write(_stats(running=4, waiting=16, kv=98.1))
    wait_for(lambda: value(k.port, "kvwatch_observed_waiting_requests") == 16, what="the log still read")
    if mode != "down":
        fake_vllm.mode = "ok"
        wait_for(lambda: value(k.port, "kvwatch_source_up", source="metrics") == 1, what="recovery")
        # The gauge is set before the line is written: wait for the line rather than race it.
        wait_for(lambda: "source metrics recovered" in k.stderr, what="the recovery line")
    assert k.stop() == 0
    assert "Traceback" not in k.stderr
    assert k.stderr.count("source metrics down") == 1  # one line per failure, not per scrape


def _stats(running: int, waiting: int, kv: float, prompt: str | None = None) -> str:
    line = (
        "(APIServer pid=7) INFO 11-29 14:45:07 [loggers.py:335] Engine 000: Avg prompt throughput: 2250.1 tokens/s, "
        f"Avg generation throughput: 0.6 tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
        f"CPU KV cache usage: {kv}%, Prefix cache hit rate: 0.0%\n"
    )
    if prompt:
        line = (
            f"(APIServer pid=7) INFO 11-29 14:45:07 [logger.py:43] Received request cmpl-1: prompt: '{prompt}', "
            "params: SamplingParams(n=1), prompt_token_ids: None.\n" + line
        )
    return line


def test_restart_with_a_state_dir_neither_loses_nor_doubles_records(
    tmp_path: Path, kvwatch: Callable[..., Kvwatch]
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("".join(_stats(i, 1, 50.0) for i in range(1, 6)))
    state = tmp_path / "state"
    first = kvwatch("--log", str(log), "--from-start", "--state-dir", str(state))
    wait_for(lambda: value(first.port, "kvwatch_log_records_total", kind="stats") == 5, what="5 records")
    assert first.stop() == 0
    with log.open("a") as f:  # written while kvwatch was down
        f.writelines(_stats(i, 1, 50.0) for i in range(6, 9))
    second = kvwatch("--log", str(log), "--from-start", "--state-dir", str(state))
    # The counter resumes from the value saved with the position: 5 before, plus only the 3 new.
    wait_for(lambda: value(second.port, "kvwatch_log_records_total", kind="stats") == 8, what="only the 3 new")
    assert value(second.port, "kvwatch_observed_running_requests") == 8
    assert second.stop() == 0


def test_replay_of_the_real_seed_log_goes_memory_bound_then_idle(kvwatch: Callable[..., Kvwatch]) -> None:
    k = kvwatch("--replay", str(SEED / "server.log"), "--speed", "50")
    wait_for(lambda: value(k.port, "kvwatch_log_records_total", kind="stats") == 21, what="21 records")
    assert value(k.port, "kvwatch_saturation_state", state="idle") == 1
    assert value(k.port, "kvwatch_kv_pool_tokens", source="log") == 40960
    assert value(k.port, "kvwatch_max_concurrency", basis="max_model_len") == pytest.approx(4.444, abs=1e-3)
    assert k.stop() == 0
    transitions = [line.split("): ", 1)[1].split(" (")[0] for line in k.stderr.splitlines() if " state: " in line]
    assert "queued -> memory_bound" in transitions
    assert transitions[-1].endswith("-> idle")


def test_a_prompt_in_the_log_never_reaches_metrics_or_kvwatchs_output(
    tmp_path: Path, kvwatch: Callable[..., Kvwatch]
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    k = kvwatch("--log", str(log))
    with log.open("a") as f:
        f.write(_stats(4, 16, 98.1, prompt=CANARY))
    wait_for(lambda: value(k.port, "kvwatch_observed_waiting_requests") == 16, what="the record")
    body = urllib.request.urlopen(f"http://127.0.0.1:{k.port}/metrics", timeout=EVENT_CEILING_SECONDS).read().decode()
    assert k.stop() == 0
    assert CANARY not in body
    assert CANARY not in k.stderr
    assert CANARY not in k.out_path.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nonsense"], "HOST:PORT"),
        ([], "nothing to watch"),
        (["--replay", "/nonexistent.log"], "no such file"),
        (["--model", "no-such-model-xyz", "--log", "/tmp/x.log"], "no-such-model-xyz"),
    ],
    ids=["bad-listen", "no-source", "missing-replay-file", "unknown-model"],
)
def test_bad_settings_are_one_line_errors_with_exit_2(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [*KVWATCH, "watch", *args], capture_output=True, text=True, timeout=EVENT_CEILING_SECONDS, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_settings_come_from_kvwatch_environment_variables(tmp_path: Path) -> None:
    env = {**os.environ, "KVWATCH_LISTEN": "not-a-listen-address"}
    proc = subprocess.run(
        [*KVWATCH, "watch", "--log", str(tmp_path / "x.log")],
        capture_output=True,
        text=True,
        timeout=EVENT_CEILING_SECONDS,
        env=env,
        check=False,
    )
    assert proc.returncode == 2
    assert "not-a-listen-address" in proc.stderr
    help_text = subprocess.run(
        [*KVWATCH, "watch", "--help"],
        capture_output=True,
        text=True,
        timeout=EVENT_CEILING_SECONDS,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    ).stdout
    for var in ("KVWATCH_LOG", "KVWATCH_METRICS_URL", "KVWATCH_MODEL_CONFIG", "KVWATCH_SCRAPE_INTERVAL"):
        assert var in help_text
