"""The DRA backend's install on the real control plane.

* The DaemonSets under Kubernetes' own DaemonSet controller (a control plane whose
  kube-controller-manager runs it): every GPU node gets the agent of its backend
  (``gpupack.io/backend``, ``sharing.api.backend.node_backend``) and only that one; nodes
  without GPUs, or with the agent switched off, get neither. No kubelet runs, so the pods
  stay Pending; what is checked is which node each pod the controller made is bound for.
* The validating webhook's claim rules, evaluated by the API server: only ResourceClaims
  and ResourceClaimTemplates naming one of gpupack's DeviceClasses are sent to the webhook,
  and a claim's metadata-only updates (finalizers) are not.

Only waits with generous deadlines, no timing assertions.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from gpupack.devcluster.apply import MANIFESTS, apply_objects, load_manifests
from gpupack.devcluster.binaries import ensure_binaries
from gpupack.devcluster.components import DEFAULT_CONTROLLERS
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.errors import DevClusterError
from sharing.api.backend import node_backend
from sharing.dra import wire
from sharing.api.keys import BACKEND_LABEL
from tests.e2e.planes import own_plane
from tests.e2e.waiting import wait_for

TIMEOUT_S = 90.0
NS = "gpupack-system"
GPU = {"nvidia.com/gpu.present": "true"}
SWITCH = "nvidia.com/gpu.deploy.gpupack-node-agent"
DAEMONSETS = {"device-plugin": "gpupack-node-agent", "dra": "gpupack-node-agent-dra"}
# name -> (labels, the GPU Operator's taint on it)
NODES: dict[str, tuple[dict[str, str], bool]] = {
    "gpu-unlabelled": (GPU, True),
    "gpu-device-plugin": ({**GPU, BACKEND_LABEL: "device-plugin"}, False),
    "gpu-dra": ({**GPU, BACKEND_LABEL: "dra", "nvidia.com/gpu.deploy.device-plugin": "false"}, True),
    "gpu-dra-untainted": ({**GPU, BACKEND_LABEL: "dra"}, False),
    "gpu-unknown-backend": ({**GPU, BACKEND_LABEL: "nvidia-dra"}, False),
    "cpu-labelled-dra": ({BACKEND_LABEL: "dra"}, False),
    "gpu-dra-switched-off": ({**GPU, BACKEND_LABEL: "dra", SWITCH: "false"}, False),
}


@pytest.fixture(scope="module")
def daemonset_plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A control plane of the module's own whose kube-controller-manager also runs the DaemonSet controller
    (not among the dev cluster's defaults). Never node-lifecycle: the Nodes here have no kubelet."""
    try:
        binaries = ensure_binaries(controller_manager=True)  # cached after the first build
    except DevClusterError as exc:
        pytest.fail(f"kube-controller-manager is unavailable:\n{exc}", pytrace=False)
    config = ControlPlaneConfig(scheduler=False, controller_manager=True,
                                controllers=(*DEFAULT_CONTROLLERS, "daemonset-controller"))
    yield from own_plane(binaries, config, "kube-controller-manager's DaemonSet controller")


@pytest.fixture(scope="module")
def admin(daemonset_plane: ControlPlane) -> Iterator[Any]:
    with daemonset_plane.admin_client() as api:
        yield api


def _expected() -> dict[str, set[str]]:
    """DaemonSet -> the nodes it must run on: GPU nodes by their backend, none where switched off."""
    out: dict[str, set[str]] = {name: set() for name in DAEMONSETS.values()}
    for node, (labels, _tainted) in NODES.items():
        if labels.get("nvidia.com/gpu.present") == "true" and labels.get(SWITCH) != "false":
            out[DAEMONSETS[node_backend(labels)]].add(node)
    return out


def _target_node(pod: client.V1Pod) -> str:
    """The node a DaemonSet pod is for: the controller pins it with a metadata.name node-affinity field."""
    terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    (name,) = {v for t in terms for f in t.match_fields or [] if f.key == "metadata.name" for v in f.values}
    return str(name)


