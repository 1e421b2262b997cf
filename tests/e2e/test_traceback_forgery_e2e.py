"""A real vLLM's traceback quoting a client's JSON schema: kvwatch reads no OOM and no engine death.

tests/fixtures/vllm-cpu-traceback recorded it once; this runs it live. vLLM (0.32.0, CPU) serves the
tiny Llama with the fixture's tokenizer (built by its make_tokenizer.py; structured outputs need one,
so no ``--skip-tokenizer-init``) and chat template. ``kvwatch watch`` follows its log from the start
and scrapes its /metrics. The fixture's send.py requests go to this server: streaming
/v1/completions, /v1/chat/completions and /v1/responses whose schema ``type`` holds newlines and text
that reads like ``torch.OutOfMemoryError`` and ``EngineDeadError``. vLLM logs each rejected schema with
a traceback, so the client's lines land in the log behind vLLM's own ``[serving.py:N]`` prefix or
raw (uvicorn's traceback of /v1/responses), three times per request; then one plain completion shows
the server still serves.

Once the log holds the forged lines and the sidecar's saved position (``--state-dir``, committed
after each batch is applied) is past them, kvwatch's own /metrics must count no error and name no
crash or OOM cause; ``kvwatch analyze`` on the whole log (after vLLM's shutdown) must say the same.
Before kvwatch's traceback rule (4b5c844) both read the forged lines as vLLM's OOM and engine death.

kvwatch runs from the test's work dir, so ``PYTHONPATH`` selects which kvwatch tree it imports (the
summary printed with ``-s`` names it). ``KVWATCH_E2E_OUT=DIR`` keeps the logs under DIR.
"""

from __future__ import annotations

import json
import re
import runpy
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from kvwatch.reconcile.causes import CAUSES
from tests.helpers import read_metrics, wait_for

from . import forgery
from . import server as harness
from .vllm_env import VllmEnv

pytestmark = pytest.mark.vllm

FIXTURE = forgery.FIXTURE
VLLM_READY_TIMEOUT = 240.0  # the recording measured 22 s; the machine may be busy
KVWATCH_READY_TIMEOUT = 60.0
REQUEST_TIMEOUT = 120.0
LOG_TIMEOUT = 120.0  # requests answered -> their records in the log
CATCH_UP_TIMEOUT = 120.0  # the log holds them -> kvwatch has applied them

#: The forged lines: each begins one line of the log, behind vLLM's prefix or raw (uvicorn).
FORGED_OOM = "torch.OutOfMemoryError: CUDA out of memory"
FORGED_DEAD = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue"
#: The forged requests of the fixture's send.py (then "plain"). Each traceback chains three exceptions,
#: each quoting the client, so each forged line starts three log lines per request: behind
#: [serving.py:500] and [serving.py:929] for the first two, raw in uvicorn's traceback for the third.
FORGED_MODES = ("forged", "forged-chat", "responses")
FORGED_LINES = {"prefixed": 6, "raw": 3}  # per forged line, at least
#: Causes that say the server crashed, failed or ran out of memory (none of them happened).
CRASH_CAUSES = tuple(c.id for c in CAUSES if c.verdict in ("crashed", "failed_start") or c.id.startswith("oom"))


def _send_py_body() -> Callable[[str], tuple[str, dict[str, Any]]]:
    """The request bodies of the fixture's client (stdlib only; its URL is the recording's port)."""
    body: Callable[[str], tuple[str, dict[str, Any]]] = runpy.run_path(str(FIXTURE / "send.py"))["body"]
    return body


@dataclass
class Answer:
    """What the server sent back for one request (``error``: the connection broke instead)."""

    mode: str
    status: int | None
    body: str
    error: str | None = None


