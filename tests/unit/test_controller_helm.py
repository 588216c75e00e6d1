"""The Helm chart: generated from the plain manifests without drift, values all declared.

Real Helm (lint, template, install, upgrade, uninstall) runs in tests/e2e/test_helm_chart.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "helm" / "gpupack"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("helm_generate", ROOT / "manifests" / "helm" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_matches_the_manifests_it_is_generated_from() -> None:
    rendered = _generator().render()
    committed = {str(p.relative_to(CHART)): p.read_text() for p in CHART.rglob("*.yaml")
                 if p.parent.name in ("templates", "crds")}
    assert set(rendered) == set(committed), "run python manifests/helm/generate.py"
    for name, text in rendered.items():
        assert committed[name] == text, f"{name} drifted from manifests/; run python manifests/helm/generate.py"


def test_every_value_a_template_uses_is_declared() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    used = set()
    for path in (CHART / "templates").glob("*.yaml"):
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", path.read_text()))
    assert used
    for dotted in sorted(used):
        node: Any = values
        for part in dotted.split("."):
            assert isinstance(node, dict) and part in node, f".Values.{dotted} is not in values.yaml"
            node = node[part]


def test_the_optional_parts_are_off_by_default_behind_their_values() -> None:
    """What the kustomize install leaves out (manifests/gpu-fault-evictions, manifests/prometheus-rules)
    the chart renders only when asked; tests/e2e/test_helm_chart.py compares both ways with kustomize."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["controller"]["evictOnGpuFault"] is False and values["prometheusRules"]["enabled"] is False
    assert values["controller"]["rightSizingRecreate"] is False
    for name in ("right-sizing-recreate-rbac.yaml", "right-sizing-recreate-deployment-policy.yaml"):
        lines = (CHART / "templates" / name).read_text().splitlines()
        assert lines[1] == "{{- if and .Values.controller.enabled .Values.controller.rightSizingRecreate }}", name
        assert lines[-1] == "{{- end }}", name
    evictions = (CHART / "templates" / "gpu-fault-evictions-rbac.yaml").read_text().splitlines()
    assert evictions[1] == "{{- if and .Values.controller.enabled .Values.controller.evictOnGpuFault }}"
    assert evictions[-1] == "{{- end }}"
    deployment = (CHART / "templates" / "controller-deployment.yaml").read_text()
    assert "- {name: GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT, value: {{ .Values.controller.evictOnGpuFault | quote }}}" \
        in deployment


def test_the_dra_pool_renders_only_with_dra_enabled_and_the_device_classes_only_where_served() -> None:
    """manifests/agent-dra (opt-in in kustomize) is behind ``dra.enabled``, off by default; the node agent's
    admission policies and RBAC render for either agent (a DRA-only install keeps its own-node policies);
    the DeviceClasses need resource.k8s.io/v1, which the chart's kubeVersion does not promise.
    tests/e2e/test_helm_chart.py renders both ways with real Helm."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["dra"]["enabled"] is False
    templates = CHART / "templates"
    dra = sorted(p.name for p in templates.glob("agent-dra-*.yaml"))
    assert dra == ["agent-dra-daemonset.yaml", "agent-dra-rbac.yaml"]
    for name in dra:
        lines = (templates / name).read_text().splitlines()
        assert lines[1] == "{{- if .Values.dra.enabled }}" and lines[-1] == "{{- end }}", name
    either = "{{- if or .Values.agent.enabled .Values.dra.enabled }}"
    for name in ("agent-node-restriction-policy.yaml", "agent-rbac-policies.yaml"):
        assert (templates / name).read_text().splitlines()[1] == either, name
    assert (templates / "agent-daemonset.yaml").read_text().splitlines()[1] == "{{- if .Values.agent.enabled }}"
    classes = (templates / "dra-deviceclasses.yaml").read_text()
    assert classes.splitlines()[1] == '{{- if .Capabilities.APIVersions.Has "resource.k8s.io/v1" }}'
    assert classes.count("kind: DeviceClass") == 3
