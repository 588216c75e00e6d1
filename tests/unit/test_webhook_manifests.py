"""The webhook's manifests agree with each other and with the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.app import build_app
from webhook.inventory_source import InventoryHolder
from webhook.settings import WebhookSettings

DIR = Path(__file__).resolve().parents[2] / "manifests" / "webhook"


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    return load("deployment.yaml")[0]


def test_kustomization_lists_every_manifest() -> None:
    listed = set(load("kustomization.yaml")[0]["resources"])
    assert listed == {p.name for p in DIR.glob("*.yaml")} - {"kustomization.yaml"}


def test_deployment_is_highly_available(deployment: dict[str, Any]) -> None:
    spec = deployment["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = load("pdb.yaml")[0]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    container = spec["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]


def test_probes_hit_routes_the_app_serves(deployment: dict[str, Any]) -> None:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    routes = build_app(InventoryHolder(), WebhookSettings()).paths
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in routes
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert {"/mutate", "/validate", "/metrics"} <= routes


def test_service_and_certificate_wiring(deployment: dict[str, Any]) -> None:
    service = load("service.yaml")[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}
    cert = [d for d in load("certificate.yaml") if d["kind"] == "Certificate" and not d["spec"].get("isCA")][0]
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]
    assert f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc" in cert["spec"]["dnsNames"]


@pytest.mark.parametrize("name", ["mutating.yaml", "validating.yaml"])
def test_webhook_configurations(name: str) -> None:
    config = load(name)[0]
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "gpupack-system/gpupack-webhook"
    for hook in config["webhooks"]:
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert 1 <= hook["timeoutSeconds"] <= 10
        assert hook["clientConfig"]["service"]["path"] in ("/mutate", "/validate")


def test_mutating_webhook_spares_system_namespaces_and_non_gpu_pods() -> None:
    hook = load("mutating.yaml")[0]["webhooks"][0]
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    excluded = {
        v
        for e in hook["namespaceSelector"]["matchExpressions"]
        if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
        for v in e["values"]
    }
    assert {"kube-system", "gpupack-system"} <= excluded
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert "gpupack.io/" in hook["matchConditions"][0]["expression"]
