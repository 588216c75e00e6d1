"""``auto`` against a real kube-apiserver: a degraded MPS node does not take the pods (issue 33, item 5).

The demo's shape after an ECC fault on its only MPS node: the webhook (a separate
process with its own ServiceAccount, registered with its caBundle, as in
``test_webhook_e2e``) sees an H100 in MIG mode whose idle instances are all
``1g.10gb`` (a 10 GiB ask does not fit one) and an A100 shared by MPS. A tenant's
``auto`` pod (200 milli, 10 GiB) is recorded ``mps`` while the A100 is healthy;
once its GPUNode reports the node degraded the same pod is recorded ``mig``,
gated for the controller to reshape the idle H100, never ``mps`` on a node no new
pod may use.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.tenants import tenant_client
from tests.e2e.test_webhook_e2e import GROUP, VERSION, Webhook, _wait, labelled_mutating_config, registered
from tests.unit.test_decision import A100, H100, mig_node, shared_node
from gpupack.testing.admission_reviews import gpu_container, make_pod

SELECT_LABEL = "gpupack-e2e-auto-mode"
MPS_NODE = "e2e-auto-a100-mps"
MIG_NODE = "e2e-auto-h100-mig"


def _nodes() -> list[dict[str, Any]]:
    mig = mig_node(MIG_NODE, H100, [("1g.10gb", i, False) for i in range(7)])
    mig["spec"] = {"sharing": {"mode": "none", "replicas": 1}, "gpus": [{"index": 0, "migEnabled": True}]}
    mps = shared_node(MPS_NODE, "mps", 4, product=A100, gpus=1)
    mps["spec"] = {"sharing": {"mode": "mps", "replicas": 4}}
    return [dict(n, apiVersion=f"{GROUP}/{VERSION}") for n in (mig, mps)]


@pytest.fixture(scope="module")
def webhook(admin_client: Any, gpupack_installed: Any, sa_kubeconfig: Callable[[str], Path],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    custom = client.CustomObjectsApi(admin_client)
    hook = Webhook(tmp_path_factory.mktemp("auto-mode-e2e"), sa_kubeconfig("gpupack-webhook"))
    mutating = labelled_mutating_config(hook, f"gpupack-e2e-auto-{uuid.uuid4().hex[:6]}", SELECT_LABEL)
    created: list[str] = []
    try:
        for node in _nodes():
            status = node.pop("status")
            custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", node)
            created.append(node["metadata"]["name"])
            custom.patch_cluster_custom_object_status(GROUP, VERSION, "gpunodes", node["metadata"]["name"],
                                                      {"status": status})
        _wait("webhook ready (inventory synced)", lambda: hook.get("/readyz")[0] == 200)
        _wait("both GPUNodes in the webhook's view", lambda: hook.metric("gpupack_webhook_inventory_nodes") >= 2)
        with registered(admin_client, mutating):
            yield hook
    finally:
        for name in created:
            custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodes", name)
        hook.stop()
        print(hook.log_path.read_text()[-3000:])


@pytest.fixture
def tenant(webhook: Webhook, admin_client: Any, namespace: str, sa_kubeconfig: Callable[..., Path]) -> Iterator[Any]:
    """A ServiceAccount client of ``namespace`` (labelled for this module's webhook), allowed pod verbs there."""
    client.CoreV1Api(admin_client).patch_namespace(namespace, {"metadata": {"labels": {SELECT_LABEL: "on"}}})
    api = tenant_client(admin_client, namespace, sa_kubeconfig, "pods", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]}])
    yield api
    api.close()


def _recorded_mode(core: client.CoreV1Api, namespace: str, name: str, *, dry_run: bool) -> str | None:
    """The mode the webhook records for an ``auto`` pod of 200 milli and 10 GiB (None: not mutated yet)."""
    pod = make_pod(gpu_container("main", "200", "10Gi"), name=name, namespace=namespace)
    stored = core.create_namespaced_pod(namespace, pod, dry_run="All" if dry_run else None)
    record = (stored.metadata.annotations or {}).get("gpupack.io/allocation")
    return None if record is None else str(json.loads(record)["mode"])


def test_auto_pod_is_not_recorded_mps_once_the_only_mps_node_is_degraded(
    admin_client: Any, tenant: Any, namespace: str
) -> None:
    core = client.CoreV1Api(tenant)
    # The registration and the namespace label reach the admission chain asynchronously.
    _wait("the mutating webhook to be called", lambda: _recorded_mode(core, namespace, "probe", dry_run=True) is not None)
    assert _recorded_mode(core, namespace, "before", dry_run=False) == "mps"  # least waste, on a healthy node

    custom = client.CustomObjectsApi(admin_client)
    custom.patch_cluster_custom_object_status(GROUP, VERSION, "gpunodes", MPS_NODE,
                                              {"status": {"summary": {"degraded": True}}})
    _wait("the webhook to choose another mode than mps for the degraded node",
          lambda: _recorded_mode(core, namespace, "probe", dry_run=True) != "mps")
    after = core.read_namespaced_pod("before", namespace)  # the first pod is untouched
    assert after.metadata.annotations["gpupack.io/allocation"]
    assert _recorded_mode(core, namespace, "after", dry_run=False) == "mig"
    stored = core.read_namespaced_pod("after", namespace)
    limits = stored.spec.containers[0].resources.limits or {}
    assert any(k.startswith("nvidia.com/mig-") for k in limits), limits
    assert [g.name for g in stored.spec.scheduling_gates or []] == ["gpupack.io/capacity"]
