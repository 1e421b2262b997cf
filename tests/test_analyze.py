"""`kvwatch analyze`: the kvwatch.analyze/1 document, reports, inputs, bad input and privacy.

Runs the real command line in-process (``kvwatch.cli.main``). Golden documents for the real vLLM
CPU runs live in tests/golden/ and are rewritten only with ``KVWATCH_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from tests.helpers import run

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
CPU_LOG = FIXTURES / "vllm-cpu" / "server.log"
SEED_LOG = FIXTURES / "vllm-cpu-seed" / "server.log"
DP_LOG = FIXTURES / "synthetic-dp-two-engines.log"
CANARY_LOG = FIXTURES / "synthetic-canary-prompt.log"
CANARY = "CANARY-prompt-9c1e"

TOP_KEYS = {
    "schema",
    "inputs",
    "runs",
    "stats",
    "preemptions",
    "capacity",
    "config",
    "errors",
    "saturation",
    "diagnosis",
}
LAST_KEYS = {
    "engine", "running", "waiting", "swapped", "deferred", "preemptions", "kv_usage_pct", "cpu_kv_usage_pct",
    "prefix_hit_pct", "external_prefix_hit_pct", "prompt_tps", "gen_tps",
}  # fmt: skip
CAPACITY_KEYS = {
    "device", "gpu_blocks", "cpu_blocks", "block_size", "kv_cache_tokens", "kv_cache_memory_gib", "weights_gib",
    "max_concurrency",
}  # fmt: skip
CONFIG_KEYS = {
    "vllm_version", "model", "served_model_name", "dtype", "kv_cache_dtype", "max_seq_len", "block_size",
    "gpu_memory_utilization", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
    "enable_prefix_caching", "quantization", "max_num_seqs", "max_num_batched_tokens",
}  # fmt: skip


def analyze_json(path: Path | str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run(["analyze", "--format", "json", str(path)], capsys)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


# ---- the document ------------------------------------------------------------------------------


def test_document_has_every_contract_key(capsys: pytest.CaptureFixture[str]) -> None:
    doc = analyze_json(SEED_LOG, capsys)
    assert doc.keys() >= TOP_KEYS
    assert doc["schema"] == "kvwatch.analyze/1"
    assert doc["stats"]["last"].keys() >= LAST_KEYS
    assert set(doc["stats"]["max"]) >= {"running", "waiting", "kv_usage_pct"}
    assert doc["capacity"].keys() >= CAPACITY_KEYS
    assert doc["config"].keys() >= CONFIG_KEYS
    assert set(doc["saturation"]) >= {"memory_bound_seconds", "memory_bound_records", "episodes"}
    assert set(doc["diagnosis"]) >= {"verdict", "summary", "levers"}
    assert doc["inputs"] == [{"path": str(SEED_LOG), "lines": 231, "bytes": SEED_LOG.stat().st_size}]


def test_seed_run_is_diagnosed_memory_bound_with_the_pool_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    doc = analyze_json(SEED_LOG, capsys)
    diag = doc["diagnosis"]
    assert diag["verdict"] == "memory_bound"
    # The episode's peak and mean queue, read by hand from records 4-18 (the memory-bound ones):
    # waiting 15,14,15,14,16,15,16,15,16,13,13,8,8,4,3 -> peak 16, mean 185/15 = 12.3; not the
    # 15 of the one record at the KV peak. The 100 % record: 5 running -> 40,960 x 1.0 / 5 = 8,192
    # tokens per request. A V1 0.32 log never states a preemption: not in this log, never "0".
    assert diag["cause"] == "kv_pool_too_small"
    assert diag["summary"] == (
        "memory-bound: up to 5 running and 16 waiting (mean 12.3 over 15 records) at up to 100.0 % KV usage; "
        "preemptions are not in this log (give the scrapes or --prometheus); "
        "the 40,960-token pool holds about 5.0 requests of ~8,192 tokens"
    )
    sat = doc["saturation"]
    (episode,) = sat["episodes"]
    # ISO-8601 with the year; vLLM printed none, so it comes from the file (its modification time)
    assert re.fullmatch(r"\d{4}-11-29T14:45:37", episode["start_ts"])
    assert re.fullmatch(r"\d{4}-11-29T14:48:07", episode["end_ts"])
    assert doc["evidence"]["year_inferred_from"] == "the log file's modification time"
    assert (episode["peak_waiting"], episode["peak_kv_usage_pct"]) == (16, 100.0)
    assert sat["memory_bound_seconds"] == 150.0
    assert sat["memory_bound_records"] == 15
    assert isinstance(diag["levers"], list)  # filled by the capacity model (its own tests)
    assert doc["errors"] == []  # the EngineDeadError after SIGINT is shutdown noise


def _portable(doc: dict[str, Any]) -> dict[str, Any]:
    for item in doc["inputs"]:
        item["path"] = Path(item["path"]).name
    if doc["evidence"]["year_inferred_from"] == "the log file's modification time":
        # a checkout's modification time is the day of the checkout: keep goldens year-free
        doc = json.loads(re.sub(r'"\d{4}-(\d\d-\d\dT)', r'"--\1', json.dumps(doc)))
    # Levers come from the capacity model (levers_hook), golden-tested with it, not here.
    doc["diagnosis"]["levers"] = []
    return doc


@pytest.mark.parametrize(
    ("log", "golden"),
    [
        pytest.param(CPU_LOG, "vllm-cpu.analyze.json", id="v0.32-cpu-run"),
        pytest.param(SEED_LOG, "vllm-cpu-seed.analyze.json", id="v0.32-cpu-seed-run"),
        pytest.param(DP_LOG, "synthetic-dp-two-engines.analyze.json", id="synthetic-dp"),
    ],
)
def test_golden_document(log: Path, golden: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _portable(analyze_json(log, capsys))
    path = GOLDEN / golden
    if os.environ.get("KVWATCH_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(doc, indent=2) + "\n")
    assert doc == json.loads(path.read_text())


def test_data_parallel_engines_stay_separate(capsys: pytest.CaptureFixture[str]) -> None:
    doc = analyze_json(DP_LOG, capsys)
    engines = {e["engine"]: e for e in doc["stats"]["engines"]}
    assert engines[0]["verdict"] == "memory_bound"
    assert engines[1]["verdict"] == "ok"
    # Maxima are of single records, never sums or averages across engines.
    assert (engines[0]["max_kv_usage_pct"], engines[1]["max_kv_usage_pct"]) == (99.0, 25.0)
    assert doc["stats"]["max"] == {"running": 5, "waiting": 14, "kv_usage_pct": 99.0}
    assert {ep["engine"] for ep in doc["saturation"]["episodes"]} == {0}
    assert doc["diagnosis"]["verdict"] == "memory_bound"


def test_many_inputs_are_read_in_order_and_kept_apart(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["analyze", "--format", "json", str(CPU_LOG), str(SEED_LOG)], capsys)
    doc = json.loads(out)
    assert code == 0
    assert [Path(i["path"]).name for i in doc["inputs"]] == ["server.log", "server.log"]
    assert doc["stats"]["count"] == 8 + 21
    assert doc["runs"] == 2
    assert {e["source"] for e in doc["stats"]["engines"]} == {str(CPU_LOG), str(SEED_LOG)}


def test_gzip_and_stdin_read_like_the_plain_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = analyze_json(SEED_LOG, capsys)
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(SEED_LOG.read_bytes()))
    from_gz = analyze_json(gz, capsys)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(SEED_LOG.read_bytes())))
    from_stdin = analyze_json("-", capsys)
    for doc in (from_gz, from_stdin):
        # stdin has no modification time to take a year from: compare the stamps without it
        assert _yearless(doc["stats"]) == _yearless(plain["stats"])
        assert doc["diagnosis"] == plain["diagnosis"]
        assert doc["inputs"][0]["lines"] == 231
    assert from_stdin["evidence"]["year_inferred_from"] is None


def _yearless(value: Any) -> Any:
    """``value`` with ISO stamps' years removed (``2026-11-29T...`` -> ``--11-29T...``)."""
    return json.loads(re.sub(r'"\d{4}-(\d\d-\d\dT)', r'"--\1', json.dumps(value)))


