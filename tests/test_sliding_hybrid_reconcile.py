"""Sliding-window and hybrid servers reconcile to 1: the sidecar and `kvwatch capacity` share one model.

Real vLLM 0.32.0 starts (tests/fixtures/vllm-cpu-sliding-hybrid, truth in its README): Gemma 2
(1:1 sliding), Gemma 3 (5:1 sliding), gpt-oss (layer_types) and a Mamba2 + attention hybrid. The
log is replayed through the sidecar's own wiring (parser -> LiveState -> the expectation
``kvwatch.sidecar.expected_for`` builds), and one run goes through ``kvwatch watch --replay`` as a
user starts it. Before the capacity model was shared, the sidecar divided the printed
concurrency by one uniform group's figure and the ratios drifted from 1 on every one of these.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.export.exposition import samples
from kvwatch.parse.log import LogParser
from kvwatch.reconcile.architecture import resolve_model
from kvwatch.reconcile.live import Event, LiveState
from kvwatch.settings import WatchSettings
from kvwatch.sidecar import expected_for
from tests.e2e.server import free_port
from tests.helpers import value, wait_for

FIX = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu-sliding-hybrid"
# model folder, the block size vLLM used, what vLLM printed (tokens, concurrency at 4,096)
MODELS = [
    ("tiny-gemma2", 32, 1_169_635, 285.56),
    ("tiny-gemma3", 32, 1_832_323, 447.34),
    ("tiny-gptoss", 32, 1_801_580, 439.84),
    ("tiny-granite-hybrid", 544, 1_435_461, 350.45),
]
IDS = [m[0] for m in MODELS]


def _replay(name: str) -> tuple[LiveState, list[Event]]:
    arch = resolve_model(str(FIX / name / "config.json"))
    settings = WatchSettings()
    state = LiveState(expected=lambda facts: expected_for(arch, facts, settings))
    parser = LogParser()
    events: list[Event] = []
    for n, line in enumerate((FIX / name / "server.log").read_text(errors="replace").splitlines()):
        for record in parser.feed_line(line):
            events += state.on_log_record(record, float(n))
    for record in parser.finish():
        events += state.on_log_record(record, 0.0)
    return state, events


def _value(state: LiveState, name: str, **labels: str) -> float | None:
    for s in samples(state, 0.0):
        if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
            return s.value
    return None


@pytest.mark.parametrize(("name", "block", "tokens", "ratio"), MODELS, ids=IDS)
def test_the_sidecar_reconciles_a_real_sliding_or_hybrid_start_to_one(
    name: str, block: int, tokens: int, ratio: float
) -> None:
    state, events = _replay(name)
    for check in ("pool_tokens", "max_concurrency", "bytes_per_token"):
        value = _value(state, "kvwatch_reconcile_ratio", check=check)
        assert value == pytest.approx(1.0, rel=0.01), check
    assert _value(state, "kvwatch_kv_pool_tokens", source="log") == tokens
    assert [e.message for e in events if e.kind == "mismatch"] == []


@pytest.mark.parametrize(("name", "block", "tokens", "ratio"), MODELS, ids=IDS)
def test_the_sidecar_expects_what_kvwatch_capacity_prints(
    name: str, block: int, tokens: int, ratio: float, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["capacity", "--model-config", str(FIX / name / "config.json"), "--kv-cache-gib", "1"]
    args += ["--block-size", str(block), "--max-model-len", "4096", "--max-num-batched-tokens", "512"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--format", "json"])
    out = capsys.readouterr()
    assert info.value.code in (0, None), out.err
    doc = json.loads(out.out)
    state, _ = _replay(name)
    assert doc["pool"]["tokens"] == tokens  # kvwatch capacity predicts exactly what vLLM printed
    assert round(doc["max_concurrency_at_max_model_len"], 2) == ratio
    assert _value(state, "kvwatch_kv_pool_tokens", source="config") == doc["pool"]["tokens"]


@pytest.mark.parametrize(("name", "block", "tokens", "ratio"), MODELS, ids=IDS)
def test_capacity_from_log_finds_vllms_printed_pool_and_concurrency(
    name: str, block: int, tokens: int, ratio: float, capsys: pytest.CaptureFixture[str]
) -> None:
    log, config = FIX / name / "server.log", FIX / name / "config.json"
    with pytest.raises(SystemExit):
        main(["capacity", "--from-log", str(log), "--model-config", str(config), "--format", "json"])
    observed = json.loads(capsys.readouterr().out)["observed"]
    assert (observed["kv_cache_tokens"], observed["max_concurrency"]) == (tokens, ratio)
    assert observed["pool_within_one_block"] is True
    assert observed["max_concurrency_matches"] is True


def test_watch_replay_exports_ratios_of_one_and_logs_no_mismatch(tmp_path: Path) -> None:
    """The command itself, on the hybrid (the layout furthest from one uniform group)."""
    name = "tiny-granite-hybrid"
    port = free_port()
    err = tmp_path / "watch.err"
    cmd = [sys.executable, "-m", "kvwatch", "watch", "--replay", str(FIX / name / "server.log")]
    cmd += ["--model-config", str(FIX / name / "config.json"), "--speed", "1000", "--listen", f"127.0.0.1:{port}"]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr)
    checks = ("pool_tokens", "max_concurrency", "bytes_per_token")
    try:
        # The event: all three ratios exported (the startup block has been read and reconciled).
        wait_for(
            lambda: all(value(port, "kvwatch_reconcile_ratio", check=c) is not None for c in checks),
            what="the three reconcile ratios on /metrics",
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            text = response.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    ratios = dict(re.findall(r'kvwatch_reconcile_ratio\{check="(\w+)"[^}]*\} (\S+)', text))
    assert set(ratios) == set(checks)
    assert all(abs(float(v) - 1.0) <= 0.01 for v in ratios.values()), ratios
    assert "mismatch" not in err.read_text()