def test_the_daemonset_controller_runs_each_gpu_nodes_agent_of_its_backend_only(admin: Any) -> None:
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    # What a cluster with the GPU Operator has: the nvidia RuntimeClass (the pods name it).
    client.NodeV1Api(admin).create_runtime_class(client.V1RuntimeClass(
        metadata=client.V1ObjectMeta(name="nvidia"), handler="nvidia"))
    for name, (labels, tainted) in NODES.items():
        taints = [client.V1Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")] if tainted else []
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels)))
        # Ready, and only the GPU Operator's taint (admission adds not-ready at creation; no kubelet here).
        core.patch_node_status(name, {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})
        core.patch_node(name, {"spec": {"taints": taints}})
    objects = load_manifests(MANIFESTS / "namespace", MANIFESTS / "rbac" / "serviceaccounts.yaml",
                             MANIFESTS / "agent" / "daemonset.yaml", MANIFESTS / "agent-dra" / "daemonset.yaml")
    apply_objects(admin, objects, field_manager="gpupack-e2e")
    expected = _expected()
    assert expected["gpupack-node-agent-dra"] == {"gpu-dra", "gpu-dra-untainted"}  # the table is what it says

    def placed() -> dict[str, set[str]] | None:
        """Each DaemonSet's nodes, once the controller has seen both and made every pod it wants."""
        got: dict[str, set[str]] = {}
        for daemonset in DAEMONSETS.values():
            found = apps.read_namespaced_daemon_set_status(daemonset, NS)
            pods = core.list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/name={daemonset}").items
            if found.status.observed_generation != found.metadata.generation or \
                    found.status.desired_number_scheduled != len(pods):
                return None
            got[daemonset] = {_target_node(p) for p in pods}
        return got

    got = wait_for("the DaemonSet controller to create both DaemonSets' pods", placed, TIMEOUT_S, interval_s=0.5)
    assert got == expected
    dra_pod = core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=gpupack-node-agent-dra").items[0]
    assert [c.name for c in dra_pod.spec.containers] == ["agent", "dra-plugin"]
    assert dra_pod.spec.service_account_name == "gpupack-node-agent"


# --------------------------------------------------------------- webhook rules


def _claim_spec(*classes: str, alternatives: bool = False) -> dict[str, Any]:
    if alternatives:
        return {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": f"alt-{i}", "deviceClassName": c} for i, c in enumerate(classes)]}]}}
    return {"devices": {"requests": [{"name": f"gpu-{i}", "exactly": {"deviceClassName": c}}
                                     for i, c in enumerate(classes)]}}


GPUPACK = [c["metadata"]["name"] for c in wire.device_classes()]
OTHER = "gpu.nvidia.com"  # NVIDIA's DRA driver's DeviceClass
CASES: list[Any] = [
    pytest.param("ResourceClaim", _claim_spec(GPUPACK[0]), True, id="claim-gpupack-class"),
    pytest.param("ResourceClaim", _claim_spec(OTHER, GPUPACK[2]), True, id="claim-second-request-gpupack"),
    pytest.param("ResourceClaim", _claim_spec(OTHER, GPUPACK[1], alternatives=True), True,
                 id="claim-first-available-gpupack"),
    pytest.param("ResourceClaim", _claim_spec(OTHER), False, id="claim-other-driver"),
    pytest.param("ResourceClaim", _claim_spec("gpupack-mig-lookalike"), False, id="claim-lookalike-class"),
    pytest.param("ResourceClaim", _claim_spec(OTHER, "example.com", alternatives=True), False,
                 id="claim-first-available-other"),
    pytest.param("ResourceClaimTemplate", {"spec": _claim_spec(GPUPACK[2])}, True, id="template-gpupack-class"),
    pytest.param("ResourceClaimTemplate", {"spec": _claim_spec(OTHER)}, False, id="template-other-driver"),
    pytest.param("ResourceClaim", {}, False, id="claim-without-devices"),
    pytest.param("ResourceClaimTemplate", {"spec": _claim_spec(OTHER, GPUPACK[0], alternatives=True)}, True,
                 id="template-first-available-gpupack"),
    pytest.param("ResourceClaimTemplate", {"spec": {}}, False, id="template-without-devices"),
]


@pytest.fixture(scope="module")
def claims_webhook(admin_client: Any) -> Iterator[tuple[str, str]]:
    """The shipped claims webhook, in a configuration of its own confined to a fresh namespace and pointed at
    a Service that does not exist: a request it matches is refused (failurePolicy Fail), one it does not
    match is admitted. Yields (namespace, webhook name)."""
    namespace = f"e2e-claims-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(admin_client).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    (config,) = load_manifests(Path(MANIFESTS) / "webhook" / "validating.yaml")
    (hook,) = [copy.deepcopy(h) for h in config["webhooks"]
               if any("resource.k8s.io" in r["apiGroups"] for r in h["rules"])]
    hook["clientConfig"]["service"]["name"] = f"absent-{uuid.uuid4().hex[:6]}"
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    body = {"apiVersion": config["apiVersion"], "kind": config["kind"],
            "metadata": {"name": f"gpupack-e2e-{namespace}"}, "webhooks": [hook]}
    # A gpupack claim that exists before the webhook does (an install or an outage in between).
    claims = DynamicClient(admin_client).resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
    claims.create(namespace=namespace, body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": EXISTING},
        "spec": _claim_spec(GPUPACK[1])})
    apply_objects(admin_client, [body], field_manager="gpupack-e2e")
    try:
        yield namespace, hook["name"]
    finally:
        client.AdmissionregistrationV1Api(admin_client).delete_validating_webhook_configuration(body["metadata"]["name"])
        claims.delete(name=EXISTING, namespace=namespace)


