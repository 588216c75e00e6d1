"""Right-sizing ``Initial`` on a real control plane: the real webhook, over TLS, sizes a Deployment's
new pod from the workload's GPURecommendation.

The webhook process, its registration and the namespace it mutates are ``test_webhook_e2e``'s
fixtures (the webhook runs with the ``gpupack-webhook`` ServiceAccount, so its RBAC on
``gpurecommendations`` is exercised). The recommendation is written by hand as the controller's
recommender would: the object, then its status through the status subresource. No
kube-controller-manager runs here, so the Deployment's pod is created as its ReplicaSet would
create it (owner reference to the ReplicaSet, ``pod-template-hash`` label), by a tenant account, so
the create-marks ValidatingAdmissionPolicy judges the webhook's new record too.

A second test turns compute over-commit on for the namespace with a SharingPolicy (``rightSizing:
computeOvercommit: 2.0``, the namespace's label gives the mode) and checks that the admitted pod is
accounted half its predicted milli, and that neither right-sized pod has an SM cap of its own.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupack.testing.admission_reviews import gpu_container, make_pod
from sharing.api.allocation import Allocation
from sharing.api.keys import ALLOCATION_ANNOTATION, RIGHT_SIZED_ANNOTATION, RIGHT_SIZING_LABEL
from sharing.api.right_sized import RightSizedFrom
from tests.e2e.tenants import tenant_client
from tests.e2e.test_webhook_e2e import GROUP, VERSION, Webhook, gpu_namespace, webhook  # noqa: F401 (fixtures)
from tests.e2e.waiting import wait_for

HASH = "7c4d9f8b6"
NOW = "2026-12-04T17:00:00Z"


@pytest.fixture
def tenant(admin_client: Any, gpu_namespace: str, sa_kubeconfig: Callable[..., Path]) -> Iterator[Any]:
    """A namespaced account that may create and read pods, nothing more."""
    api = tenant_client(admin_client, gpu_namespace, sa_kubeconfig, "pods", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}])
    yield api
    api.close()


def _deployment(admin_client: Any, namespace: str) -> dict[str, Any]:
    """Deployment ``web`` and its ReplicaSet ``web-<hash>`` (nothing runs them here); the ReplicaSet's
    owner reference, as its pods carry it."""
    apps: Any = client.AppsV1Api(admin_client)  # dict bodies: the client's stubs want its models
    template = {"metadata": {"labels": {"app": "web", "pod-template-hash": HASH}},
                "spec": {"containers": [gpu_container("main", "1000", "40Gi")]}}
    selector = {"matchLabels": {"app": "web"}}
    deployment = apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": selector, "template": template}})
    replicaset = apps.create_namespaced_replica_set(namespace, {
        "metadata": {"name": f"web-{HASH}", "labels": {"pod-template-hash": HASH}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": deployment.metadata.uid,
             "controller": True}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web", "pod-template-hash": HASH}},
                 "template": template}})
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replicaset.metadata.name,
            "uid": replicaset.metadata.uid, "controller": True, "blockOwnerDeletion": True}


def _recommend(admin_client: Any, namespace: str) -> None:
    """GPURecommendation ``deployment-web``: 150 milli and 12Gi for container ``main``, provided."""
    custom = client.CustomObjectsApi(admin_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpurecommendations", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPURecommendation", "metadata": {"name": "deployment-web"},
        "spec": {"targetRef": {"kind": "Deployment", "name": "web"}}})
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "gpurecommendations", "deployment-web", {
        "status": {"source": "Agents", "mode": "Initial", "lastUpdateTime": NOW,
                   "containers": [{"containerName": "main", "gpuMilli": 150, "gpuMemory": "12Gi",
                                   "observedSeconds": 90000, "confidenceDays": 1.04, "ooms": 0, "pods": 1}],
                   "conditions": [{"type": "RecommendationProvided", "status": "True", "reason": "EnoughHistory",
                                   "message": "1.0 days observed", "lastTransitionTime": NOW}]}})


def _pod(name: str, namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    pod = make_pod(gpu_container("main", "1000", "40Gi"), name=name, namespace=namespace, mode="mps",
                   labels={"app": "web", "pod-template-hash": HASH})
    pod["metadata"]["ownerReferences"] = [owner]
    return pod


def _sized_on_dry_run(admin_client: Any, namespace: str, pod: dict[str, Any]) -> bool:
    """Whether the webhook sizes ``pod`` now (it sees the namespace's label and the recommendation
    through watches, asynchronously)."""
    core: Any = client.CoreV1Api(admin_client)
    created = core.create_namespaced_pod(namespace, copy.deepcopy(pod), dry_run="All")
    return RIGHT_SIZED_ANNOTATION in (created.metadata.annotations or {})


def _right_sized_share(stored: dict[str, Any]) -> tuple[Allocation, RightSizedFrom]:
    """The records of a stored pod sized from ``_recommend``'s 12Gi, checked to be an MPS share with that
    memory limit and no SM cap of its own (the recommendation's milli is a predicted duty cycle, not a
    share of the SMs)."""
    container = stored["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12288M"}
    annotations = stored["metadata"]["annotations"]
    allocation = Allocation.from_annotation(annotations[ALLOCATION_ANNOTATION])
    assert allocation.mode == "mps" and allocation.containers[0].memory_bytes == 12 * 1024**3
    return allocation, RightSizedFrom.from_annotation(annotations[RIGHT_SIZED_ANNOTATION])


def test_initial_sizes_a_deployments_new_pod_from_its_recommendation_and_off_does_not(
    webhook: Webhook, admin_client: Any, gpu_namespace: str, tenant: Any,
) -> None:
    core: Any = client.CoreV1Api(admin_client)
    as_tenant: Any = client.CoreV1Api(tenant)
    owner = _deployment(admin_client, gpu_namespace)
    _recommend(admin_client, gpu_namespace)
    core.patch_namespace(gpu_namespace, {"metadata": {"labels": {RIGHT_SIZING_LABEL: "Initial"}}})
    first = _pod("web-sized", gpu_namespace, owner)
    wait_for("the webhook to size the namespace's pods", lambda: _sized_on_dry_run(admin_client, gpu_namespace, first),
             60.0, interval_s=0.25)

    as_tenant.create_namespaced_pod(gpu_namespace, first)
    stored = admin_client.sanitize_for_serialization(core.read_namespaced_pod("web-sized", gpu_namespace))
    # The recommendation's 150 milli and 12Gi, decided by the normal path: an MPS share with its memory
    # limit; no over-commit, so it is accounted its predicted 150 milli.
    allocation, sized = _right_sized_share(stored)
    assert (allocation.containers[0].milli, allocation.containers[0].predicted_milli) == (150, 150)
    assert (sized.recommendation, sized.updated, sized.compute_overcommit) == ("deployment-web", NOW, 1.0)
    (main,) = sized.containers
    assert (main.asked_milli, main.asked_memory_bytes, main.milli, main.memory_bytes) == (
        1000, 40 * 1024**3, 150, 12 * 1024**3)

    core.patch_namespace(gpu_namespace, {"metadata": {"labels": {RIGHT_SIZING_LABEL: "Off"}}})
    second = _pod("web-off", gpu_namespace, owner)
    wait_for("the webhook to see the namespace turned Off",
             lambda: not _sized_on_dry_run(admin_client, gpu_namespace, second), 60.0, interval_s=0.25)
    as_tenant.create_namespaced_pod(gpu_namespace, second)
    stored = admin_client.sanitize_for_serialization(core.read_namespaced_pod("web-off", gpu_namespace))
    # As asked: a whole GPU (more than a GPU split into two replicas holds), no MPS limits.
    assert RIGHT_SIZED_ANNOTATION not in stored["metadata"]["annotations"]
    record = json.loads(stored["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert (record["mode"], record["containers"][0]["milli"]) == ("whole", 1000)
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "env" not in stored["spec"]["containers"][0]


def test_a_tenant_cannot_create_a_pod_with_a_hand_written_right_sized_record(gpu_namespace: str, tenant: Any) -> None:
    """A pod without the webhook's allocation record never reaches the webhook; the create-marks policy
    refuses the record on it (enforced by the API server)."""
    core: Any = client.CoreV1Api(tenant)
    pod = make_pod({"name": "main", "image": "example.com/app:1"}, name="forged-sized", namespace=gpu_namespace,
                   annotations={RIGHT_SIZED_ANNOTATION: "{}"})

    def refused() -> bool:
        try:
            core.create_namespaced_pod(gpu_namespace, copy.deepcopy(pod), dry_run="All")
        except client.ApiException as exc:
            return exc.status in (403, 422) and "written by gpupack's webhook only" in str(exc.body)
        return False

    wait_for("the create-marks ValidatingAdmissionPolicy to refuse the record", refused, 60.0, interval_s=0.25)


def _dry_run_overcommit(admin_client: Any, namespace: str, pod: dict[str, Any]) -> float | None:
    """The compute over-commit the webhook sizes ``pod`` with now (None: not sized)."""
    core: Any = client.CoreV1Api(admin_client)
    created = core.create_namespaced_pod(namespace, copy.deepcopy(pod), dry_run="All")
    text = (created.metadata.annotations or {}).get(RIGHT_SIZED_ANNOTATION)
    return None if text is None else RightSizedFrom.from_annotation(text).compute_overcommit


def test_a_policy_that_overcommits_compute_accounts_the_pod_a_fraction_of_its_prediction(
    webhook: Webhook, admin_client: Any, gpu_namespace: str, tenant: Any,
) -> None:
    core: Any = client.CoreV1Api(admin_client)
    custom = client.CustomObjectsApi(admin_client)
    owner = _deployment(admin_client, gpu_namespace)
    _recommend(admin_client, gpu_namespace)
    # No namespace rules: every namespace keeps every mode; the namespace's label gives the mode, and the
    # policy the bound (the strictest policy with a rightSizing section that covers the namespace).
    name = f"overcommit-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": name},
        "spec": {"rightSizing": {"mode": "Off", "computeOvercommit": 2.0}}})
    try:
        core.patch_namespace(gpu_namespace, {"metadata": {"labels": {RIGHT_SIZING_LABEL: "Initial"}}})
        pod = _pod("web-overcommitted", gpu_namespace, owner)
        wait_for("the webhook to size the namespace's pods with the policy's over-commit",
                 lambda: _dry_run_overcommit(admin_client, gpu_namespace, pod) == 2.0, 60.0, interval_s=0.25)
        as_tenant: Any = client.CoreV1Api(tenant)
        as_tenant.create_namespaced_pod(gpu_namespace, pod)
        stored = admin_client.sanitize_for_serialization(core.read_namespaced_pod(pod["metadata"]["name"],
                                                                                  gpu_namespace))
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "sharingpolicies", name)
    # Predicted 150 milli, accounted ceil(150 / 2.0) = 75: the replicas it takes count 75.
    allocation, sized = _right_sized_share(stored)
    assert (allocation.containers[0].milli, allocation.containers[0].predicted_milli) == (75, 150)
    assert sized.compute_overcommit == 2.0
    (main,) = sized.containers
    assert (main.asked_milli, main.milli, main.accounted, main.memory_bytes) == (1000, 150, 75, 12 * 1024**3)