@pytest.mark.parametrize(
    ("bom", "codec"), [(b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be")], ids=["utf-16-le", "utf-16-be"]
)
def test_a_utf16_log_reads_like_the_utf8_one(
    bom: bytes, codec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Windows PowerShell 5's `docker logs vllm > vllm.log` writes UTF-16 with a byte-order mark and
    # CRLF; read as bytes, it held "no vLLM log lines".
    plain = analyze_json(SEED_LOG, capsys)
    wide = tmp_path / "vllm.log"
    wide.write_bytes(bom + SEED_LOG.read_text(encoding="utf-8").replace("\n", "\r\n").encode(codec))
    doc = analyze_json(wide, capsys)
    assert doc["stats"] == plain["stats"]
    assert doc["diagnosis"] == plain["diagnosis"]
    assert doc["inputs"][0]["lines"] == 231


# ---- reports --------------------------------------------------------------------------------------


def test_text_report_answers_the_on_call_questions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["analyze", str(SEED_LOG)], capsys)
    assert code == 0
    first = out.splitlines()[0]
    assert "MEMORY-BOUND" in first
    for needed in ("llama-3.1-8b-sim", "0.32.0", "40,960 tokens", "4.44x at 9,216", "block size       32",
                   "episode", "11-29 14:45:37", "21 (", "5 running, 16 waiting, 100.0 % KV usage"):  # fmt: skip
        assert needed in out, needed
    assert "\x1b[" not in out  # plain text when piped


def test_markdown_report_is_a_pasteable_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["analyze", "--format", "markdown", str(SEED_LOG)], capsys)
    assert code == 0
    assert out.startswith("## ")
    assert "**Verdict: memory-bound**" in out
    # the pool's bytes follow --num-gpu-blocks-override: 1,280 of the 32,768 blocks 1 GiB held
    assert "| KV pool | 40,960 tokens in 40 MiB (1,280 blocks; --num-gpu-blocks-override, vLLM had 1 GiB) |" in out


# ---- privacy -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_canary_prompt_never_reaches_any_output(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert CANARY in CANARY_LOG.read_text()
    code, out, err = run(["analyze", "--format", fmt, str(CANARY_LOG)], capsys)
    assert code == 0
    assert CANARY not in out
    assert CANARY not in err
    # What the prompts pretended to say was not taken as vLLM's word either.
    doc = analyze_json(CANARY_LOG, capsys)
    assert doc["capacity"]["gpu_blocks"] is None
    assert doc["capacity"]["kv_cache_tokens"] == 40960
    assert doc["config"]["vllm_version"] == "0.32.0"
    assert doc["errors"] == []
    # The one glued after a request line is not read: the rest of an echo's line may be the client's.
    assert doc["stats"]["count"] == 1


# ---- bad input ---------------------------------------------------------------------------------------


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    empty = tmp / "empty.log"
    empty.write_bytes(b"")
    garbage = tmp / "garbage.bin"
    garbage.write_bytes(bytes((i * 7919 + 13) % 256 for i in range(200_000)))
    latin = tmp / "latin1.log"
    latin.write_bytes(b"caf\xe9 \xff\xfe\n" + SEED_LOG.read_bytes()[:20_000].rsplit(b"\n", 1)[0] + b"\n")
    long_line = tmp / "long-line.log"
    line = (
        b"INFO 11-29 14:05:10 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
        b"throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 4 reqs, GPU KV cache usage: 5.0%\n"
    )
    long_line.write_bytes(b"x" * 10_000_000 + b"\n" + line)
    truncated = tmp / "truncated.log.gz"
    truncated.write_bytes(gzip.compress(SEED_LOG.read_bytes())[:5000])
    return {"empty": empty, "garbage": garbage, "latin1": latin, "long": long_line, "truncated": truncated}


@pytest.mark.parametrize(
    ("name", "code", "count"),
    [
        pytest.param("empty", 1, 0, id="empty-file-exit-1-with-clean-document"),
        pytest.param("garbage", 1, 0, id="binary-garbage-exit-1"),
        pytest.param("latin1", 0, None, id="non-utf8-bytes-read-around"),
        pytest.param("long", 0, 1, id="10mb-line-then-a-record"),
    ],
)
def test_unusable_or_odd_input_gives_a_clean_answer(
    name: str, code: int, count: int | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bad_inputs(tmp_path)[name]
    got, out, err = run(["analyze", "--format", "json", str(path)], capsys)
    assert got == code
    assert "Traceback" not in out + err
    doc = json.loads(out)
    if count is not None:
        assert doc["stats"]["count"] == count
    if code == 1:
        assert len(err.strip().splitlines()) == 1
        assert "no vLLM log lines" in err


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda tmp: tmp / "nope.log", "no such file", id="missing-path"),
        pytest.param(lambda tmp: tmp, "is a directory", id="directory"),
        pytest.param(lambda tmp: _bad_inputs(tmp)["truncated"], "truncated gzip", id="truncated-gz"),
    ],
)
def test_unreadable_input_is_a_one_line_usage_error(
    make: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["analyze", str(make(tmp_path))], capsys)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert message in err
    assert "Traceback" not in err


