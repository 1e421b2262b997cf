"""``kvwatch run [watch options] -- CMD``: wrapper mode end to end with a stand-in for vLLM.

The child prints real vLLM lines (from the seed run's log) to stdout and stderr, waits until the
test has read kvwatch's /metrics, then exits with a code of its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.e2e.server import free_port
from tests.helpers import EVENT_CEILING_SECONDS, value, wait_for

SEED = Path(__file__).parent / "fixtures" / "vllm-cpu-seed"

CHILD = textwrap.dedent(
    """
    import pathlib, sys, time
    lines = pathlib.Path(sys.argv[1]).read_text(errors="replace").splitlines()
    startup = [l for l in lines if "Engine 000:" not in l][:60]
    stats = [l for l in lines if "Waiting: 15 reqs" in l][:1]
    for l in startup:
        print(l, flush=True)
    print("a line on stderr", file=sys.stderr, flush=True)
    for l in stats:
        print(l, flush=True)
    go = pathlib.Path(sys.argv[2])
    deadline = time.time() + 300  # the test touches it as soon as it has read /metrics
    while not go.exists() and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(3)
    """
)


def test_wrapper_mode_passes_output_through_exports_and_returns_the_childs_code(tmp_path: Path) -> None:
    child = tmp_path / "fake_vllm.py"
    child.write_text(CHILD)
    go = tmp_path / "go"
    port = free_port()
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvwatch", "run", "--listen", f"127.0.0.1:{port}",
             "--model-config", str(SEED / "seedllama"), "--",
             sys.executable, str(child), str(SEED / "server.log"), str(go)],
            stdout=o, stderr=e,
        )  # fmt: skip
        try:
            wait_for(lambda: value(port, "kvwatch_memory_bound") == 1, what="memory_bound from the child's output")
            assert value(port, "kvwatch_kv_pool_tokens", source="log") == 40960
            assert value(port, "kvwatch_kv_bytes_per_token", source="config") == 1024
            assert value(port, "kvwatch_kv_bytes_per_token", source="observed") == 1024
            go.touch()
            code = proc.wait(EVENT_CEILING_SECONDS)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(EVENT_CEILING_SECONDS)
    assert code == 3
    passed = out.read_text()
    assert "Waiting: 15 reqs" in passed  # stdout passed through unchanged
    assert "a line on stderr" in err.read_text()
    assert "Traceback" not in err.read_text()


def test_run_without_a_command_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "kvwatch", "run", "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=EVENT_CEILING_SECONDS, check=False)  # fmt: skip
    assert proc.returncode == 2
    assert "no command to run" in proc.stderr
