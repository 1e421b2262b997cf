"""What operators deploy: Kubernetes manifests (schema-validated offline), Dockerfile, docker-compose."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed
import pytest
import yaml

from tests.conftest import ROOT, require_binary
from tests.generated_files import GEN, RULE_DOC

K8S = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "deploy" / "compose"
KUBERNETES_VERSION = "1.30.0"  # oldest Kubernetes still widely run; the manifests use nothing newer

MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
CORE_KINDS = {"Deployment", "Service", "ConfigMap"}


def _load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _by_kind(kind: str) -> dict[str, Any]:
    docs = [d for d in map(_load, MANIFESTS) if d["kind"] == kind]
    assert len(docs) == 1, kind
    return docs[0]


def _containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


# Strategic-merge keys of the lists the wrapper patch touches (Kubernetes API: patchMergeKey).
MERGE_KEYS = {"containers": "name", "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort",
              "env": "name"}  # fmt: skip


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """The subset of kubectl's strategic merge the wrapper patch uses: maps merge, lists with a
    merge key merge by it (``$patch: delete`` removes an item), other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base.get(k), v, k) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        out_list = [copy.deepcopy(item) for item in base]
        for item in patch:
            match = [i for i, b in enumerate(out_list) if b.get(mk) == item.get(mk)]
            if item.get("$patch") == "delete":
                assert match, f"patch deletes a missing {key} item {item}"
                del out_list[match[0]]
            elif match:
                out_list[match[0]] = strategic_merge(out_list[match[0]], item)
            else:
                out_list.append(item)
        return out_list
    return patch


def wrapper_deployment() -> dict[str, Any]:
    """deployment.yaml with wrapper/deployment-patch.yaml applied, as kustomize would."""
    patch = _load(K8S / "wrapper" / "deployment-patch.yaml")
    base = _load(K8S / "deployment.yaml")
    assert (patch["kind"], patch["metadata"]["name"]) == (base["kind"], base["metadata"]["name"])
    return strategic_merge(base, patch)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------ schema validation


@pytest.mark.parametrize(
    "path", [p for p in MANIFESTS if _load(p)["kind"] in CORE_KINDS], ids=lambda p: p.name
)  # fmt: skip
def test_core_manifest_validates_against_the_kubernetes_schema(path: Path) -> None:
    kubernetes_validate.validate(_load(path), KUBERNETES_VERSION, strict=True)


def test_wrapper_mode_deployment_validates_against_the_kubernetes_schema() -> None:
    kubernetes_validate.validate(wrapper_deployment(), KUBERNETES_VERSION, strict=True)


def test_schema_validation_rejects_a_broken_deployment() -> None:
    broken = _load(K8S / "deployment.yaml")
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest_and_only_existing_files() -> None:
    resources = _load(K8S / "kustomization.yaml")["resources"]
    assert sorted(resources) == sorted(p.name for p in MANIFESTS)
    wrapper = _load(K8S / "wrapper" / "kustomization.yaml")
    assert wrapper["resources"] == [".."]
    assert all((K8S / "wrapper" / p["path"]).exists() for p in wrapper["patches"])


# ------------------------------------------------------------------------ CRDs (no bundled schema)


def test_prometheus_rule_carries_exactly_the_rules_file() -> None:
    rule = _by_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"]
    assert rule["spec"] == RULE_DOC