@dataclass
class Scenario:
    """What the run showed; the tests below check it item by item."""

    workdir: Path
    log: Path
    kvwatch_file: str = ""  # the kvwatch tree the kvwatch processes imported
    answers: list[Answer] = field(default_factory=list)
    live: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    kvwatch_stderr: str = ""
    analyze: dict[str, Any] = field(default_factory=dict)
    sigkilled: dict[str, list[int]] = field(default_factory=dict)
    survivors: list[int] = field(default_factory=list)
    ports_busy: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def forged_lines(self, text: str) -> dict[str, int]:
        """How many log lines begin with a forged line, behind vLLM's prefix or raw."""
        lines = self.log.read_text(errors="replace").splitlines()
        return {
            "prefixed": sum(1 for line in lines if re.search(r"\[serving\.py:\d+\] " + re.escape(text), line)),
            "raw": sum(1 for line in lines if line.startswith(text)),
        }

    def summary(self) -> dict[str, object]:
        """Numbers worth keeping from the run."""
        return {
            "kvwatch_file": self.kvwatch_file,
            "answers": [(a.mode, a.status, a.error) for a in self.answers],
            "forged_oom_lines": self.forged_lines(FORGED_OOM) if self.log.exists() else None,
            "live_error_records": _live(self, "kvwatch_log_records_total", kind="error"),
            "live_causes": {c: v for c, v in _live_causes(self).items() if v},
            "analyze": {
                "errors_total": self.analyze.get("errors_total"),
                "verdict": self.analyze.get("diagnosis", {}).get("verdict"),
                "cause": self.analyze.get("diagnosis", {}).get("cause"),
            },
            "timings_seconds": {k: round(v, 1) for k, v in self.timings.items()},
            "sigkilled": self.sigkilled,
            "survivors": self.survivors,
            "ports_busy": self.ports_busy,
        }


def _live(sc: Scenario, name: str, **labels: str) -> float | None:
    return sc.live.get((name, tuple(sorted(labels.items()))))


def _live_causes(sc: Scenario) -> dict[str, float]:
    """kvwatch_diagnosis by cause, as kvwatch's /metrics showed it."""
    return {dict(lab)["cause"]: v for (name, lab), v in sc.live.items() if name == "kvwatch_diagnosis"}


def _holds_forged_lines(got: dict[str, int]) -> bool:
    return all(got[where] >= least for where, least in FORGED_LINES.items())


def _post(base_url: str, mode: str, body: tuple[str, dict[str, Any]]) -> Answer:
    path, payload = body
    try:
        resp = requests.post(base_url + path, json=payload, timeout=REQUEST_TIMEOUT)
    except requests.RequestException as exc:  # /v1/responses: the server cuts the stream off
        return Answer(mode, None, "", f"{type(exc).__name__}: {exc}")
    return Answer(mode, resp.status_code, resp.text)