def test_analyze_paths_is_the_same_document_as_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[int] = []
    doc = analyze_paths([str(SEED_LOG)], progress=seen.append)
    assert doc == analyze_json(SEED_LOG, capsys)
    assert sum(seen) == SEED_LOG.stat().st_size


def test_progress_bar_only_on_a_terminal_and_never_on_stdout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvwatch.commands import analyze as command

    calls: list[int] = []
    advanced: list[int] = []
    real = command.analyze_paths

    def spy(paths: list[str], **kw: Any) -> dict[str, Any]:
        progress = kw.get("progress")
        calls.append(1 if progress else 0)
        if progress:
            kw["progress"] = lambda n: (advanced.append(n), progress(n))
        return real(paths, **kw)

    monkeypatch.setattr(command, "analyze_paths", spy)
    monkeypatch.setattr(command, "PROGRESS_MIN_BYTES", 0)
    code, out, _ = run(["analyze", "--format", "json", str(SEED_LOG)], capsys)  # piped: no bar
    assert code == 0
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    code, tty_out, _ = run(["analyze", "--format", "json", str(SEED_LOG)], capsys)
    assert code == 0
    assert calls == [0, 1]
    assert sum(advanced) == SEED_LOG.stat().st_size  # the bar saw every byte read
    assert json.loads(tty_out) == json.loads(out)  # the bar never mixes into the document


