"""The generated operator files (rules, dashboards) and their generator, loaded once for the tests.

Shared by the rule, dashboard, Kubernetes and Prometheus end-to-end tests (test modules never
import each other).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import yaml

from tests.conftest import ROOT

PROM_DIR = ROOT / "deploy" / "prometheus"
RULES = PROM_DIR / "kvwatch-rules.yaml"
RULE_TESTS = PROM_DIR / "kvwatch-rules.test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"


def load_generator() -> ModuleType:
    """deploy/generate.py as a module (it is a script, not part of the kvwatch package)."""
    name = "kvwatch_deploy_generate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "deploy" / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


GEN = load_generator()
RULE_DOC: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
ALL_RULES: list[dict[str, Any]] = [r for g in RULE_DOC["groups"] for r in g["rules"]]
ALERTS = [r for r in ALL_RULES if "alert" in r]
RECORDS = [r for r in ALL_RULES if "record" in r]
RULE_TEST_DOC: dict[str, Any] = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
DASHBOARD_FILES = sorted((ROOT / "dashboards").glob("*.json"))
DASHBOARDS: dict[str, dict[str, Any]] = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in DASHBOARD_FILES}
INSTANCE = DASHBOARDS["kvwatch-instance.json"]
FLEET = DASHBOARDS["kvwatch-fleet.json"]
RECORD_NAMES = {r["record"] for r in RECORDS}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [expr for _, expr in GEN.panel_queries(dashboard)]
