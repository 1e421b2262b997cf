"""The /metrics reader: real scrapes, the alias table, engines, cache_config typing, pasted damage.

Real scrapes come from tests/fixtures (provenance in its README); expectations for them are the
hand-read ones in tests/fixtures/real/index.json. Hand-made expositions here are small and named
by the behaviour they pin down.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvwatch.parse.histogram import bucket_quantile
from kvwatch.parse.metrics import (
    IGNORED_METRICS,
    METRIC_ALIASES,
    PREFIXES,
    catalogue_status,
    parse_exposition,
    read_exposition,
    repair_exposition,
    type_label_value,
)
from kvwatch.records import EngineSample, MetricsSnapshot

FIXTURES = Path(__file__).parent / "fixtures"
REAL_INDEX = FIXTURES / "real" / "index.json"
REAL_SCRAPES = sorted(
    [
        *FIXTURES.glob("real/metrics/*.prom"),
        *FIXTURES.glob("vllm-cpu/metrics-*.prom"),
        *FIXTURES.glob("vllm-cpu-seed/metrics-*.prom"),
    ]
)
V032_SCRAPE = FIXTURES / "vllm-cpu" / "metrics-03.prom"
MISSING = object()


def _resolve(doc: Any, path: str) -> Any:
    """Dotted path into snapshot fields, as docs/contracts.md names them (engines.0.running ...)."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, (list, tuple)) and part.isdigit():
            cur = cur[int(part)] if int(part) < len(cur) else MISSING
        elif isinstance(cur, dict):
            cur = cur.get(part, MISSING)
        elif cur is not None and cur is not MISSING and hasattr(cur, part):
            cur = getattr(cur, part)
        else:
            return MISSING
    return cur


def _snapshot_entries() -> list[dict[str, Any]]:
    entries = json.loads(REAL_INDEX.read_text())
    return [e for e in entries if e["command"] == "snapshot"]


def _engine(text: str, index: int = 0) -> EngineSample:
    return parse_exposition(text).engines[index]


# --------------------------------------------------------------------------------------------
# Real scrapes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", _snapshot_entries(), ids=lambda e: Path(e["file"]).stem)
def test_real_scrape_matches_hand_read_expectations(entry: dict[str, Any]) -> None:
    snapshot = parse_exposition((REAL_INDEX.parent / entry["file"]).read_text())
    for key, expected in entry["expect"].items():
        actual = _resolve(snapshot, key)
        if expected is None:
            assert actual is None or actual is MISSING, key
        else:
            assert actual == pytest.approx(expected) if isinstance(expected, float) else actual == expected, key


