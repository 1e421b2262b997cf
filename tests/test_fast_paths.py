"""The shortcuts that make ``kvwatch analyze`` fast must not change what it finds.

Each test compares a fast path with the plain way of computing the same thing: the saturation
judge's O(1) window against a rebuild of the window per observation, worker rows against records
built by the general parser, a chunk fed at once against line-by-line feeding, edge-only full
scans against reading every line, and NamedTuple records against their documented fields.
(Speed itself is measured by benchmarks/analyze_speed.py, never asserted here.)
"""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.parse import log
from kvwatch.parse.log import LineScan, LogParser, scan_line, scan_line_compact
from kvwatch.reconcile.saturation import Observation, SaturationJudge
from kvwatch.records import LogRecord, LogTime, StatsRecord
from kvwatch.sources import files

FIXTURES = Path(__file__).parent / "fixtures"
SEED_LOG = FIXTURES / "vllm-cpu-seed" / "server.log"
WRAPPED = FIXTURES / "real" / "logs" / "026-v011-docker-rfc3339-hardwrapped.log"
FILLER = '(APIServer pid=1) INFO:     10.0.0.{n}:4242 - "POST /v1/completions HTTP/1.1" 200 OK'
ENGINE_DEAD = (
    "(APIServer pid=1) ERROR 11-29 14:48:34 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)

# ---- saturation: the O(1) window against the definition computed from scratch -----------------


def _naive_states(observations: list[Observation], window: float, threshold: float, max_num_seqs: int | None) -> list:
    """docs/contracts.md "Saturation" computed from scratch for each observation (the old list-based window)."""
    recent: list[Observation] = []
    out = []
    for obs in observations:
        recent.append(obs)
        while len(recent) > 2 and obs.t - recent[0].t > window:
            recent.pop(0)
        values = [o.kv_usage_ratio for o in recent if o.kv_usage_ratio is not None]
        peak = max(values) if values else None
        running, waiting = obs.running or 0.0, obs.waiting or 0.0
        capacity = obs.waiting_capacity if obs.waiting_capacity is not None else waiting
        if running <= 0 and waiting <= 0:
            state = "idle"
        elif (
            capacity > 0 and (max_num_seqs is None or running < max_num_seqs) and peak is not None and peak >= threshold
        ):
            state = "memory_bound"
        elif waiting > 0 and max_num_seqs is not None and running >= max_num_seqs:
            state = "seq_bound"
        elif sum(o.preemptions for o in recent) > 0:
            state = "preempting"
        elif waiting > 0:
            state = "queued"
        else:
            state = "ok"
        out.append((state, peak))
    return out


def _random_observations(seed: int, backwards: bool) -> list[Observation]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(400):
        t += rng.choice([1.0, 5.0, 10.0, 10.0, 30.0, 90.0])
        if backwards and rng.random() < 0.05:
            t -= 200.0  # time going backwards must behave exactly as before too
        kv = None if rng.random() < 0.1 else rng.choice([0.2, 0.61, 0.9, 0.95, rng.random()])
        out.append(
            Observation(
                t,
                rng.choice([None, 0, 3, 8, 12]),
                rng.choice([None, 0, 0, 2, 15]),
                kv,
                float(rng.choice([0, 0, 0, 0, 1, 3])),
                rng.choice([None, None, 0, 4]),
            )
        )
    return out


@pytest.mark.parametrize(
    ("seed", "window", "max_num_seqs", "backwards"),
    [
        (1, 60.0, None, False),
        (2, 60.0, 8, False),
        (3, 15.0, 12, False),
        (4, 0.0, None, False),
        (5, 60.0, 8, True),
    ],
    ids=["default-window", "seq-cap", "short-window", "zero-window-keeps-two", "time-going-backwards"],
)
def test_window_kept_incrementally_judges_like_the_window_rebuilt_each_time(
    seed: int, window: float, max_num_seqs: int | None, backwards: bool
) -> None:
    observations = _random_observations(seed, backwards)
    judge = SaturationJudge(window_seconds=window, max_num_seqs=max_num_seqs)
    got = [(judge.observe(o), judge.peak_kv_usage()) for o in observations]
    assert got == _naive_states(observations, window, 0.9, max_num_seqs)
    assert {s for s, _ in got} >= {"memory_bound", "queued", "idle"}  # the data exercises the states


def test_observe_values_is_observe_without_the_observation() -> None:
    observations = _random_observations(7, False)
    a, b = SaturationJudge(), SaturationJudge()
    for o in observations:
        assert a.observe(o) == b.observe_values(
            o.t, o.running, o.waiting, o.kv_usage_ratio, o.preemptions, o.waiting_capacity
        )
        assert a.peak_kv_usage() == b.peak_kv_usage()


# ---- records: NamedTuples that keep the documented fields --------------------------------------


@pytest.mark.parametrize("month", [-1, 0, 1, 2, 6, 12, 13, 99], ids=lambda m: f"month-{m}")
def test_log_time_seconds_clamps_the_month_like_min_max(month: int) -> None:
    from kvwatch.records import _DAYS_BEFORE_MONTH

    ts = LogTime(month, 17, 23, 59, 59.25)
    doy = _DAYS_BEFORE_MONTH[max(1, min(month, 12)) - 1] + 17 - 1
    assert ts.seconds() == ((doy * 24 + 23) * 60 + 59) * 60 + 59.25


def test_stats_record_and_log_time_keep_their_fields_defaults_and_methods() -> None:
    assert StatsRecord._fields == (
        "line", "ts", "engine", "engines_aggregated", "running", "waiting", "swapped", "deferred",
        "preemptions", "kv_usage_pct", "cpu_kv_usage_pct", "prefix_hit_pct", "external_prefix_hit_pct",
        "mm_cache_hit_pct", "prompt_tps", "gen_tps", "device", "source", "debug_level",
    )  # fmt: skip
    assert LogTime._fields == ("month", "day", "hour", "minute", "second", "year", "tz")
    rec = StatsRecord(3, LogTime(11, 29, 8, 0, 10.5), 0, None, 61, 24, kv_usage_pct=81.2)
    assert (rec.swapped, rec.source, rec.ts.year, rec.ts.tz) == (None, None, None, None)
    assert rec.ts.iso() == "--11-29T08:00:10.5"
    assert LogTime(3, 1, 0, 0, 0.0, 2026, "Z").iso() == "2026-03-01T00:00:00Z"
    assert LogTime(3, 1, 0, 0, 0.0).seconds() - LogTime(2, 28, 23, 59, 59.0).seconds() == 1.0
    assert pickle.loads(pickle.dumps(rec)) == rec
    with pytest.raises(AttributeError):
        rec.line = 4  # type: ignore[misc]


# ---- worker rows and chunk feeding against the general parser ----------------------------------

PLAIN_LINES = [
    "(APIServer pid=2871) INFO 11-29 08:00:10 [loggers.py:336] Engine 000: Avg prompt throughput: 272.5 tokens/s, "
    "Avg generation throughput: 1232.4 tokens/s, Running: 61 reqs, Waiting: 24 reqs, GPU KV cache usage: 81.2%, "
    "Prefix cache hit rate: 46.0%\n",
    "2026-11-29T08:00:10.123456789Z INFO 11-29 08:00:10 [loggers.py:116] Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: 12.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%, "
    "Prefix cache hit rate: 0.0%\r\n",
    "INFO 11-29 08:00:10 [metrics.py:455] Avg prompt throughput: 5.1 tokens/s, Avg generation throughput: 9.0 "
    "tokens/s, Running: 3 reqs, Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: 93.4%, CPU KV cache usage: "
    "0.0%.\n",
    "(APIServer pid=7) INFO 11-29 08:00:10 [loggers.py:236] 2 Engines Aggregated: Avg prompt throughput: 1.0 "
    "tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 4 reqs, Waiting: 5 reqs, Deferred: 1 reqs, "
    "Preemptions: 2, XPU KV cache usage: 40.0%\n",
]


@pytest.mark.parametrize(
    "line", PLAIN_LINES, ids=["v1-engine-prefix", "docker-rfc3339-crlf", "v0-swapped-cpu-usage", "aggregated-xpu"]
)
def test_a_worker_row_becomes_the_record_the_general_parser_builds(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    row = scan_line_compact(line, 1)
    assert not isinstance(row, LineScan)  # the row form: what crosses the process boundary
    assert all(type(v) in (tuple, int, float, str, bool, type(None)) for v in row)
    fast = LogParser().feed_scan(row, 7, "")
    monkeypatch.setattr(log, "_plain_stats_line", lambda text, lineno: None)
    general = LogParser().feed_line(line, 7)
    assert fast == general
    assert len(fast) == 1
    assert isinstance(fast[0], StatsRecord)
    assert type(fast[0].ts) is LogTime


def _every_line(lines: list[str]) -> list[LogRecord]:
    parser = LogParser()
    return [r for i, line in enumerate(lines, 1) for r in parser.feed_line(line, i)] + parser.finish()


def _chunked(lines: list[str], size: int) -> list[LogRecord]:
    """Worker-style: scan_line_compact per line, fed a chunk at a time with feed_chunk."""
    parser = LogParser()
    out: list[LogRecord] = []
    for base in range(0, len(lines), size):
        part = lines[base : base + size]
        candidates = [(i, text, scan_line_compact(text, i + 1)) for i, text in enumerate(part)]
        out.extend(parser.feed_chunk(candidates, base))
    return out + parser.finish()


@pytest.mark.parametrize("size", [1, 3, 1000], ids=["line-chunks", "small-chunks", "one-chunk"])
def test_feeding_a_chunk_at_once_gives_what_line_by_line_gives(size: int) -> None:
    wrapped = WRAPPED.read_text().splitlines(keepends=True)
    seed = SEED_LOG.read_text().splitlines(keepends=True)
    # Plain rows around a hard-wrapped record, an engine death judged by what follows, and a restart.
    lines = seed + wrapped + [PLAIN_LINES[0], ENGINE_DEAD + "\n", PLAIN_LINES[0]] + seed + [ENGINE_DEAD + "\n"]
    reference = _every_line(lines)
    got = _chunked(lines, size)
    assert got == reference
    assert sum(isinstance(r, StatsRecord) for r in got) > 40
    assert [type(r).__name__ for r in got].count("RunStartRecord") >= 1
    assert [getattr(r, "kind", None) for r in got].count("engine_dead") >= 1


def test_a_scan_line_record_is_renumbered_to_the_line_it_is_fed_as() -> None:
    scan = scan_line(SEED_LOG.read_text().splitlines()[112], 1)
    (rec,) = LogParser().feed_scan(scan, 40, "")
    assert isinstance(rec, StatsRecord)
    assert rec.line == 40


# ---- a large input: every anchor everywhere, a crash far from any "cache" line included ---------


@pytest.fixture
def long_log(tmp_path: Path) -> tuple[Path, list[str]]:
    """Startup and stats, a long quiet middle, and an engine death near the end far from any startup line."""
    rng = random.Random(5)
    seed = SEED_LOG.read_text().splitlines()
    lines = list(seed)
    lines += [FILLER.format(n=rng.randint(1, 254)) for _ in range(12_000)]
    lines += [seed[112], ENGINE_DEAD]  # a crash: "EngineDead", no "cache" in it
    lines += [FILLER.format(n=rng.randint(1, 254)) for _ in range(100)]
    path = tmp_path / "long.log"
    path.write_text("\n".join(lines) + "\n")
    return path, lines


@pytest.mark.parametrize("jobs", [1, 2], ids=["serial-pieces", "two-workers-byte-ranges"])
def test_a_crash_near_the_end_of_a_large_input_is_found(
    long_log: tuple[Path, list[str]], jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, lines = long_log
    monkeypatch.setattr(files, "CHUNK_BYTES", 128 << 10)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    assert path.stat().st_size > 8 * (128 << 10)  # several chunks
    log_input = files.LogInput(str(path), jobs=jobs)
    got = [r for batch in log_input.batches() for r in batch]
    assert got == _every_line([line + "\n" for line in lines])
    assert [getattr(r, "kind", None) for r in got].count("engine_dead") == 1
    assert log_input.lines == len(lines)


def test_a_byte_range_that_starts_exactly_at_a_line_start_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = SEED_LOG.read_text().splitlines()[112]
    width = len(stats.encode()) + 1  # every line this many bytes, newline included
    base = FILLER.format(n=7)
    filler = base.replace("completions", "completions" + "x" * (width - 1 - len(base.encode())))
    assert len(filler.encode()) + 1 == width
    lines = [stats if i % 10 == 0 else filler for i in range(4000)]
    path = tmp_path / "aligned.log"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(files, "CHUNK_BYTES", width * 100)  # 40 ranges, each starting at a line
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    assert all(start % width == 0 for _, start, _, _ in files._ranges(str(path), path.stat().st_size))
    log_input = files.LogInput(str(path), jobs=2)
    got = [r for batch in log_input.batches() for r in batch]
    assert got == _every_line([line + "\n" for line in lines])
    assert (log_input.lines, log_input.bytes) == (4000, path.stat().st_size)


# ---- start-up: `kvwatch analyze` imports only its own command -------------------------------

_PROBE = """
import contextlib, io, sys
from kvwatch.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        assert not exc.code, exc.code
print("rich" in sys.modules)  # typer's rich formatting: kvwatch uses click's, so never loaded
print(sorted(m for m in sys.modules if m.startswith("kvwatch.commands.")))
"""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # history.py is analyze's own (its --prometheus flags and reader, shared with simulate), no command
        (["analyze", "--format", "json", str(SEED_LOG)], ["kvwatch.commands.analyze", "kvwatch.commands.history"]),
        (["--help"], []),  # the command list from the modules' docstrings, none imported
    ],
    ids=["analyze-alone", "help-lists-every-command-importing-none"],
)
def test_analyze_starts_without_the_other_commands_modules(argv: list[str], expected: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True)
    rich_loaded, modules = out.stdout.strip().splitlines()[-2:]
    assert modules == repr(expected)
    assert rich_loaded == "False"  # click formats help and errors (rich_markup_mode=None): rich never loads