EXISTING = "made-before-the-webhook"


def _create(admin: Any, kind: str, namespace: str, spec: dict[str, Any]) -> str:
    """Create (dry run: nothing is stored) and return "" when admitted, the API server's message when refused."""
    api = DynamicClient(admin).resources.get(api_version="resource.k8s.io/v1", kind=kind)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": kind,
            "metadata": {"name": f"c-{uuid.uuid4().hex[:8]}", "namespace": namespace}, "spec": spec}
    try:
        api.create(body=body, namespace=namespace, query_params=[("dryRun", "All")])
    except ApiException as exc:  # the dynamic client's errors are ApiExceptions too
        try:
            return str(json.loads(str(exc.body))["message"])
        except (TypeError, ValueError, KeyError):
            return str(exc.body or exc.reason)
    return ""


@pytest.mark.parametrize(("kind", "spec", "sent"), CASES)
def test_only_claims_naming_a_gpupack_device_class_reach_the_webhook(
    admin_client: Any, claims_webhook: tuple[str, str], kind: str, spec: dict[str, Any], sent: bool
) -> None:
    namespace, hook = claims_webhook
    # The API server loads a new configuration asynchronously: wait until it calls the webhook at all.
    wait_for("the claims webhook to be in force", lambda: hook in _create(
        admin_client, "ResourceClaim", namespace, _claim_spec(GPUPACK[0])), TIMEOUT_S, interval_s=0.5)
    message = _create(admin_client, kind, namespace, spec)
    if sent:
        assert f'failed calling webhook "{hook}"' in message, message
    else:
        assert message == "", message


def test_metadata_updates_of_a_gpupack_claim_do_not_reach_the_webhook(
    admin_client: Any, claims_webhook: tuple[str, str]
) -> None:
    """kube-scheduler and the claim controller add and remove finalizers by updating the claim: with the
    webhook unreachable, those still go through (a deletion is never stuck on gpupack's webhook)."""
    namespace, hook = claims_webhook
    wait_for("the claims webhook to be in force", lambda: hook in _create(
        admin_client, "ResourceClaim", namespace, _claim_spec(GPUPACK[0])), TIMEOUT_S, interval_s=0.5)
    claims = DynamicClient(admin_client).resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
    for finalizers in (["example.com/e2e"], []):
        claims.patch(name=EXISTING, namespace=namespace, content_type="application/merge-patch+json",
                     body={"metadata": {"finalizers": finalizers, "labels": {"touched": str(len(finalizers))}}})
        stored = claims.get(name=EXISTING, namespace=namespace).to_dict()["metadata"]
        assert (stored.get("finalizers") or []) == finalizers