@pytest.mark.parametrize("path", REAL_SCRAPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_vllm_name_in_real_scrapes_is_read_or_deliberately_ignored(path: Path) -> None:
    reading = read_exposition(path.read_text())
    raw_names = set(re.findall(r"(?:ray_)?vllm:[A-Za-z0-9_:]+", path.read_text()))
    assert raw_names, "fixture has vLLM names"
    uncatalogued = sorted(n for n in raw_names if catalogue_status(n) is None)
    assert uncatalogued == []
    assert reading.uncatalogued == ()


def test_every_metric_kvwatch_reads_appears_in_the_real_0_32_scrape() -> None:
    """Datadog's check both ways: what vLLM 0.32 serves fills every field it can fill."""
    snapshot = parse_exposition(V032_SCRAPE.read_text())
    (engine,) = snapshot.engines
    not_in_v1 = {"swapped"}  # V0 only (removed 0.9.1)
    for alias in METRIC_ALIASES:
        if alias.field == "cache_config":
            assert snapshot.cache_config["num_gpu_blocks"] == 32
        elif alias.field not in not_in_v1:
            assert getattr(engine, alias.field) is not None, alias.field
    assert engine.swapped is None


def test_real_scrapes_read_without_skipping_anything_but_pasted_shell_lines() -> None:
    skipped = {p.name: parse_exposition(p.read_text()).skipped_lines for p in REAL_SCRAPES}
    assert skipped.pop("106-v033-cache-config-info-curl.prom") == 1  # "$ curl http://..." before the sample
    assert set(skipped.values()) == {0}


def test_seed_run_counts_every_preemption_from_metrics() -> None:
    final = parse_exposition((FIXTURES / "vllm-cpu-seed" / "metrics-final.prom").read_text())
    assert final.engines[0].preemptions_total == 14.0  # README: "14 preemptions visible only in /metrics"


# --------------------------------------------------------------------------------------------
# The alias table: old and new names, vllm: and ray_vllm:
# --------------------------------------------------------------------------------------------

ALIAS_CASES = [
    ("v1_kv_cache_usage_perc", 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n', "kv_usage_ratio", 0.5),
    ("v0_gpu_cache_usage_perc", 'vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n', "kv_usage_ratio", 0.25),
    (
        "new_kv_name_wins_when_both_present_0_9_2_to_0_11",
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.1\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.7\n',
        "kv_usage_ratio",
        0.7,
    ),
    ("ray_vllm_prefix", 'ray_vllm:num_requests_running{engine="0",model_name="m"} 4\n', "running", 4.0),
    (
        "ray_vllm_underscore_prefix_0_10_2_opentelemetry",
        'ray_vllm_num_requests_running{ReplicaId="r",WorkerId="w",engine="0",model_name="m"} 4\n',
        "running",
        4.0,
    ),
    (
        "ray_vllm_underscore_counter_0_10_2",
        'ray_vllm_num_preemptions_total{engine="0",model_name="m"} 12.0\n',
        "preemptions_total",
        12.0,
    ),
    ("preemptions_with_total", 'vllm:num_preemptions_total{model_name="m"} 51\n', "preemptions_total", 51.0),
    ("preemptions_without_total_untyped", 'ray_vllm:num_preemptions{model_name="m"} 7\n', "preemptions_total", 7.0),
    (
        "preemptions_declared_counter_without_total",
        '# TYPE vllm:num_preemptions counter\nvllm:num_preemptions{model_name="m"} 9\n',
        "preemptions_total",
        9.0,
    ),
    (
        "old_gpu_prefix_cache_queries",
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 300\n',
        "prefix_cache_queries_total",
        300.0,
    ),
    (
        "old_gpu_prefix_cache_hits",
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 30\n',
        "prefix_cache_hits_total",
        30.0,
    ),
    (
        "new_prefix_name_wins",
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 1\nvllm:prefix_cache_hits_total{model_name="m"} 2\n',
        "prefix_cache_hits_total",
        2.0,
    ),
    (
        "waiting_by_reason_capacity",
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1\n',
        "waiting_capacity",
        3.0,
    ),
    (
        "waiting_by_reason_deferred",
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1\n',
        "waiting_deferred",
        1.0,
    ),
    ("v0_swapped", 'vllm:num_requests_swapped{model_name="m"} 2\n', "swapped", 2.0),
    (
        "vllm_prefix_wins_over_ray_for_one_engine",
        'ray_vllm:num_requests_waiting{engine="0",model_name="m"} 8\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 5\n',
        "waiting",
        5.0,
    ),
]


@pytest.mark.parametrize(("text", "field", "value"), [c[1:] for c in ALIAS_CASES], ids=[c[0] for c in ALIAS_CASES])
def test_alias_table_reads_every_name_a_version_used(text: str, field: str, value: float) -> None:
    assert getattr(_engine(text), field) == value


@pytest.mark.parametrize(
    ("text", "metric"),
    [
        ('vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n', "vllm:kv_cache_usage_perc"),
        ('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n', "vllm:gpu_cache_usage_perc"),
        ('ray_vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n', "ray_vllm:kv_cache_usage_perc"),
        ('ray_vllm_kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n', "ray_vllm_kv_cache_usage_perc"),
    ],
    ids=["v1", "v0_and_early_v1", "ray", "ray_underscore_0_10_2"],
)
def test_kv_usage_metric_names_the_series_used(text: str, metric: str) -> None:
    assert _engine(text).kv_usage_metric == metric


def test_alias_rows_state_versions_and_reasons_and_tables_do_not_overlap() -> None:
    read = {stem for alias in METRIC_ALIASES for stem in alias.stems}
    ignored = {stem for stems, _why in IGNORED_METRICS for stem in stems}
    assert not read & ignored
    assert all(alias.versions and alias.why for alias in METRIC_ALIASES)
    assert all(why for _stems, why in IGNORED_METRICS)
    assert [p for p, _why in PREFIXES] == ["vllm:", "ray_vllm:", "ray_vllm_"]
    fields = set(EngineSample.__dataclass_fields__) - {"model_name", "engine", "kv_usage_metric"}
    assert fields == {a.field for a in METRIC_ALIASES} - {"cache_config"}


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("vllm:num_requests_running", "read"),
        ("ray_vllm:num_preemptions", "read"),
        ("ray_vllm_num_requests_waiting", "read"),
        ("vllm:request_prompt_tokens_bucket", "read"),
        ("vllm:prompt_tokens_created", "read"),
        ("vllm:iteration_tokens_total_bucket", "ignored"),
        ("vllm:time_to_first_token_seconds_sum", "read"),
        ("vllm:inter_token_latency_seconds_sum", "ignored"),
        ("vllm:some_future_metric", None),
        ("process_cpu_seconds_total", None),
    ],
    ids=[
        "gauge",
        "ray_counter_without_total",
        "ray_underscore_name_0_10_2",
        "histogram_bucket",
        "created_series",
        "histogram_named_total",
        "read_ttft_for_analyze",
        "ignored_per_token_latency",
        "unknown_vllm_name",
        "not_vllm",
    ],
)
def test_catalogue_status(name: str, status: str | None) -> None:
    assert catalogue_status(name) == status


