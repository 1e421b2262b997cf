"""The e2e harness checked without vLLM, in seconds: load bounds, loopback-only traffic, process
cleanup, the vllm serve command line and the venv cache. These run in every ``pytest`` run, so a
broken harness shows before the slow real-vLLM run does."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from . import vllm_env
from .load import ClosedLoopLoad, LoadConfig, require_loopback
from .server import (
    VLLM_NICE,
    ServeConfig,
    as_busy_neighbour,
    free_port,
    port_is_free,
    serve_argv,
    serve_env,
    start_process,
    stop_process_tree,
    wait_for_http_ok,
)
from .test_vllm_e2e import Poll, _memory_bound_by_vllm_numbers


class FakeCompletions(BaseHTTPRequestHandler):
    """Answers POST /v1/completions like vLLM (status from the server's ``status`` attribute)."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        server.bodies.append(body)  # type: ignore[attr-defined]
        status = server.status  # type: ignore[attr-defined]
        payload = json.dumps({"usage": {"completion_tokens": body["max_tokens"]}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def fake_vllm() -> Iterator[ThreadingHTTPServer]:
    """A loopback HTTP server standing in for vLLM's completions endpoint."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeCompletions)
    server.bodies = []  # type: ignore[attr-defined]
    server.status = 200  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _base(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.5:8000", "http://example.com/v1", "https://0.0.0.0:8000", "http://[::1]:8000"],
    ids=["private-ip", "hostname", "any-address", "ipv6-loopback-not-used"],
)
def test_load_refuses_anything_but_127_0_0_1(url: str) -> None:
    with pytest.raises(ValueError, match=r"only talks to 127\.0\.0\.1"):
        require_loopback(url)
    with pytest.raises(ValueError, match=r"only talks to 127\.0\.0\.1"):
        ClosedLoopLoad(LoadConfig(base_url=url))


def test_load_stops_at_max_requests_and_sends_token_id_prompts(fake_vllm: ThreadingHTTPServer) -> None:
    config = LoadConfig(base_url=_base(fake_vllm), clients=3, max_requests=7, duration_seconds=60, max_tokens=5)
    load = ClosedLoopLoad(config)
    load.start()
    result = load.wait(timeout_seconds=20)
    assert (result.sent, result.ok, result.failures) == (7, 7, ())
    assert result.completion_tokens == 35
    bodies = fake_vllm.bodies  # type: ignore[attr-defined]
    assert len(bodies) == 7
    for body in bodies:
        (prompt,) = body["prompt"]
        assert len(prompt) == config.prompt_tokens
        assert all(isinstance(i, int) and 3 <= i <= 999 for i in prompt)
        assert body["ignore_eos"] is True
        assert body["max_tokens"] == 5
        assert body["model"] == "tiny-llama"


def test_load_sends_nothing_after_its_deadline(fake_vllm: ThreadingHTTPServer) -> None:
    """The time bound uses the injected clock: past the deadline no request starts."""
    now = [0.0]
    # One client: the fake clock is advanced by the request itself, so the count is exact.
    config = LoadConfig(base_url=_base(fake_vllm), clients=1, duration_seconds=10, max_requests=1000)
    load = ClosedLoopLoad(config, clock=lambda: now[0])
    original_take = load._take_ticket
    taken = [0]

    def take_and_advance() -> bool:
        ok = original_take()
        if ok:
            taken[0] += 1
            now[0] += 1.0  # every request "takes" one second of the fake clock
        return ok

    load._take_ticket = take_and_advance  # type: ignore[method-assign]
    load.start()
    result = load.wait(timeout_seconds=20)
    assert result.sent == taken[0]
    assert result.sent == 10  # tickets at t = 0, 1, ..., 9; none at t = 10


def test_load_counts_http_errors_as_failures(fake_vllm: ThreadingHTTPServer) -> None:
    fake_vllm.status = 500  # type: ignore[attr-defined]
    load = ClosedLoopLoad(LoadConfig(base_url=_base(fake_vllm), clients=2, max_requests=4))
    load.start()
    result = load.wait(timeout_seconds=20)
    assert result.ok == 0
    assert result.failures == ("HTTP 500",) * 4


def test_wait_for_http_ok_gives_up_as_soon_as_the_process_died() -> None:
    with pytest.raises(RuntimeError, match="exited before"):
        wait_for_http_ok(f"http://127.0.0.1:{free_port()}/health", 60, alive=lambda: False)


def test_wait_for_http_ok_returns_once_the_server_answers(fake_vllm: ThreadingHTTPServer) -> None:
    assert wait_for_http_ok(_base(fake_vllm) + "/health", 5) >= 0


# A child that ignores SIGINT and leaves a grandchild in a session of its own, like a badly
# behaved wrapper: only the harness's remembered pids / groups can still find the grandchild.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
print("ready", flush=True)
time.sleep(60)
"""
POLITE = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("ready", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    child.terminate(); child.wait()
"""


def _started(tmp_path: Path, code: str) -> object:
    proc = start_process("py", [sys.executable, "-c", code], tmp_path / "out.txt")
    for _ in range(100):  # up to 10 s for the interpreter to start and fork
        if "ready" in (tmp_path / "out.txt").read_text():
            break
        threading.Event().wait(0.1)
    proc.remember_tree()
    return proc


@pytest.mark.parametrize(
    ("code", "needs_kill"), [(POLITE, False), (STUBBORN, True)], ids=["exits-on-sigint", "ignores-sigint-and-setsid"]
)
def test_stop_process_tree_leaves_no_process_behind(tmp_path: Path, code: str, needs_kill: bool) -> None:
    proc = _started(tmp_path, code)
    assert len(proc.pids) == 2, proc.pids  # type: ignore[attr-defined]
    killed = stop_process_tree(proc, interrupt=signal.SIGINT, grace_seconds=1.0)  # type: ignore[arg-type]
    assert proc.survivors() == []  # type: ignore[attr-defined]
    assert bool(killed) is needs_kill


def test_ports_are_free_after_their_listener_stops() -> None:
    port = free_port()
    assert port_is_free(port)
    server = ThreadingHTTPServer(("127.0.0.1", port), FakeCompletions)
    try:
        assert not port_is_free(port)
    finally:
        server.server_close()
    assert port_is_free(port)


def test_free_ports_are_outside_the_kernels_ephemeral_range_and_never_repeat() -> None:
    """A port the kernel hands out to connect() or bind(0) can be taken between the pick and the
    child's bind (CI: Prometheus exited with "bind: address already in use")."""
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < low for port in ports), (low, high, ports)
    assert all(port_is_free(port) for port in ports)


def test_a_busy_neighbour_yields_the_cpu_inside_and_outside_its_session(tmp_path: Path) -> None:
    """vLLM leads a session of its own under the harness, or shares kvwatch's under ``kvwatch run``:
    its nice orders it inside the session, and the session's own weight (autogroup) against the
    harness's, where the kernel groups sessions."""
    code = "import time; print('ready', flush=True); time.sleep(30)"
    argv = as_busy_neighbour([sys.executable, "-c", code])
    proc = start_process("py", argv, tmp_path / "out.txt", busy_session=True)
    try:
        pid = proc.popen.pid
        assert os.getsid(pid) == pid  # a session of its own, as vLLM or kvwatch run has
        for _ in range(100):  # nice execs the interpreter: same pid, once it has started
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(sys.executable.encode()):
                break
            threading.Event().wait(0.1)
        assert os.getpriority(os.PRIO_PROCESS, pid) == VLLM_NICE
        autogroup = Path(f"/proc/{pid}/autogroup")
        if autogroup.exists():  # CONFIG_SCHED_AUTOGROUP: the session's own weight
            assert autogroup.read_text().split()[-1] == str(VLLM_NICE), autogroup.read_text()
            assert Path("/proc/self/autogroup").read_text() != autogroup.read_text()
    finally:
        stop_process_tree(proc, grace_seconds=1.0)


def test_serve_argv_is_the_fixture_recipe_on_loopback(tmp_path: Path) -> None:
    argv = serve_argv(Path("/v/bin/vllm"), tmp_path, 8123, ServeConfig())
    flags = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
    assert "--skip-tokenizer-init" in argv  # no tokenizer in tiny-llama: prompts are token ids
    assert argv[:3] == ["/v/bin/vllm", "serve", str(tmp_path)]
    assert flags["--host"] == "127.0.0.1"
    assert flags["--port"] == "8123"
    assert {k: flags[k] for k in ("--max-model-len", "--block-size", "--num-gpu-blocks-override")} == {
        "--max-model-len": "512",
        "--block-size": "32",
        "--num-gpu-blocks-override": "32",
    }
    assert (flags["--max-num-seqs"], flags["--max-num-batched-tokens"]) == ("8", "512")
    env = serve_env(tmp_path, base={})
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path)


def _fake_venv(venv: Path, complete: bool) -> None:
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("#!/bin/sh\n")
    if complete:
        vllm_env.marker(venv).touch()


def test_complete_cached_venv_is_reused_without_running_the_installer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    _fake_venv(venv, complete=True)
    monkeypatch.setattr(vllm_env, "INSTALL_SCRIPT", tmp_path / "must-not-run.sh")
    monkeypatch.setenv("KVWATCH_VLLM_CACHE", str(tmp_path / "cache"))
    env = vllm_env.ensure_vllm_env(venv)
    assert env.vllm_bin == venv / "bin" / "vllm"
    assert env.cache_dir.is_dir()


def test_failed_install_is_one_line_naming_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "venv"
    _fake_venv(venv, complete=False)  # half-built: no marker
    script = tmp_path / "install.sh"
    script.write_text("echo 'pip: no matching distribution' >&2; exit 3\n")
    monkeypatch.setattr(vllm_env, "INSTALL_SCRIPT", script)
    with pytest.raises(vllm_env.VllmEnvError) as info:
        vllm_env.ensure_vllm_env(venv, log_path=tmp_path / "install.log")
    message = str(info.value)
    assert "\n" not in message
    assert "exit 3" in message
    assert str(tmp_path / "install.log") in message
    assert "no matching distribution" in (tmp_path / "install.log").read_text()


def test_venv_location_follows_kvwatch_vllm_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVWATCH_VLLM_VENV", str(tmp_path / "elsewhere"))
    assert vllm_env.venv_path() == tmp_path / "elsewhere"
    monkeypatch.delenv("KVWATCH_VLLM_VENV")
    assert vllm_env.venv_path() == vllm_env.DEFAULT_VENV
    assert os.fspath(vllm_env.DEFAULT_VENV).startswith("/work/.cache")  # outside any clone of the repo


def _poll(t: float, waiting: float, kv: float) -> Poll:
    return Poll(t=t, memory_bound=(), state=None, vllm_waiting=waiting, vllm_kv_usage=kv)


@pytest.mark.parametrize(
    ("polls", "expected"),
    [
        ([_poll(0, 0, 0.95), _poll(10, 8, 0.71)], True),  # the peak and the queue in different looks
        ([_poll(0, 0, 0.95), _poll(70, 8, 0.71)], False),  # the peak is older than the window
        ([_poll(0, 8, 0.71), _poll(10, 0, 0.95)], False),  # a peak after the queue emptied
        ([_poll(0, 3, 0.90)], True),
    ],
    ids=["peak-then-queue", "peak-out-of-window", "peak-after-the-queue", "both-at-once"],
)
def test_vllm_precondition_judges_like_the_contract(polls: list[Poll], expected: bool) -> None:
    assert _memory_bound_by_vllm_numbers(polls) is expected
