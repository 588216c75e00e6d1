"""The webhook's DRA path on the real control plane: a pod bound for the DRA node pool is stored
with its claim reference, the gate and the allocation record; a ResourceClaim no gpupack device
can serve is refused by the API server through the validating webhook.

The webhook runs as ``gpupack webhook serve`` with the ``gpupack-webhook`` ServiceAccount's
kubeconfig (its RBAC lets it watch Nodes: the DRA pool is read from their labels), called over
TLS by kube-apiserver. Its configurations are the shipped manifests with ``clientConfig``
pointed at the process and the namespace selectors narrowed to namespaces this module labels.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.devcluster.apply import local_webhook_config
from sharing.api.backend import CLAIM_PREFIX
from tests.e2e.test_webhook_e2e import Webhook, registered
from tests.e2e.waiting import wait_for
from gpupack.testing.admission_reviews import gpu_container, make_pod

SELECT_LABEL = "gpupack-e2e-dra-webhook"
GROUP, VERSION = "gpupack.io", "v1alpha1"
A100 = "NVIDIA-A100-SXM4-80GB"


def _narrowed(kind: Literal["mutating", "validating"], hook: Webhook, suffix: str) -> dict[str, Any]:
    """The shipped configuration, called at ``hook``, for this module's namespaces only."""
    config = local_webhook_config(kind, hook.url, hook.ca_bundle, f"gpupack-e2e-dra-{suffix}")
    for wh in config["webhooks"]:
        if any(r.get("scope") != "Cluster" for r in wh["rules"]):
            selector = wh.setdefault("namespaceSelector", {}).setdefault("matchExpressions", [])
            selector.append({"key": SELECT_LABEL, "operator": "In", "values": ["on"]})
    return config


@pytest.fixture(scope="module")
def dra_webhook(
    admin_client: Any, gpupack_installed: Any, sa_kubeconfig: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhook]:
    # Typed as Any: the client's stubs want its model classes, these tests send plain dicts.
    core: Any = client.CoreV1Api(admin_client)
    custom: Any = client.CustomObjectsApi(admin_client)
    suffix = uuid.uuid4().hex[:6]
    node_name = f"e2e-dra-{suffix}"
    hook = Webhook(tmp_path_factory.mktemp("dra-webhook"), sa_kubeconfig("gpupack-webhook"))
    mutating = _narrowed("mutating", hook, suffix)
    validating = _narrowed("validating", hook, suffix)
    try:
        core.create_node({"metadata": {"name": node_name, "labels": {"gpupack.io/backend": "dra"}}})
        gpunode = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": {"name": node_name},
                   "spec": {"sharing": {"mode": "mps"}}}
        custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", gpunode)
        custom.patch_cluster_custom_object_status(GROUP, VERSION, "gpunodes", node_name, {"status": {
            "product": A100, "sharing": {"mode": "mps", "replicas": 1},
            "gpus": [{"index": i, "uuid": f"GPU-{suffix}-{i}", "product": A100, "memoryMiB": 81920, "migEnabled": False}
                     for i in range(2)]}})
        wait_for("webhook ready (inventory synced)", lambda: hook.get("/readyz")[0] == 200, 60.0, interval_s=0.25)
        with registered(admin_client, mutating, validating):
            yield hook
    finally:
        for delete, name in (
            (lambda n: custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodes", n), node_name),
            (core.delete_node, node_name),
        ):
            try:
                delete(name)
            except ApiException:
                pass
        hook.stop()
        print(hook.log_path.read_text()[-3000:])


@pytest.fixture
def dra_namespace(dra_webhook: Webhook, admin_client: Any, namespace: str) -> str:
    client.CoreV1Api(admin_client).patch_namespace(namespace, {"metadata": {"labels": {SELECT_LABEL: "on"}}})
    return namespace


def _dra_pod(namespace: str, name: str) -> dict[str, Any]:
    return make_pod(gpu_container("main", "300"), name=name, namespace=namespace,
                    labels={"gpupack.io/backend": "dra"})


def test_a_dra_pod_is_stored_with_its_claim_reference_gate_and_record(admin_client: Any, dra_namespace: str) -> None:
    core: Any = client.CoreV1Api(admin_client)

    def mutated_for_dra() -> bool:
        # Webhook registration, namespace labels and the webhook's watch of the Node all arrive
        # asynchronously: wait until a dry run comes back with a claim reference.
        pod = core.create_namespaced_pod(dra_namespace, _dra_pod(dra_namespace, "probe"), dry_run="All")
        return bool(pod.spec.resource_claims)

    wait_for("the webhook to send a pod to the DRA pool", mutated_for_dra, 60.0, interval_s=0.25)
    core.create_namespaced_pod(dra_namespace, _dra_pod(dra_namespace, "dra-pod"))
    stored = admin_client.sanitize_for_serialization(core.read_namespaced_pod("dra-pod", dra_namespace))
    spec = stored["spec"]
    record = json.loads(stored["metadata"]["annotations"]["gpupack.io/allocation"])
    claim = record["claim"]
    assert claim.startswith(CLAIM_PREFIX) and record["backend"] == "dra" and record["mode"] == "mps"
    assert record["containers"] == [{"kind": "containers", "milli": 300, "name": "main", "resource": "gpu-0"}]
    assert spec["resourceClaims"] == [{"name": "gpupack", "resourceClaimName": claim}]
    resources = spec["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpupack", "request": "gpu-0"}]
    assert not any(k.startswith(("gpupack.io/", "nvidia.com/")) for k in resources.get("limits") or {})
    assert spec["schedulingGates"] == [{"name": "gpupack.io/capacity"}]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "gpupack.io/backend", "operator": "In", "values": ["dra"]} in terms[0]["matchExpressions"]