def test_an_unknown_vllm_metric_is_reported_as_uncatalogued() -> None:
    reading = read_exposition('vllm:num_requests_running{model_name="m"} 1\nvllm:brand_new_gauge{model_name="m"} 2\n')
    assert reading.uncatalogued == ("vllm:brand_new_gauge",)


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------

DP_SCRAPE = (
    "".join(
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} {u}\n'
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {r}\n'
        for e, u, r in (("10", 0.3, 1), ("1", 0.9, 7), ("0", 0.2, 2))
    )
    + 'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 0\n'
)


def test_one_result_per_engine_sorted_by_engine_number_never_averaged() -> None:
    snap = parse_exposition(DP_SCRAPE)
    assert [(e.engine, e.kv_usage_ratio, e.running) for e in snap.engines] == [
        ("0", 0.2, 2.0),
        ("1", 0.9, 7.0),
        ("10", 0.3, 1.0),
    ]


def test_api_server_series_without_engine_label_make_no_engine() -> None:
    assert [e.engine for e in parse_exposition(DP_SCRAPE).engines] == ["0", "1", "10"]


def test_two_models_are_two_results() -> None:
    text = 'vllm:num_requests_running{model_name="b"} 1\nvllm:num_requests_running{model_name="a"} 2\n'
    assert sorted((e.model_name, e.running) for e in parse_exposition(text).engines) == [("a", 2.0), ("b", 1.0)]


def test_v0_scrape_without_engine_label_has_engine_none() -> None:
    assert _engine('vllm:num_requests_running{model_name="m"} 1\n').engine is None


def test_duplicate_series_of_one_engine_keep_the_first_and_say_so() -> None:
    text = (
        'ray_vllm:num_requests_running{engine="0",model_name="m",ReplicaId="a"} 1\n'
        'ray_vllm:num_requests_running{engine="0",model_name="m",ReplicaId="b"} 5\n'
    )
    snap = parse_exposition(text)
    assert [e.running for e in snap.engines] == [1.0]
    assert any("ReplicaId" in example for example in snap.skipped_examples)


# --------------------------------------------------------------------------------------------
# Absent is null, never 0
# --------------------------------------------------------------------------------------------