def test_model_config_must_exist(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["analyze", "--model-config", "/nonexistent/config.json", str(SEED_LOG)], capsys)
    assert code == 2
    assert out == ""
    assert "--model-config" in err


def test_v0_prefix_hit_record_fills_the_last_stats_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stats = (
        "INFO 11-29 14:05:10 metrics.py:351] Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 "
        "tokens/s, Running: 3 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 5.0%, "
        "CPU KV cache usage: 0.0%."
    )
    hit = "INFO 11-29 14:05:10 metrics.py:367] Prefix cache hit rate: GPU: 42.17%, CPU: 0.00%"
    log = tmp_path / "v0.log"
    log.write_text(f"{stats}\n{hit}\n{stats}\n")
    doc = analyze_json(log, capsys)
    assert doc["stats"]["last"]["prefix_hit_pct"] is None  # the last record had no hit-rate line
    log.write_text(f"{stats}\n{hit}\n")
    assert analyze_json(log, capsys)["stats"]["last"]["prefix_hit_pct"] == 42.17


def test_timeline_stays_bounded_and_keeps_the_peaks() -> None:
    from kvwatch.reconcile.analysis import TIMELINE_BUCKETS, Analysis
    from kvwatch.records import LogTime, StatsRecord

    analysis = Analysis()
    records = [
        StatsRecord(i, LogTime(11, 29, 10 + i // 3600, i // 60 % 60, float(i % 60)), 0, None, i % 7, (i * 13) % 50,
                    kv_usage_pct=float(i % 101))
        for i in range(5_000)
    ]  # fmt: skip
    analysis.add(records)
    (engine,) = analysis.document()["stats"]["engines"]
    timeline = engine["timeline"]
    assert TIMELINE_BUCKETS <= len(timeline) < 2 * TIMELINE_BUCKETS
    assert sum(b["records"] for b in timeline) == 5_000
    assert max(b["peak_waiting"] for b in timeline) == 49
    assert max(b["peak_kv_usage_pct"] for b in timeline) == 100.0
    assert timeline[0]["start_ts"].endswith("-11-29T10:00:00")


def test_text_report_draws_the_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(["analyze", str(SEED_LOG)], capsys)
    block = out.split("Timeline\n", 1)[1].splitlines()
    assert re.match(r"  (\d{4}-)?11-29 14:45:07 .. (\d{4}-)?11-29 14:48:27", block[0])
    waiting = next(line for line in block if line.startswith("  waiting"))
    assert waiting.endswith("max 16")
    assert len(waiting.split()[1]) == 21  # one column per stats record in a short log


def test_deferred_requests_do_not_make_a_server_memory_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = (
        "(APIServer pid=1) INFO 11-29 14:05:{s:02d} [loggers.py:336] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        "Avg generation throughput: 2.0 tokens/s, Running: 8 reqs, Waiting: {w} reqs, Deferred: {d} reqs, "
        "GPU KV cache usage: 97.0%, Prefix cache hit rate: 0.0%"
    )
    log = tmp_path / "deferred.log"
    log.write_text("\n".join(line.format(s=10 * i, w=5, d=5) for i in range(4)) + "\n")
    assert analyze_json(log, capsys)["diagnosis"]["verdict"] == "queued"  # all 5 waiting are deferred
    log.write_text("\n".join(line.format(s=10 * i, w=5, d=2) for i in range(4)) + "\n")
    assert analyze_json(log, capsys)["diagnosis"]["verdict"] == "memory_bound"
