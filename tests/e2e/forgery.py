"""What the forgery end-to-end tests share: the recorded attack's server, kvwatch around it, its reading.

Both tests serve the tiny Llama with tests/fixtures/vllm-cpu-traceback's tokenizer and chat
template (structured outputs need a tokenizer, so no ``--skip-tokenizer-init``), send that
fixture's send.py requests, follow the log with ``kvwatch watch`` and read it with ``kvwatch
analyze`` once vLLM has stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvwatch.sources.tail import positions_file
from tests.helpers import KVWATCH

from . import server as harness
from .vllm_env import VllmEnv

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-traceback"
TOKENIZER_TIMEOUT = 300.0
ANALYZE_TIMEOUT = 300.0


def workdir(name: str, factory: pytest.TempPathFactory) -> Path:
    """A fresh work dir: under ``KVWATCH_E2E_OUT`` (kept) if set, else pytest's."""
    out = os.environ.get("KVWATCH_E2E_OUT")
    if not out:
        return factory.mktemp(f"e2e-{name}")
    path = Path(out) / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def build_tokenizer(env: VllmEnv, model_dir: Path, out_dir: Path) -> None:
    """The fixture's tiny byte-level BPE tokenizer beside a copy of ``model_dir``'s config."""
    result = subprocess.run(
        [str(env.python), str(FIXTURE / "make_tokenizer.py"), str(model_dir), str(out_dir)],
        env=harness.serve_env(None),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TOKENIZER_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"make_tokenizer.py failed:\n{result.stdout}\n{result.stderr}"


def server(env: VllmEnv, model_dir: Path, log: Path) -> harness.VllmServer:
    """The harness's recipe (its 32-block pool) with the fixture's chat template, tokenizer on.

    Compiled, as the harness's other servers, not ``--enforce-eager`` (which starts ~20 s sooner):
    on a CPU model 207 VM (AMX granted) vLLM 0.32.0's eager worker died with SIGILL (exit code -4,
    multiproc_executor.py "Worker proc VllmWorker-0 died unexpectedly") at its first forward pass,
    a plain 8-token completion, while the compiled one answered it ("hat89", as the fixture's run).
    """
    config = harness.ServeConfig(extra_args=("--chat-template", str(FIXTURE / "template.jinja")))
    vllm = harness.VllmServer(env.vllm_bin, model_dir, log, config=config, cache_dir=env.cache_dir)
    vllm.argv = [
        a for a in harness.serve_argv(env.vllm_bin, model_dir, vllm.port, config) if a != "--skip-tokenizer-init"
    ]
    return vllm


def watch_argv(log: Path, vllm: harness.VllmServer, model_dir: Path, kv_port: int, state_dir: Path) -> list[str]:
    """``kvwatch watch`` of ``log`` from its start, scraping ``vllm``, saving its position."""
    return [
        *KVWATCH, "watch", "--log", str(log), "--metrics-url", vllm.metrics_url,
        "--model-config", str(model_dir / "config.json"), "--listen", f"{harness.HOST}:{kv_port}",
        "--scrape-interval", "1", "--from-start", "--state-dir", str(state_dir),
    ]  # fmt: skip


def saved_position(state_dir: Path, log: Path) -> int:
    """The log offset the sidecar saved after applying its last batch (0 before its first commit)."""
    try:
        doc = json.loads(positions_file(state_dir, log).read_text())
    except (OSError, ValueError):
        return 0
    return max((int(f["offset"]) for f in doc.get("files", [])), default=0)


def analyze(path: Path, cwd: Path) -> dict[str, Any]:
    """``kvwatch analyze --format json`` of ``path``, run from ``cwd``."""
    result = subprocess.run(
        [*KVWATCH, "analyze", str(path), "--format", "json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=ANALYZE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"kvwatch analyze {path.name} failed: {result.stderr}"
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def keep_summary(workdir: Path, name: str, summary: dict[str, object]) -> None:
    """Write a run's summary beside its logs and print it (seen with ``pytest -s``)."""
    text = json.dumps(summary, indent=1)
    (workdir / f"scenario-{name}.json").write_text(text)
    print(f"\n[e2e {name}] {text}\nworkdir: {workdir}")