def test_help_and_type_without_samples_give_no_engine_and_no_zeroes() -> None:
    reading = read_exposition("# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n")
    assert reading.snapshot.engines == ()
    assert "vllm:num_requests_running" in reading.vllm_names


def test_a_metric_present_with_zero_is_zero_and_the_others_are_none() -> None:
    engine = _engine('vllm:num_requests_waiting{model_name="m"} 0.0\n')
    assert engine.waiting == 0.0
    assert engine.running is None
    assert engine.kv_usage_ratio is None
    assert engine.kv_usage_metric is None
    assert engine.request_prompt_tokens is None


def test_a_nan_gauge_is_absent() -> None:
    assert _engine('vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n').kv_usage_ratio is None


# --------------------------------------------------------------------------------------------
# Histograms
# --------------------------------------------------------------------------------------------

HISTOGRAM = """# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{le="100.0",model_name="m"} 2.0
vllm:request_prompt_tokens_bucket{le="+Inf",model_name="m"} 10.0
vllm:request_prompt_tokens_bucket{le="1000.0",model_name="m"} 8.0
vllm:request_prompt_tokens_bucket{model_name="m",le="500.0"} 5.0
vllm:request_prompt_tokens_count{model_name="m"} 10.0
vllm:request_prompt_tokens_sum{model_name="m"} 4321.0
"""


def test_histogram_keeps_sorted_cumulative_buckets_whatever_the_label_order() -> None:
    hist = _engine(HISTOGRAM).request_prompt_tokens
    assert hist is not None
    assert (hist.count, hist.sum) == (10.0, 4321.0)
    assert hist.buckets == ((100.0, 2.0), (500.0, 5.0), (1000.0, 8.0), (float("inf"), 10.0))
    assert hist.quantile(0.5) == bucket_quantile(0.5, hist.buckets) == 500.0
    assert hist.quantile(0.95) == 1000.0  # rank in +Inf: the highest finite bound, as Prometheus does


def test_histogram_count_falls_back_to_the_inf_bucket_when_count_is_cut_off() -> None:
    text = "\n".join(line for line in HISTOGRAM.splitlines() if "_count" not in line) + "\n"
    hist = _engine(text).request_prompt_tokens
    assert hist is not None
    assert hist.count == 10.0


def test_request_num_preemptions_histogram_from_0_30() -> None:
    hist = parse_exposition(V032_SCRAPE.read_text()).engines[0].request_num_preemptions
    assert hist is not None
    assert (hist.count, hist.sum) == (89.0, 312.0)


# --------------------------------------------------------------------------------------------
# cache_config_info
# --------------------------------------------------------------------------------------------

LABEL_VALUES = [
    ("None", None),
    ("True", True),
    ("False", False),
    ("16", 16),
    ("0.9", 0.9),
    ("2.0", 2.0),
    ("1e-3", 0.001),
    ("auto", "auto"),
    ("[]", "[]"),
    ("fp8_e4m3", "fp8_e4m3"),
    ("nan", "nan"),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "typed"), LABEL_VALUES, ids=[f"{r or 'empty'}" for r, _ in LABEL_VALUES])
def test_cache_config_labels_are_typed(raw: str, typed: object) -> None:
    value = type_label_value(raw)
    assert value == typed
    assert type(value) is type(typed)


def test_cache_config_per_engine_and_top_level_is_engine_zero() -> None:
    text = (
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="90"} 1.0\n'
    )
    snap = parse_exposition(text)
    assert snap.cache_config == {"block_size": 16, "num_gpu_blocks": 90}
    assert snap.cache_config_by_engine["1"]["num_gpu_blocks"] == 100
    assert snap.engines == ()  # config is not an engine's state


def test_cache_config_without_engine_label_is_the_top_level_one() -> None:
    snap = parse_exposition('vllm:cache_config_info{block_size="16",sliding_window="None"} 1.0\n')
    assert snap.cache_config == {"block_size": 16, "sliding_window": None}
    assert snap.cache_config_by_engine == {"": {"block_size": 16, "sliding_window": None}}