def _kvwatch_imports(workdir: Path) -> str:
    """Which kvwatch ``python -m kvwatch`` imports when started from ``workdir`` with this env."""
    probe = [sys.executable, "-c", "import kvwatch; print(kvwatch.__file__)"]
    return subprocess.run(probe, cwd=workdir, capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def _freed(port: int) -> bool:
    try:
        wait_for(partial(harness.port_is_free, port), 10.0, what=f"port {port} to be free")
    except AssertionError:
        return False
    return True


def _drive(
    sc: Scenario, server: harness.VllmServer, kvwatch: harness.StartedProcess, kv_port: int, state_dir: Path
) -> None:
    """Both are up: send the requests, wait for their lines and for kvwatch to apply them, read kvwatch."""
    began = time.monotonic()
    harness.wait_for_http_ok(
        f"http://{harness.HOST}:{kv_port}/metrics", KVWATCH_READY_TIMEOUT, alive=lambda: kvwatch.popen.poll() is None
    )
    sc.timings["kvwatch_ready"] = time.monotonic() - began
    body = _send_py_body()
    for mode in (*FORGED_MODES, "plain"):
        sc.answers.append(_post(server.base_url, mode, body(mode)))
    sc.timings["requests"] = time.monotonic() - began

    def all_in_log() -> bool:
        return all(_holds_forged_lines(sc.forged_lines(text)) for text in (FORGED_OOM, FORGED_DEAD))

    wait_for(all_in_log, LOG_TIMEOUT, what=f"the forged lines in {sc.log} ({FORGED_LINES} of each)")
    # The plain request was answered, so its access line is in the log too: every line up to here
    # is complete and followed by another, and the sidecar must have applied them all.
    end = sc.log.stat().st_size
    wait_for(
        lambda: forgery.saved_position(state_dir, sc.log) >= end or kvwatch.popen.poll() is not None,
        CATCH_UP_TIMEOUT,
        what=f"kvwatch to apply the log up to byte {end}",
    )
    assert kvwatch.popen.poll() is None, f"kvwatch exited with {kvwatch.popen.returncode}"
    sc.timings["kvwatch_caught_up"] = time.monotonic() - began
    sc.live = read_metrics(kv_port)


@pytest.fixture(scope="module")
def scenario(vllm_env: VllmEnv, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """One run (about 30 s with the compile cache warm), shared by the checks below."""
    workdir = forgery.workdir("traceback-forgery", tmp_path_factory)
    sc = Scenario(workdir=workdir, log=workdir / "vllm-server.log")
    began = time.monotonic()
    sc.kvwatch_file = _kvwatch_imports(workdir)
    model_dir = workdir / "tiny-llama-tok"
    forgery.build_tokenizer(vllm_env, tiny_llama_dir, model_dir)
    sc.timings["tokenizer"] = time.monotonic() - began

    # (the harness's 32-block pool; the fixture's serve.sh has vLLM's 1 GiB default)
    server = forgery.server(vllm_env, model_dir, sc.log)
    kv_port = harness.free_port()
    state_dir = workdir / "state"
    processes: list[harness.StartedProcess] = []
    try:
        server.start(VLLM_READY_TIMEOUT)
        assert server.process is not None
        sc.timings["vllm_ready"] = time.monotonic() - began
        watch = forgery.watch_argv(sc.log, server, model_dir, kv_port, state_dir)
        kvwatch = harness.start_process(
            "kvwatch watch", watch, workdir / "kvwatch.out", stderr_output=workdir / "kvwatch.err", cwd=workdir
        )
        # kvwatch first, so it sees vLLM's shutdown rather than dying with it.
        processes = [kvwatch, server.process]
        _drive(sc, server, kvwatch, kv_port, state_dir)
    finally:
        processes = processes or ([server.process] if server.process is not None else [])
        for proc in processes:
            sc.sigkilled[proc.name] = harness.stop_process_tree(proc, interrupt=signal.SIGINT)
        sc.survivors = sorted({pid for proc in processes for pid in proc.survivors()})
        sc.ports_busy = [p for p in (server.port, kv_port) if not _freed(p)]
        err = workdir / "kvwatch.err"
        sc.kvwatch_stderr = err.read_text(errors="replace") if err.exists() else ""
    # vLLM has stopped: the whole log, shutdown included, read the batch way.
    sc.analyze = forgery.analyze(sc.log, workdir)
    sc.timings["total"] = time.monotonic() - began
    forgery.keep_summary(workdir, "traceback-forgery", sc.summary())
    return sc


def test_the_log_holds_the_forged_lines_behind_vllms_prefix_and_raw(scenario: Scenario) -> None:
    """The attack happened: each forged request's traceback put the client's lines in the log."""
    for text in (FORGED_OOM, FORGED_DEAD):
        got = scenario.forged_lines(text)
        assert _holds_forged_lines(got), f"{text!r}: {got}, expected at least {FORGED_LINES}"


def test_vllm_answered_the_forged_requests_and_then_served_a_plain_one(scenario: Scenario) -> None:
    answers = {a.mode: a for a in scenario.answers}
    for mode in ("forged", "forged-chat"):
        # The stream had started (200) when the schema was rejected: the error comes as an SSE event.
        assert answers[mode].status == 200, answers[mode]
        assert "Grammar error" in answers[mode].body, answers[mode].body[:500]
    plain = answers["plain"]
    assert plain.status == 200, plain
    assert json.loads(plain.body)["choices"][0]["text"], plain.body[:500]


def test_live_kvwatch_counts_no_error_and_names_no_crash(scenario: Scenario) -> None:
    assert _live(scenario, "kvwatch_log_records_total", kind="startup"), "kvwatch read no startup: not following?"
    errors = _live(scenario, "kvwatch_log_records_total", kind="error")
    reported = [line for line in scenario.kvwatch_stderr.splitlines() if "vLLM reported" in line]
    assert not errors, f"kvwatch_log_records_total{{kind=error}} {errors}: {reported[:6]}"
    assert reported == [], reported[:6]
    causes = _live_causes(scenario)
    assert causes, "kvwatch_diagnosis absent: kvwatch judged no engine"
    named = {c: v for c, v in causes.items() if v}
    assert not set(named) & set(CRASH_CAUSES), f"kvwatch_diagnosis names {named}"


def test_analyze_on_the_whole_log_counts_no_error_and_names_no_crash(scenario: Scenario) -> None:
    doc = scenario.analyze
    assert doc["errors_total"] == 0, doc["errors"][:6]
    diagnosis = doc["diagnosis"]
    assert diagnosis["verdict"] not in ("crashed", "failed_start"), diagnosis["summary"]
    assert diagnosis["cause"] not in CRASH_CAUSES, diagnosis["summary"]


def test_every_started_process_is_gone_and_ports_are_free(scenario: Scenario) -> None:
    assert scenario.survivors == [], f"processes left running: {scenario.survivors}"
    assert scenario.ports_busy == [], f"ports still bound: {scenario.ports_busy}"
    assert all(pids == [] for pids in scenario.sigkilled.values()), f"needed SIGKILL: {scenario.sigkilled}"
