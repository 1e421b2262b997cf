"""`kvwatch analyze` with saved /metrics scrapes: recognised by content, ordered, read as deltas.

The truth for the seed run was read by hand from the scrapes (tests/fixtures/vllm-cpu-seed/README.md,
"Truth read by hand for the metrics evidence"). Golden documents and reports live in tests/golden/ and
are rewritten only with ``KVWATCH_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kvwatch.reconcile.evidence import Increase, counter_increase, distribution, histogram_increase, quantile
from kvwatch.records import HistogramSummary
from tests.helpers import run

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
SEED = FIXTURES / "vllm-cpu-seed"
SEED_LOG = SEED / "server.log"
SCRAPES = [*sorted(SEED.glob("metrics-[0-9]*.prom")), SEED / "metrics-final.prom"]
CPU_LOG = FIXTURES / "vllm-cpu" / "server.log"


def analyze(paths: Sequence[Path | str], capsys: pytest.CaptureFixture[str], fmt: str = "json") -> tuple[int, str, str]:
    return run(["analyze", "--format", fmt, *map(str, paths)], capsys)


def doc_of(paths: Sequence[Path | str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = analyze(paths, capsys)
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def test_the_bundled_example_with_its_scrapes_gives_vllms_own_counts(capsys: pytest.CaptureFixture[str]) -> None:
    doc = doc_of([SEED_LOG, *SCRAPES], capsys)
    assert doc["preemptions"]["from_metrics"] == 14
    req = doc["requests"]
    assert (req["prompt_tokens"]["mean"], req["generation_tokens"]["mean"]) == (7500, 1000)
    assert (req["finished"], req["preempted"]) == (46, 14)
    assert doc["prefix_cache"] == {"hit_pct": 0.0, "queries": 345000, "hits": 0, "source": "metrics"}
    assert doc["diagnosis"]["verdict"] == "memory_bound"
    assert "14 of 46 requests were preempted" in doc["diagnosis"]["summary"]
    assert doc["evidence"]["scrapes"] == 20
    assert doc["evidence"]["log_records"] == doc["records_total"] > 0
    (engine,) = doc["engines"]  # the log's engine 0 and the scrapes' engine 0 are one engine
    assert (engine["source"], engine["engine"], engine["verdict"]) == ("metrics+log", "0", "memory_bound")
    assert (engine["log"]["samples"], engine["samples"]) == (21, 20)


def test_the_scrapes_alone_give_the_same_preemptions_and_request_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    both = doc_of([SEED_LOG, *SCRAPES], capsys)
    alone = doc_of(SCRAPES, capsys)
    assert alone["preemptions"]["from_metrics"] == both["preemptions"]["from_metrics"] == 14
    assert alone["requests"] == both["requests"]
    assert alone["diagnosis"]["verdict"] == "memory_bound"  # judged from the scrape samples
    assert alone["saturation"]["memory_bound_samples"] > 2
    assert alone["evidence"]["log_records"] == 0
    # the pool from vllm:cache_config_info (1,280 blocks of 32), never its 1 GiB under the override
    assert (alone["capacity"]["kv_cache_tokens"], alone["capacity"]["kv_cache_memory_gib"]) == (40960, None)


def test_scrapes_are_recognised_by_content_in_any_name_and_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = doc_of(SCRAPES, capsys)["requests"]
    shuffled = list(SCRAPES)
    random.Random(7).shuffle(shuffled)
    renamed = []
    for i, path in enumerate(shuffled):
        target = tmp_path / f"dump-{i:02d}.txt"
        data = path.read_bytes()
        if i % 3 == 0:
            target = tmp_path / f"dump-{i:02d}.gz"
            data = gzip.compress(data)
        elif i % 3 == 1:
            data = b"".join(b"> " + line + b"\n" for line in data.splitlines())  # a blockquoted paste
        target.write_bytes(data)
        os.utime(target, (1_000_000_000, 1_000_000_000))  # one time for all: only counters can order them
        renamed.append(target)
    doc = doc_of(renamed, capsys)
    assert doc["preemptions"]["from_metrics"] == 14
    assert doc["requests"] == expected
    assert doc["evidence"]["metrics_time_source"] is None  # equal mtimes: no time is claimed


def test_a_restart_between_scrapes_is_counted_reset_aware(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Process A: metrics-00..05 (0 -> 2 preemptions, 0 -> 9 finished); process B, started 1,000 s
    # later: metrics-00..03 again (0 -> 1, 0 -> 4). Counts from the README: 3 and 13.
    paths = []
    for i in range(6):
        paths.append(SEED / f"metrics-{i:02d}.prom")
    for i in range(4):
        text = (SEED / f"metrics-{i:02d}.prom").read_text()
        later = re.sub(
            r"^(vllm:\S*_created(?:\{[^}]*\})?) (\S+)$",
            lambda m: f"{m.group(1)} {float(m.group(2)) + 1000.0!r}",
            text,
            flags=re.MULTILINE,
        )
        target = tmp_path / f"b-{i}.prom"
        target.write_text(later)
        paths.append(target)
    random.Random(3).shuffle(paths)
    doc = doc_of(paths, capsys)
    assert doc["preemptions"]["from_metrics"] == 3
    assert doc["requests"]["finished"] == 13
    assert doc["requests"]["generation_tokens"]["mean"] == 1000


def test_a_quantile_above_the_last_finite_bucket_is_a_bound_never_the_mean(capsys: pytest.CaptureFixture[str]) -> None:
    prompt = doc_of(SCRAPES, capsys)["requests"]["prompt_tokens"]
    assert prompt["mean"] == 7500
    assert (prompt["p50"], prompt["p95"]) == (None, None)
    assert (prompt["p50_lower_bound"], prompt["p95_lower_bound"]) == (5000.0, 5000.0)
    assert "5,000" in prompt["note"]


def test_a_v1_log_alone_does_not_claim_zero_preemptions(capsys: pytest.CaptureFixture[str]) -> None:
    doc = doc_of([SEED_LOG], capsys)
    assert doc["preemptions"]["from_metrics"] is None
    assert doc["preemptions"]["note"] == "not in this log; give the scrapes or --prometheus"
    for key in ("requests", "latency", "evidence", "engines", "prefix_cache"):
        assert key in doc
    assert doc["requests"] is None
    assert doc["latency"] is None
    code, out, _ = analyze([SEED_LOG], capsys, "text")
    assert code == 0
    assert "not in this log; give the scrapes or --prometheus" in out


def test_a_log_is_not_mistaken_for_a_scrape(capsys: pytest.CaptureFixture[str]) -> None:
    doc = doc_of([CPU_LOG], capsys)
    assert doc["evidence"]["scrapes"] == 0
    assert doc["stats"]["count"] > 0


# ---- the arithmetic, on hand-made numbers ------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [([0, 2, 5, 5], 5), ([3, 7, 1, 4], 4 + 1 + 3), ([None, 2, None, 6], 4), ([], None), ([9.0], 0)],
    ids=["monotone", "restart-counts-the-new-process", "gaps", "absent", "one-sample"],
)
def test_counter_increase(values: list[float | None], expected: float | None) -> None:
    assert counter_increase(values) == expected


def _h(count: float, total: float, buckets: list[tuple[float, float]]) -> HistogramSummary:
    return HistogramSummary(count, total, tuple(buckets))


def test_histogram_increase_across_a_restart() -> None:
    inf = float("inf")
    a = _h(2, 20, [(10, 2), (inf, 2)])
    b = _h(5, 80, [(10, 3), (inf, 5)])
    c = _h(1, 100, [(10, 0), (inf, 1)])  # restarted: all new
    inc = histogram_increase([a, b, c])
    assert inc == Increase(3 + 1, 60 + 100, ((10, 1 + 0), (inf, 3 + 1)))


def test_quantile_inside_and_above_the_buckets() -> None:
    inf = float("inf")
    inside = Increase(10, 50, ((5.0, 5), (10.0, 10), (inf, 10)))
    assert quantile(inside, 0.5) == (5.0, None, None)
    above = Increase(10, 900, ((5.0, 2), (10.0, 4), (inf, 10)))
    value, bound, reason = quantile(above, 0.95)
    assert (value, bound) == (None, 10.0)
    assert reason is not None
    assert distribution(above)["mean"] == 90


# ---- golden documents and reports ---------------------------------------------------------------


def _portable_doc(doc: dict[str, Any]) -> dict[str, Any]:
    for item in doc["inputs"]:
        item["path"] = Path(item["path"]).name
    doc["diagnosis"]["levers"] = []  # golden-tested with the capacity model
    return doc


@pytest.mark.parametrize(
    ("paths", "name"),
    [
        pytest.param([SEED_LOG, *SCRAPES], "vllm-cpu-seed-with-scrapes", id="log-and-scrapes"),
        pytest.param(SCRAPES, "vllm-cpu-seed-scrapes-only", id="scrapes-only"),
    ],
)
def test_golden_document_and_report(paths: list[Path], name: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _portable_doc(doc_of(list(paths), capsys))
    code, text, _ = analyze(list(paths), capsys, "text")
    assert code == 0
    text = text.replace(str(SEED) + os.sep, "")
    json_path, text_path = GOLDEN / f"{name}.analyze.json", GOLDEN / f"{name}.analyze.txt"
    if os.environ.get("KVWATCH_UPDATE_GOLDEN") == "1":
        json_path.write_text(json.dumps(doc, indent=2) + "\n")
        text_path.write_text(text)
    assert doc == json.loads(json_path.read_text())
    assert text == text_path.read_text()


@pytest.mark.parametrize(
    ("stamps", "created", "mtime", "expected", "source"),
    [
        (["--11-29T14:45:07"], 1_795_963_486.0, None, ["2026-11-29T14:45:07"], "scrapes' _created stamps"),
        # a log across New Year, written until 2027-01-01: December is the year before
        (["--12-31T23:59:50", "--01-01T00:00:10"], None, 1_798_761_700.0,
         ["2026-12-31T23:59:50", "2027-01-01T00:00:10"], "the log file's modification time"),
        (["2026-11-29T14:45:07Z"], None, 1_798_761_700.0, ["2026-11-29T14:45:07Z"], None),  # had its year
        (["--11-29T14:45:07"], None, None, ["--11-29T14:45:07"], None),  # stdin: nothing to infer from
    ],
    ids=["from-created", "across-new-year-from-mtime", "transport-stamp-kept", "unknown"],
)  # fmt: skip
def test_year_less_stamps_get_their_year_and_say_from_where(
    stamps: list[str], created: float | None, mtime: float | None, expected: list[str], source: str | None
) -> None:
    from kvwatch.reconcile.evidence import infer_years

    doc: dict[str, Any] = {"stats": {"stamps": stamps}, "evidence": {}}
    infer_years(doc, created=created, log_mtime=mtime)
    assert doc["stats"]["stamps"] == expected
    assert doc["evidence"]["year_inferred_from"] == source


def test_distinct_modification_times_time_the_scrapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Saved 10 s apart, as the seed run's scraper did: the samples carry those times (ISO, with year).
    paths = []
    for i, path in enumerate(SCRAPES):
        target = tmp_path / path.name
        target.write_bytes(path.read_bytes())
        os.utime(target, (1_795_963_499.0 + 10 * i, 1_795_963_499.0 + 10 * i))
        paths.append(target)
    doc = doc_of(paths, capsys)
    assert doc["evidence"]["metrics_time_source"] == "mtime"
    assert doc["evidence"]["first_ts"] == "2026-11-29T14:44:59Z"
    assert doc["evidence"]["last_ts"] == "2026-11-29T14:48:09Z"
    (episode,) = doc["saturation"]["metrics_episodes"]
    assert episode["start_ts"] is not None
    assert episode["start_ts"].startswith("2026-11-29T14:4")


REAL_SCRAPES = sorted(
    p
    for root in (FIXTURES / "real" / "metrics", FIXTURES / "real-extra-metrics")
    for p in root.iterdir()
    if p.suffix == ".prom"
)
REAL_LOGS = sorted(
    p for root in (FIXTURES / "real" / "logs", FIXTURES / "real-extra") for p in root.rglob("*") if p.suffix == ".log"
)


@pytest.mark.parametrize("path", REAL_SCRAPES, ids=[p.stem for p in REAL_SCRAPES])
def test_every_real_pasted_scrape_is_recognised_as_one(path: Path) -> None:
    from kvwatch.parse.scrapes import looks_like_exposition
    from kvwatch.sources.saved_scrapes import read_head

    head = read_head(str(path))
    assert head is not None
    assert looks_like_exposition(head)


def test_no_real_log_is_taken_for_a_scrape() -> None:
    from kvwatch.parse.scrapes import looks_like_exposition
    from kvwatch.sources.saved_scrapes import read_head

    assert len(REAL_LOGS) > 50
    taken = [p.name for p in REAL_LOGS if (h := read_head(str(p))) is not None and looks_like_exposition(h)]
    assert taken == []


def test_a_scrape_with_no_engine_series_is_exit_1_naming_the_problem(capsys: pytest.CaptureFixture[str]) -> None:
    # a real paste of HELP/TYPE lines only (vLLM 0.5.4): read, recognised, but nothing to count
    code, _out, err = analyze([FIXTURES / "real" / "metrics" / "103-v054-help-type-only-no-samples.prom"], capsys)
    assert code == 1
    assert err.count("\n") == 1
    assert "no per-engine vLLM series" in err


@pytest.mark.parametrize("path", REAL_SCRAPES, ids=[p.stem for p in REAL_SCRAPES])
def test_every_real_scrape_analyzes_without_a_traceback(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = analyze([path], capsys)
    assert code in (0, 1), err
    assert "Traceback" not in err
    if code == 0:
        doc = json.loads(out)
        assert doc["evidence"]["scrapes"] == 1
        assert doc["evidence"]["metrics_samples"] >= 1


@pytest.mark.parametrize(
    "text",
    [
        "vllm\u200b:num_requests_running 3\n",  # a zero-width space a chat app put inside the name
        "vllm&#58;num_requests_running 3\nvllm&#58;num_requests_waiting 0\n",  # HTML-escaped colon
        "> vllm:num_requests_running 3\n",
        "ray_vllm_num_requests_running 1\n",
    ],
)
def test_the_quick_refusal_never_refuses_what_repair_would_read(text: str) -> None:
    # looks_like_exposition refuses at once a text holding no mark of a vLLM name; these hold one,
    # so the whole repair decides, and agrees with the full reading.
    from kvwatch.parse.scrapes import _reads_as_exposition, looks_like_exposition

    assert looks_like_exposition(text) == _reads_as_exposition(text)


def test_the_quick_refusal_agrees_with_the_full_reading_on_every_real_input() -> None:
    from kvwatch.parse.scrapes import _reads_as_exposition, looks_like_exposition
    from kvwatch.sources.saved_scrapes import read_head

    heads = [h for p in (*REAL_LOGS, *REAL_SCRAPES) if (h := read_head(str(p))) is not None]
    assert len(heads) > 100
    assert [looks_like_exposition(h) for h in heads] == [_reads_as_exposition(h) for h in heads]