# --------------------------------------------------------------------------------------------
# Damage from pasting
# --------------------------------------------------------------------------------------------

CLEAN = parse_exposition(V032_SCRAPE.read_text())


def _quote(text: str) -> str:
    return "".join(f"> {line}\n" for line in text.splitlines())


def _drop_hashes(text: str) -> str:
    return re.sub(r"^# (HELP|TYPE) ", r"\1 ", text, flags=re.MULTILINE)


def _hard_wrap(width: int) -> Any:
    """A terminal's hard wrap: every line cut into pieces of ``width`` characters."""

    def wrap(text: str) -> str:
        pieces = [line[i : i + width] for line in text.splitlines() for i in range(0, max(len(line), 1), width)]
        return "\n".join(pieces) + "\n"

    return wrap


DAMAGE = [
    ("blockquote", _quote),
    ("nested_blockquote", lambda t: _quote(_quote(t))),
    ("help_type_without_hash", _drop_hashes),
    ("blockquote_and_no_hash", lambda t: _quote(_drop_hashes(t))),
    ("double_hash_headings", lambda t: re.sub(r"^# (HELP|TYPE) ", r"## \1 ", t, flags=re.MULTILINE)),
    ("crlf_and_code_fence", lambda t: "```\r\n" + t.replace("\n", "\r\n") + "```\r\n"),
    ("inline_backticks", lambda t: "".join(f"`{line}`\n" for line in t.splitlines())),
    ("hard_wrapped_at_159_columns", _hard_wrap(159)),
    ("hard_wrapped_at_80_columns_inside_values_and_type_lines", _hard_wrap(80)),
]


