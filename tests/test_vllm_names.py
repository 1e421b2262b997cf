"""Every vLLM series a dashboard or rule queries is a row of kvwatch's one table of vLLM metric names.

The table (kvwatch/parse/metricnames.py) is what the metrics reader reads through; deploy/generate.py
names its vLLM series through ``vllm_series``, which refuses a name the table lacks. Here the
generated files themselves are checked, so a hand edit or a new query cannot slip a name past it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvwatch.parse.metricnames import METRIC_ALIASES, catalogue_status, exposed_names, vllm_series

ROOT = Path(__file__).resolve().parent.parent
GENERATED = [
    *sorted((ROOT / "dashboards").glob("*.json")),
    ROOT / "deploy" / "prometheus" / "kvwatch-rules.yaml",
    ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml",
    ROOT / "deploy" / "kubernetes" / "dashboards-configmap.yaml",
]
VLLM_NAME = re.compile(r"\b(?:ray_)?vllm[:_][a-z_]+[a-z]")


def _vllm_names(path: Path) -> set[str]:
    # Only PromQL-shaped uses: a vLLM name followed by a selector, a range or the end of a token.
    return {m.group(0) for m in VLLM_NAME.finditer(path.read_text()) if ":" in m.group(0)}


@pytest.mark.parametrize("path", GENERATED, ids=[p.name for p in GENERATED])
def test_every_vllm_name_in_dashboards_and_rules_is_in_the_table(path: Path) -> None:
    names = _vllm_names(path)
    missing = sorted(n for n in names if catalogue_status(n) is None)
    assert missing == [], f"{path.name} queries vLLM series the name table lacks: {missing}"


def test_the_dashboards_and_rules_query_some_vllm_series() -> None:
    """The check above is not vacuous: the generated files do read vLLM's own series."""
    assert set().union(*(_vllm_names(p) for p in GENERATED)) >= {"vllm:num_preemptions_total"}


def test_a_name_the_table_lacks_is_refused_by_the_generator_helper() -> None:
    with pytest.raises(ValueError, match=r"vllm:made_up_series_total not in kvwatch/parse/metricnames\.py"):
        vllm_series({"vllm:made_up_series_total": "a dashboard wants it"})


def test_every_read_row_is_recognised_under_each_of_its_names() -> None:
    for alias in METRIC_ALIASES:
        for name in exposed_names(alias):
            assert catalogue_status(name) == "read", name
