"""Grafana dashboards (dashboards/*.json): shape, variables, the "why is it waiting?" story, names, syntax."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from kvwatch.export.catalogue import CATALOGUE, exposed_names
from tests.conftest import require_binary
from tests.generated_files import (
    DASHBOARDS,
    FLEET,
    GEN,
    INSTANCE,
    RECORD_NAMES,
)
from tests.generated_files import panels as _panels
from tests.generated_files import queries as _queries


def test_the_two_dashboards_are_the_generated_ones() -> None:
    assert set(DASHBOARDS) == {p.name for p in GEN.dashboards()}


@pytest.mark.parametrize("name", sorted(DASHBOARDS), ids=sorted(DASHBOARDS))
def test_dashboard_has_fixed_uid_tags_and_datasource_model_pod_engine_variables(name: str) -> None:
    dashboard = DASHBOARDS[name]
    assert dashboard["uid"] == name.removesuffix(".json")
    assert "kvwatch" in dashboard["tags"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for var in ("model", "pod", "engine"):
        assert variables[var]["type"] == "query"
        assert variables[var]["includeAll"] is True
        # Outside Kubernetes a series may have no pod label: ".*" matches the empty value too.
        assert variables[var]["allValue"] == ".*"


@pytest.mark.parametrize("name", sorted(DASHBOARDS), ids=sorted(DASHBOARDS))
def test_every_panel_uses_the_datasource_variable_and_a_free_grid_cell(name: str) -> None:
    dashboard = DASHBOARDS[name]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in _panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        mine = {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


@pytest.mark.parametrize(
    ("topic", "names"),
    [
        ("pool", {"kvwatch_kv_pool_tokens"}),
        ("bytes-per-token", {"kvwatch_kv_bytes_per_token"}),
        ("running-vs-ceiling-at-p95", {"kvwatch_observed_running_requests", "kvwatch_max_concurrency"}),
        ("waiting", {"kvwatch_observed_waiting_requests"}),
        ("kv-usage", {"kvwatch_observed_kv_usage_ratio"}),
        ("saturation-state", {"kvwatch_saturation_state"}),
        ("preemption-rate", {"kvwatch_preemptions_total"}),
        ("prefix-hit-rate", {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}),
        ("what-if-levers", {"kvwatch_whatif_max_concurrency"}),
        ("reconcile-status", {"kvwatch_reconcile_ratio"}),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_instance_dashboard_answers_why_is_it_waiting(topic: str, names: set[str]) -> None:
    # All names of a topic in one panel: "running vs the ceiling" means on the same axes.
    panels = [{n for q in p["targets"] for n in GEN.metric_names(q["expr"])} for p in _panels(INSTANCE)]
    assert any(names <= found for found in panels), f"no panel shows {topic}"


def test_instance_dashboard_shows_saturation_state_over_time_and_ceiling_at_observed_p95() -> None:
    timelines = [p for p in _panels(INSTANCE) if p["type"] == "state-timeline"]
    assert any("kvwatch_saturation_state" in t["expr"] for p in timelines for t in p["targets"])
    assert any('basis="observed_p95"' in q for q in _queries(INSTANCE))


def test_instance_dashboard_filters_every_per_engine_query_by_model_pod_and_engine() -> None:
    per_engine = {m.name for m in CATALOGUE if m.per_engine} | set(GEN.VLLM_SERIES)
    for expr in _queries(INSTANCE):
        for selector_name in GEN.metric_names(expr) & per_engine:
            for part in expr.split(selector_name)[1:]:
                assert part.startswith("{"), f"{selector_name} unfiltered in {expr}"
                matchers = part[: part.index("}")]
                assert {'model_name=~"$model"', 'pod=~"$pod"', 'engine=~"$engine"'} <= set(matchers[1:].split(","))


def test_fleet_dashboard_reads_recording_rules_by_model() -> None:
    names = {n for q in _queries(FLEET) for n in GEN.metric_names(q)}
    assert names & RECORD_NAMES
    assert {
        "model_name:kvwatch_kv_pool_tokens:sum",
        "model_name:kvwatch_kv_usage:ratio",
        "model_name:kvwatch_memory_bound_pods:count",
        "model_name:kvwatch_running_requests:sum",
        "model_name:kvwatch_waiting_requests:sum",
    } <= names


@pytest.mark.parametrize("name", sorted(DASHBOARDS), ids=sorted(DASHBOARDS))
def test_dashboard_queries_use_only_catalogued_kvwatch_names_vllm_names_or_our_records(name: str) -> None:
    dashboard = DASHBOARDS[name]
    allowed = exposed_names() | set(GEN.VLLM_SERIES) | RECORD_NAMES
    queries = _queries(dashboard) + [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {n for q in queries for n in GEN.metric_names(q)}
    assert used
    assert used <= allowed, sorted(used - allowed)
    # Annotations may also read Prometheus's own ALERTS series.
    for annotation in dashboard["annotations"]["list"]:
        assert GEN.metric_names(annotation["expr"]) <= allowed | {"ALERTS"}


@pytest.mark.prometheus
def test_every_dashboard_query_parses_with_promtool(tmp_path: Path) -> None:
    # promtool has no "check query"; a rules file with one recording rule per query parses each.
    promtool = require_binary("promtool")
    queries = [GEN.as_promql(q) for d in DASHBOARDS.values() for q in _queries(d)]
    queries += [GEN.as_promql(a["expr"]) for d in DASHBOARDS.values() for a in d["annotations"]["list"]]
    rules = {"groups": [{"name": "q", "rules": [{"record": f"q:{i}:q", "expr": q} for i, q in enumerate(queries)]}]}
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


@pytest.mark.prometheus
def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    # The parse check above must be able to fail.
    promtool = require_binary("promtool")
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": [{"record": "q:0:q", "expr": "sum by (("}]}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