@pytest.mark.parametrize("damage", [d[1] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_pasted_damage_is_repaired_to_the_clean_reading(damage: Any) -> None:
    snap = parse_exposition(damage(V032_SCRAPE.read_text()))
    assert snap.engines == CLEAN.engines
    assert snap.cache_config == CLEAN.cache_config
    assert snap.skipped_lines == 0


def test_one_bad_line_costs_only_that_line_and_is_reported_by_number() -> None:
    lines = V032_SCRAPE.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    lines.insert(at, 'vllm:num_requests_waiting{engine="0",model_name="tiny-llama" 99 oops')
    snap = parse_exposition("\n".join(lines) + "\n")
    assert snap.engines == CLEAN.engines
    assert snap.skipped_lines == 1
    assert snap.skipped_examples[0].startswith(f"line {at + 1}: ")
    assert "99" not in snap.skipped_examples[0]  # the reason, never the line's values


def test_a_truncated_last_line_is_skipped_and_the_rest_is_read() -> None:
    text = 'vllm:num_requests_running{engine="0",model_name="m"} 3\nvllm:num_requests_waiting{engine="0",mod'
    snap = parse_exposition(text)
    assert snap.engines[0].running == 3.0
    assert snap.engines[0].waiting is None
    assert snap.skipped_lines == 1


def test_skipped_examples_never_copy_request_content() -> None:
    text = (
        "INFO 11-29 14:02:03 [logger.py:41] Received request cmpl-1: prompt: 'my secret plan', params\n"
        'vllm:num_requests_running{model_name="m"} 1\n'
    )
    snap = parse_exposition(text)
    assert snap.skipped_lines == 1
    assert "secret" not in repr(snap)


def test_curly_quotes_and_non_breaking_spaces_from_rich_text_copy_are_straightened() -> None:
    text = (
        "vllm:num_requests_running{engine=\u201c0\u201d,model_name=\u201cm\u201d}\u00a03\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4\n'
    )
    snap = parse_exposition(text)
    assert [(e.engine, e.model_name, e.running, e.waiting) for e in snap.engines] == [("0", "m", 3.0, 4.0)]
    assert snap.skipped_lines == 0


def test_a_wrapped_line_is_not_glued_to_a_line_that_reads_on_its_own() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        'vllm:num_requests_waiting{engine="0",mo\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    snap = parse_exposition(text)
    assert (snap.engines[0].running, snap.engines[0].waiting, snap.engines[0].kv_usage_ratio) == (3.0, None, 0.5)
    assert snap.skipped_lines == 1


def test_a_type_line_with_an_unknown_kind_is_not_guessed() -> None:
    repaired = repair_exposition("TYPE vllm:num_requests_running sometimes\n")
    assert repaired[0].skip_reason is not None


def test_prose_starting_with_help_is_not_a_metric() -> None:
    snap = parse_exposition('HELP me please\nvllm:num_requests_running{model_name="m"} 1\n')
    assert snap.engines[0].running == 1.0
    assert snap.skipped_lines == 1


def test_parse_exposition_returns_the_shared_record() -> None:
    assert isinstance(parse_exposition(""), MetricsSnapshot)
    assert parse_exposition("").engines == ()


def test_blank_lines_inside_a_cut_cache_config_info_are_joined_over_0_8_x_issue_16560() -> None:
    # the reporter set 'num_gpu_blocks="None",' apart with blank lines to point at it
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_cpu_blocks="None",\n'
        "\n"
        'num_gpu_blocks="None",\n'
        "\n"
        'sliding_window="None",swap_space_bytes="4294967296"} 1.0\n'
        "\n"
        'vllm:num_requests_running{model_name="m"} 2.0\n'
    )
    snap = parse_exposition(text)
    assert snap.cache_config == {
        "block_size": 16,
        "enable_prefix_caching": True,
        "num_cpu_blocks": None,
        "num_gpu_blocks": None,
        "sliding_window": None,
        "swap_space_bytes": 4294967296,
    }
    assert [(e.model_name, e.running) for e in snap.engines] == [("m", 2.0)]
    assert snap.skipped_lines == 0


ELIDED = (
    'vllm:num_requests_waiting{engine="0",model_name="m"} 6.0\n'
    'vllm:num_requests_waiting_by_reason{...,reason="capacity"} 6.0\n'
    'vllm:num_requests_waiting_by_reason{...,reason="deferred"} 0.0\n'
    'vllm:cache_config_info{...,num_gpu_blocks="118",kv_cache_size_tokens="90000",...} 1.0\n'
)


def test_label_sets_elided_with_dots_belong_to_the_only_engine_vllm_metal_0_2x() -> None:
    snap = parse_exposition(ELIDED)
    assert [(e.engine, e.model_name, e.waiting, e.waiting_capacity, e.waiting_deferred) for e in snap.engines] == [
        ("0", "m", 6.0, 6.0, 0.0)
    ]
    assert snap.cache_config == {"kv_cache_size_tokens": 90000, "num_gpu_blocks": 118}
    assert snap.skipped_lines == 0


def test_elided_label_sets_are_not_given_an_engine_when_there_are_several() -> None:
    text = ELIDED + 'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0\n'
    snap = parse_exposition(text)
    assert [(e.engine, e.waiting, e.waiting_capacity) for e in snap.engines] == [("0", 6.0, None), ("1", 2.0, None)]
    assert any("elided" in example for example in snap.skipped_examples)


@pytest.mark.parametrize(
    ("line", "config"),
    [
        ('> vllm:cache_config_info{block_size="16", ...}\n', {"block_size": 16}),
        ('vllm:cache_config_info{block_size="16",\u2026} 1.0\n', {"block_size": 16}),
        ('vllm:cache_config_info{block_size="16",cache_dtype="auto",...\n', {"block_size": 16, "cache_dtype": "auto"}),
        ('vllm:cache_config_info{block_size="16", \u2026\n', {"block_size": 16}),
        ('vllm:cache_config_info{block_size="16",cache_dtype="au...\n', {}),
    ],
    ids=[
        "quoted_without_value_issue_42966",
        "unicode_ellipsis",
        "cut_short_with_dots",
        "cut_short_with_unicode_ellipsis",
        "cut_inside_a_value_is_not_guessed",
    ],
)
def test_an_elided_info_line_still_gives_its_labels(line: str, config: dict[str, object]) -> None:
    assert parse_exposition(line).cache_config == config


def test_an_elided_gauge_without_value_is_not_guessed() -> None:
    snap = parse_exposition('vllm:num_requests_running{model_name="m", ...}\n')
    assert snap.engines == ()
    assert snap.skipped_lines == 1


@pytest.mark.parametrize(
    "text",
    [
        'vllm:num_requests_running{engine="1", instance="h:8000", job="vllm", model_name="m"} | 3\n-- | --\n',
        '| vllm:num_requests_running{engine="1",model_name="m"} | 3 |\n|---|---|\n',
    ],
    ids=["prometheus_ui_table_0_10_2_pr_24049", "markdown_table_with_outer_bars"],
)
def test_prometheus_ui_table_rows_pasted_as_markdown_are_read(text: str) -> None:
    snap = parse_exposition(text)
    assert [(e.engine, e.model_name, e.running) for e in snap.engines] == [("1", "m", 3.0)]
    assert snap.skipped_lines == 0


def test_a_bar_inside_a_label_value_is_not_a_table() -> None:
    text = 'vllm:num_requests_running{model_name="a | 3"} 1\n'
    assert [(e.model_name, e.running) for e in parse_exposition(text).engines] == [("a | 3", 1.0)]


def test_a_stray_piece_before_a_wrapped_sample_is_not_glued_into_its_name() -> None:
    # a shell prompt wrapped at 80 columns leaves 'ime_to'; prometheus_client would read
    # 'ime_to...ray_vllm_...{...} 266.0' as one sample with dots in its name (vLLM PR 24267 paste)
    text = (
        "$ curl localhost:8085 | grep vllm_t\n"
        "ime_to\n"
        "...\n"
        'ray_vllm_time_to_first_token_seconds_count{Component="core_worker",NodeAddress="10.1\n'
        '.113.171",engine="0",model_name="qwen-0.5b"} 266.0\n'
    )
    assert [(e.engine, e.model_name) for e in parse_exposition(text).engines] == [("0", "qwen-0.5b")]


@pytest.mark.parametrize("width", [40, 80], ids=["wrapped_at_40", "wrapped_at_80"])
def test_an_elided_label_set_wrapped_by_a_terminal_is_still_read(width: int) -> None:
    text = "".join(line[i : i + width] + "\n" for line in ELIDED.splitlines() for i in range(0, len(line), width))
    snap = parse_exposition(text)
    assert [(e.engine, e.waiting, e.waiting_capacity) for e in snap.engines] == [("0", 6.0, 6.0)]
    assert snap.cache_config == {"kv_cache_size_tokens": 90000, "num_gpu_blocks": 118}


@pytest.mark.parametrize(
    "text",
    [
        '- vllm:num_requests_running{engine="0",model_name="m"} 3.0\n* # TYPE vllm:num_requests_waiting gauge\n',
        '+ vllm:num_requests_running{engine="0",model_name="m"} 3.0\n',
        'vllm:num_requests_running{engine=\\"0\\",model_name=\\"m\\"} 3.0\n',
        "vllm:num_requests_running{engine=&quot;0&quot;,model_name=&quot;m&quot;} 3.0\n",
        '`| vllm:num_requests_running{engine="0",model_name="m"} | 3 |`\n',
    ],
    ids=[
        "markdown_list_items",
        "plus_list_item",
        "json_escaped_quotes",
        "html_escaped_quotes",
        "table_row_in_backticks",
    ],
)
def test_markdown_lists_and_escaped_quotes_are_undone(text: str) -> None:
    snap = parse_exposition(text)
    assert [(e.engine, e.model_name, e.running) for e in snap.engines] == [("0", "m", 3.0)]
    assert snap.skipped_lines == 0


def test_a_dash_that_is_not_a_list_marker_stays() -> None:
    assert parse_exposition("-1 vllm:num_requests_running 3\n").engines == ()