def test_a_pod_asking_no_gpu_is_gated_for_the_engine_only_when_labelled_for_dra(
        admin_client: Any, dra_namespace: str) -> None:
    """The shipped matchConditions send a pod that asks for no GPU when it carries the DRA label
    (the webhook gates it with a record of mode ``cpu``), and never one without it."""
    core: Any = client.CoreV1Api(admin_client)
    wait_for("the webhook to send a pod to the DRA pool",
             lambda: bool(core.create_namespaced_pod(dra_namespace, _dra_pod(dra_namespace, "probe"),
                                                     dry_run="All").spec.resource_claims), 60.0, interval_s=0.25)
    container = {"name": "main", "image": "x", "resources": {"requests": {"cpu": "4"}}}
    core.create_namespaced_pod(dra_namespace, make_pod(container, name="cpu-dra", namespace=dra_namespace,
                                                       labels={"gpupack.io/backend": "dra"}))
    core.create_namespaced_pod(dra_namespace, make_pod(container, name="cpu-plain", namespace=dra_namespace))
    labelled = admin_client.sanitize_for_serialization(core.read_namespaced_pod("cpu-dra", dra_namespace))
    record = json.loads(labelled["metadata"]["annotations"]["gpupack.io/allocation"])
    assert (record["mode"], record["backend"], record["containers"]) == ("cpu", "dra", [])
    assert labelled["spec"]["schedulingGates"] == [{"name": "gpupack.io/capacity"}]
    assert "resourceClaims" not in labelled["spec"]
    assert labelled["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "4"}}
    plain = admin_client.sanitize_for_serialization(core.read_namespaced_pod("cpu-plain", dra_namespace))
    assert "gpupack.io/allocation" not in (plain["metadata"].get("annotations") or {})
    assert not plain["spec"].get("schedulingGates") and not plain["spec"].get("affinity")


def _claim(namespace: str, name: str, milli: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpupack-shared",
                "capacity": {"requests": {"gpu.gpupack.io/milli": milli, "gpu.gpupack.io/memory": "10Gi"}}}}]}}}


def test_a_claim_no_gpupack_device_can_serve_is_refused_by_the_api_server(admin_client: Any, dra_namespace: str) -> None:
    resource: Any = client.ResourceV1Api(admin_client)

    def refused() -> bool:
        try:
            resource.create_namespaced_resource_claim(dra_namespace, _claim(dra_namespace, "probe", "2000"),
                                                      dry_run="All")
        except ApiException as exc:
            return "MilliOutOfRange" in str(exc.body)
        return False

    wait_for("the validating webhook to check claims", refused, 60.0, interval_s=0.25)
    with pytest.raises(ApiException) as info:
        resource.create_namespaced_resource_claim(dra_namespace, _claim(dra_namespace, "too-much", "2000"))
    message = json.loads(str(info.value.body))["message"]
    # The API server hands the webhook the quantity in canonical form: 2000 is "2k".
    assert "[MilliOutOfRange]" in message and "gpu.gpupack.io/milli='2k' is outside 1..1000" in message
    # A share gpupack can serve is stored.
    created = resource.create_namespaced_resource_claim(dra_namespace, _claim(dra_namespace, "fits", "300"))
    assert created.metadata.name == "fits"


def test_a_node_relabelled_out_of_the_dra_pool_leaves_it(
    dra_webhook: Webhook, admin_client: Any, dra_namespace: str
) -> None:
    # The webhook watches only Nodes labelled gpupack.io/backend=dra; one whose label changes
    # must leave its view (the API server sends DELETED when an object leaves a label selector).
    # Seen through the claim check, whose memory bound is the DRA pool's largest GPU.
    core: Any = client.CoreV1Api(admin_client)
    resource: Any = client.ResourceV1Api(admin_client)
    big = _claim(dra_namespace, "big", "300")
    big["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["gpu.gpupack.io/memory"] = "100Gi"

    def verdict() -> str:
        try:
            resource.create_namespaced_resource_claim(dra_namespace, copy.deepcopy(big), dry_run="All")
        except ApiException as exc:
            return "MemoryTooLarge" if "MemoryTooLarge" in str(exc.body) else str(exc.body)
        return "allowed"

    wait_for("100Gi refused while an 80 GB GPU is the DRA pool's largest", lambda: verdict() == "MemoryTooLarge",
             60.0, interval_s=0.25)
    node = next(n.metadata.name for n in core.list_node(label_selector="gpupack.io/backend=dra").items
                if n.metadata.name.startswith("e2e-dra-"))
    core.patch_node(node, {"metadata": {"labels": {"gpupack.io/backend": "device-plugin"}}})
    try:
        wait_for("the DRA pool to be empty: memory no longer bounded", lambda: verdict() == "allowed",
                 60.0, interval_s=0.25)
    finally:
        core.patch_node(node, {"metadata": {"labels": {"gpupack.io/backend": "dra"}}})
