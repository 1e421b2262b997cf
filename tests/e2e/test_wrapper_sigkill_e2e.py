"""Real vLLM (0.32.0, CPU) under ``kvwatch run``: kvwatch SIGKILLed -> vLLM and its EngineCore gone in 5 s.

The OOM killer does not ask: kvwatch gets SIGKILL, and a vLLM outside a container would keep the
GPU. PR_SET_PDEATHSIG takes the API server with kvwatch; the reaper signals the rest of its
process group (the EngineCore, a grandchild). Marked ``vllm``: about a minute to start.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from .server import (
    HOST,
    ServeConfig,
    as_busy_neighbour,
    free_port,
    pid_alive,
    serve_argv,
    serve_env,
    start_process,
    wait_for_http_ok,
)
from .vllm_env import VllmEnv

VLLM_READY_TIMEOUT = 240.0


@pytest.mark.vllm
def test_kvwatch_run_sigkilled_takes_real_vllm_and_its_engine_core_within_5_seconds(
    tmp_path: Path, vllm_env: VllmEnv, tiny_llama_dir: Path
) -> None:
    vllm_port, kv_port = free_port(), free_port()
    argv = [
        sys.executable, "-m", "kvwatch", "run", "--metrics-url", f"http://{HOST}:{vllm_port}/metrics",
        "--model-config", str(tiny_llama_dir / "config.json"), "--listen", f"{HOST}:{kv_port}", "--",
        *as_busy_neighbour(serve_argv(vllm_env.vllm_bin, tiny_llama_dir, vllm_port, ServeConfig())),
    ]  # fmt: skip
    kvwatch = start_process(
        "kvwatch run", argv, tmp_path / "kvwatch.out", env=serve_env(vllm_env.cache_dir),
        stderr_output=tmp_path / "kvwatch.err", busy_session=True,
    )  # fmt: skip
    tree: list[int] = []
    try:
        wait_for_http_ok(
            f"http://{HOST}:{vllm_port}/health", VLLM_READY_TIMEOUT, alive=lambda: kvwatch.popen.poll() is None
        )
        kvwatch.remember_tree()
        tree = [p for p in kvwatch.pids if p != kvwatch.popen.pid]
        names = {p: Path(f"/proc/{p}/comm").read_text().strip() for p in tree if pid_alive(p)}
        assert len(tree) >= 2, f"expected vLLM and its EngineCore under kvwatch, found {names}"
        kvwatch.popen.send_signal(signal.SIGKILL)
        kvwatch.popen.wait(10)
        killed_at = time.monotonic()
        while [p for p in tree if pid_alive(p)] and time.monotonic() - killed_at < 5.0:
            time.sleep(0.05)
        left = [p for p in tree if pid_alive(p)]
        print(f"\nvLLM tree {names}: gone {time.monotonic() - killed_at:.2f}s after kvwatch's SIGKILL")
        assert left == [], f"still running 5 s after kvwatch's SIGKILL: {left}"
    finally:
        for pid in tree:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