def test_dashboards_configmap_carries_exactly_the_dashboard_files() -> None:
    configmap = _by_kind("ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "dashboards").glob("*.json")}
    assert configmap["data"] == files
    for text in configmap["data"].values():
        assert json.loads(text)["uid"]


def test_pod_monitor_scrapes_kvwatch_and_vllm_ports_of_the_deployment_under_the_rules_job_names() -> None:
    monitor = _by_kind("PodMonitor")
    deployment = _by_kind("Deployment")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["name"] for c in _containers(deployment).values() for p in c.get("ports", [])}
    jobs = {}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"
        (relabel,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        jobs[relabel["replacement"]] = endpoint["port"]
    # The rules select job="kvwatch" and job="vllm" (Settings in deploy/generate.py).
    assert jobs == {"kvwatch": "kvwatch-metrics", "vllm": "http"}
    assert {GEN.DEFAULT.kvwatch_selector, GEN.DEFAULT.vllm_selector} == {f'job="{job}"' for job in jobs}


def test_service_targets_named_container_ports() -> None:
    service = _by_kind("Service")
    deployment = _by_kind("Deployment")
    ports = {p["name"] for c in _containers(deployment).values() for p in c.get("ports", [])}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


# ---------------------------------------------------------------------------------- the two modes


def test_sidecar_mode_shares_vllm_output_through_a_tee_into_the_file_kvwatch_follows() -> None:
    deployment = _by_kind("Deployment")
    containers = _containers(deployment)
    vllm, kvwatch = containers["vllm"], containers["kvwatch"]
    log_arg = next(a for a in kvwatch["args"] if a.startswith("--log="))
    log_path = Path(log_arg.removeprefix("--log="))
    script = " ".join(vllm["command"] + vllm["args"])
    assert f"tee -a {log_path}" in script
    assert "exec vllm serve" in script
    mounts = {m["name"]: m for m in kvwatch["volumeMounts"]}
    vllm_mounts = {m["name"]: m for m in vllm["volumeMounts"]}
    shared = [n for n in mounts if n in vllm_mounts and str(log_path).startswith(mounts[n]["mountPath"])]
    assert shared, "kvwatch and vllm do not share the log volume"
    assert mounts[shared[0]]["readOnly"] is True
    assert "emptyDir" in {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}[shared[0]]
    assert "--metrics-url=http://127.0.0.1:8000/metrics" in kvwatch["args"]
    assert kvwatch["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert kvwatch["securityContext"]["runAsNonRoot"] is True


def test_wrapper_mode_runs_vllm_as_a_child_of_kvwatch_in_one_container() -> None:
    deployment = wrapper_deployment()
    containers = _containers(deployment)
    assert set(containers) == {"vllm"}
    container = containers["vllm"]
    assert container["command"] == ["kvwatch"]
    args = container["args"]
    assert args[0] == "run"
    assert args[args.index("--") + 1 : args.index("--") + 3] == ["vllm", "serve"]
    assert {p["name"] for p in container["ports"]} == {"http", "kvwatch-metrics"}
    volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} <= volumes
    assert "vllm-log" not in volumes


def _cli_flags(command: str) -> set[str]:
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "kvwatch"), command, "--help"],
        capture_output=True,
        text=True,
        check=False,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb"},
    )
    assert result.returncode == 0, result.stderr
    return set(re.findall(r"--[a-z][a-z0-9-]+", result.stdout))


def _flags(args: list[str]) -> set[str]:
    until = args.index("--") if "--" in args else len(args)
    return {a.split("=", 1)[0] for a in args[:until] if a.startswith("--")}


def _compose_kvwatch_command() -> list[str]:
    compose = yaml.safe_load((COMPOSE / "docker-compose.yaml").read_text(encoding="utf-8"))
    return list(compose["services"]["kvwatch"]["command"])


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("watch", _containers(_by_kind("Deployment"))["kvwatch"]["args"]),
        ("run", _containers(wrapper_deployment())["vllm"]["args"]),
        ("watch", _compose_kvwatch_command()),
    ],
    ids=["kubernetes-sidecar", "kubernetes-wrapper", "compose"],
)
def test_deployed_kvwatch_arguments_are_flags_the_cli_accepts(command: str, args: list[str]) -> None:
    assert args[0] == command
    flags = _flags(args[1:])
    assert flags
    assert flags <= _cli_flags(command)


# ---------------------------------------------------------------------------- Dockerfile, compose


def test_dockerfile_builds_a_non_root_kvwatch_image_on_python_311_slim() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line.split(None, 1) for line in text.splitlines() if line and not line.startswith("#")]
    assert [i[1] for i in instructions if i[0] == "FROM"] == ["python:3.11-slim"]
    assert "pip install /src" in text
    user = [i[1] for i in instructions if i[0] == "USER"][-1]
    assert user.split(":")[0] not in {"root", "0"}
    assert [i[1] for i in instructions if i[0] == "EXPOSE"] == ["9400"]
    assert [i[1] for i in instructions if i[0] == "ENTRYPOINT"] == ['["kvwatch"]']
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    assert ignore[ignore.index("*") :][:2] == ["*", "!pyproject.toml"], "context is whitelisted, .venv stays out"


def test_compose_runs_vllm_kvwatch_prometheus_grafana_with_existing_mounts() -> None:
    compose = yaml.safe_load((COMPOSE / "docker-compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert set(services) == {"vllm", "kvwatch", "prometheus", "grafana"}
    assert services["kvwatch"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE / services["kvwatch"]["build"]["context"] / "deploy" / "Dockerfile").exists()
    named = set(compose["volumes"])
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE / source).exists(), source
            else:
                assert source in named, source
    mounts = dict(v.split(":")[:2] for v in services["prometheus"]["volumes"])
    assert (COMPOSE / mounts["../prometheus/kvwatch-rules.yaml"]).name == "kvwatch-rules.yaml"
    assert "--metrics-url=http://vllm:8000/metrics" in services["kvwatch"]["command"]


@pytest.mark.prometheus
def test_compose_prometheus_config_passes_promtool_and_uses_the_rules_job_names(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    config = yaml.safe_load((COMPOSE / "prometheus.yml").read_text(encoding="utf-8"))
    assert {j["job_name"] for j in config["scrape_configs"]} == {"kvwatch", "vllm"}
    assert GEN.DEFAULT.kvwatch_selector == 'job="kvwatch"'
    # Point the container path at the repository's rules file so promtool also checks the rules.
    config["rule_files"] = [str(ROOT / "deploy" / "prometheus" / "kvwatch-rules.yaml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
