"""A tenant's own ResourceClaims on gpupack's DeviceClasses, with the tenant's own token, on the real
control plane (issue 33, item 3, DRA pool).

``check_claim`` bounded ``count`` only on ``gpupack-shared``: a tenant's claim on ``gpupack-mig`` with
``count: 4`` (or 20) was stored and got that many MIG placements for one pod, also in a namespace whose
SharingPolicy allows only ``mps``. Now the count is bounded on every class and the claim's namespace's
policy applies, as it does to the webhook's decision for a pod of that namespace.

The webhook and its DRA node are ``tests/e2e/test_dra_webhook.py``'s fixtures.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.tenants import tenant_client
from tests.e2e.test_dra_webhook import dra_namespace, dra_webhook  # noqa: F401 (fixtures)
from tests.e2e.waiting import wait_for

GROUP, VERSION = "gpupack.io", "v1alpha1"


@pytest.fixture
def claim_tenant(admin_client: Any, dra_namespace: str, sa_kubeconfig: Callable[..., Path]) -> Iterator[Any]:
    """An ApiClient acting as ServiceAccount ``tenant`` of ``dra_namespace``, allowed every ResourceClaim verb there."""
    api = tenant_client(admin_client, dra_namespace, sa_kubeconfig, "claims", [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
         "verbs": ["create", "get", "list", "watch", "delete"]}])
    yield api
    api.close()


def mig_claim(namespace: str, name: str, count: int, profile: str = "2g.20gb") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpupack-mig", "count": count,
                "selectors": [{"cel": {"expression": f'device.attributes["gpu.gpupack.io"].profile == "{profile}"'}}]}}]}}}


def share_claim(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpupack-shared",
                "capacity": {"requests": {"gpu.gpupack.io/milli": "300", "gpu.gpupack.io/memory": "10Gi"}}}}]}}}


def _refusal(resource: Any, namespace: str, claim: dict[str, Any], dry_run: str | None = None) -> str:
    """The refusal's message ('' when the claim is stored)."""
    try:
        resource.create_namespaced_resource_claim(namespace, claim, **({"dry_run": dry_run} if dry_run else {}))
    except ApiException as exc:
        return str(json.loads(str(exc.body)).get("message", exc.body))
    return ""


def test_a_claim_of_four_mig_placements_is_refused(claim_tenant: Any, dra_namespace: str) -> None:
    resource: Any = client.ResourceV1Api(claim_tenant)
    wait_for("the validating webhook to bound MIG counts",
             lambda: "[DeviceCount]" in _refusal(resource, dra_namespace, mig_claim(dra_namespace, "probe", 20), "All"),
             60.0, interval_s=0.25)
    message = _refusal(resource, dra_namespace, mig_claim(dra_namespace, "four", 4))
    assert "[DeviceCount]" in message and "its count must be 1 (got count 4)" in message
    # One placement per request is what the webhook's own claims ask, and it is stored.
    assert _refusal(resource, dra_namespace, mig_claim(dra_namespace, "one", 1)) == ""


def test_a_mig_claim_in_an_mps_only_namespace_is_refused(
    claim_tenant: Any, admin_client: Any, dra_namespace: str
) -> None:
    custom: Any = client.CustomObjectsApi(admin_client)
    resource: Any = client.ResourceV1Api(claim_tenant)
    name = f"e2e-dra-mps-{dra_namespace}"
    custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": name},
        # Selects no real node: only the webhook reads its namespace rules.
        "spec": {"nodeSelector": {"matchLabels": {"gpupack-e2e-dra-webhook": "none"}},
                 "namespaces": [{"names": [dra_namespace], "allowedModes": ["mps"]}]}})
    try:
        wait_for("the webhook to see the mps-only policy",
                 lambda: "[ModeForbidden]" in _refusal(resource, dra_namespace,
                                                       mig_claim(dra_namespace, "probe", 1), "All"),
                 60.0, interval_s=0.25)
        message = _refusal(resource, dra_namespace, mig_claim(dra_namespace, "mig", 1))
        assert "device class gpupack-mig gives mig, which SharingPolicy" in message
        assert "allowed modes: mps" in message
        # A share, which the namespace may use, is stored.
        assert _refusal(resource, dra_namespace, share_claim(dra_namespace, "share")) == ""
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "sharingpolicies", name)
