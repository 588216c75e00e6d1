"""The webhook against a real kube-apiserver: registered with its caBundle, called
by the API server over TLS, pods created through the API, stored objects checked.

The webhook runs as a separate process with the ``gpupack-webhook``
ServiceAccount's kubeconfig (so its RBAC is exercised too) and builds its
inventory by watching GPUNode and SharingPolicy objects created here from
``examples/inventory.yaml``. Its webhook configurations are the shipped
manifests with ``clientConfig`` pointed at the loopback URL and the namespace
selector narrowed to namespaces this module labels, so other tests sharing the
control plane are never sent to it; everything is removed at the end.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupack.devcluster.apply import local_webhook_config
from gpupack.devcluster.process import free_port
from tests.e2e.tenants import tenant_client
from tests.e2e.waiting import wait_for
from tests.processes import stop_process
from webhook.certs import make_self_signed
from gpupack.testing.admission_reviews import gpu_container, make_pod

ROOT = Path(__file__).resolve().parents[2]
SELECT_LABEL = "gpupack-e2e-webhook"
PREFIX = "e2e-wh-"
GROUP, VERSION = "gpupack.io", "v1alpha1"


def _wait(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    wait_for(what, check, timeout, interval_s=0.25)


class Webhook:
    def __init__(self, tmp: Path, kubeconfig: Path) -> None:
        ca, cert, key = make_self_signed(["localhost", "127.0.0.1"])
        for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
            (tmp / name).write_bytes(data)
        self.ca_bundle = base64.b64encode(ca).decode()
        self.ca_file = tmp / "ca.crt"
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.log = (tmp / "webhook.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupack", "webhook", "serve", "--tls-cert", str(tmp / "tls.crt"),
             "--tls-key", str(tmp / "tls.key"), "--host", "127.0.0.1", "--port", str(self.port),
             "--kubeconfig", str(kubeconfig), "--log-level", "info"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.log_path = tmp / "webhook.log"

    def get(self, path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request

        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(self.url + path, context=ctx, timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""
        except OSError:
            return 0, ""

    def metric(self, name: str) -> float:
        _, text = self.get("/metrics")
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def _gpunodes() -> list[dict[str, Any]]:
    nodes = yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text())
    for node in nodes:
        node["metadata"]["name"] = PREFIX + node["metadata"]["name"]
    return nodes


def labelled_mutating_config(hook: Webhook, name: str, label: str) -> dict[str, Any]:
    """The shipped mutating configuration, calling ``hook``, for the namespaces labelled ``label=on``
    only (the shipped exclusions stay in force too)."""
    mutating = local_webhook_config("mutating", hook.url, hook.ca_bundle, name)
    mutating["webhooks"][0]["namespaceSelector"]["matchExpressions"].append(
        {"key": label, "operator": "In", "values": ["on"]})
    return mutating


@contextmanager
def registered(admin_client: Any, *configs: dict[str, Any]) -> Iterator[None]:
    """``configs`` (Mutating- and ValidatingWebhookConfigurations) created on entry, in order, and
    deleted on exit; one already gone is fine."""
    registration = client.AdmissionregistrationV1Api(admin_client)
    calls: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
        "MutatingWebhookConfiguration": (registration.create_mutating_webhook_configuration,
                                         registration.delete_mutating_webhook_configuration),
        "ValidatingWebhookConfiguration": (registration.create_validating_webhook_configuration,
                                           registration.delete_validating_webhook_configuration),
    }
    made: list[dict[str, Any]] = []
    try:
        for config in configs:
            calls[config["kind"]][0](config)
            made.append(config)
        yield
    finally:
        for config in made:
            try:
                calls[config["kind"]][1](config["metadata"]["name"])
            except ApiException:
                pass


@pytest.fixture(scope="module")
def webhook(
    admin_client: Any, gpupack_installed: Any, sa_kubeconfig: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Webhook]:
    custom = client.CustomObjectsApi(admin_client)
    created: list[str] = []
    hook = Webhook(tmp_path_factory.mktemp("webhook-e2e"), sa_kubeconfig("gpupack-webhook"))
    suffix = uuid.uuid4().hex[:6]
    # Only namespaces this module labels mutate; validation stays as shipped.
    mutating = labelled_mutating_config(hook, f"gpupack-e2e-{suffix}", SELECT_LABEL)
    validating = local_webhook_config("validating", hook.url, hook.ca_bundle, f"gpupack-e2e-{suffix}")
    try:
        for node in _gpunodes():
            status = node.pop("status")
            custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", node)
            created.append(node["metadata"]["name"])
            custom.patch_cluster_custom_object_status(GROUP, VERSION, "gpunodes", node["metadata"]["name"], {"status": status})
        _wait("webhook ready (inventory synced)", lambda: hook.get("/readyz")[0] == 200)
        _wait("all example GPUNodes in the webhook's view",
              lambda: hook.metric("gpupack_webhook_inventory_nodes") >= len(created))
        with registered(admin_client, mutating, validating):
            yield hook
    finally:
        for name in created:
            custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodes", name)
        hook.stop()
        print(hook.log_path.read_text()[-3000:])


@pytest.fixture
def gpu_namespace(webhook: Webhook, admin_client: Any, namespace: str) -> str:
    core = client.CoreV1Api(admin_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {SELECT_LABEL: "on"}}})
    # The API server's webhook registry and namespace labels reach the
    # admission chain asynchronously: wait until a dry-run create is mutated.
    probe = make_pod(gpu_container("c", "100"), name="probe", namespace=namespace)

    def mutated() -> bool:
        try:
            pod = core.create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as exc:
            # The webhook's view of policies converges asynchronously too: a policy an earlier
            # test just deleted may still deny the probe for a moment.
            if exc.status == 403 and "ModeForbidden" in (exc.body or ""):
                return False
            raise
        return "nvidia.com/mig-1g.10gb" in (pod.spec.containers[0].resources.limits or {})

    _wait("the mutating webhook to be called", mutated)
    return namespace


def create(admin_client: Any, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    core = client.CoreV1Api(admin_client)
    core.create_namespaced_pod(namespace, pod)
    stored = core.read_namespaced_pod(pod["metadata"]["name"], namespace)
    return dict(admin_client.sanitize_for_serialization(stored))


def allocation(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(pod["metadata"]["annotations"]["gpupack.io/allocation"]))


def test_mig_request_stored_with_mig_resource(admin_client: Any, gpu_namespace: str) -> None:
    pod = make_pod(gpu_container("main", "100"), name="mig-pod", namespace=gpu_namespace, mode="mig",
                   annotations={"team": "vision"})
    stored = create(admin_client, gpu_namespace, pod)
    resources = stored["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert resources["requests"] == {"nvidia.com/mig-1g.10gb": "1"}  # defaulted from limits by the API server
    record = allocation(stored)
    assert record["mode"] == "mig" and record["containers"][0]["profile"] == "1g.10gb"
    assert stored["metadata"]["annotations"]["team"] == "vision"
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    # placement: engine (the default): capacity exists, yet the pod waits for the packing
    # engine to choose its node, so kube-scheduler's generic scoring never places it.
    assert record["gated"] and "packing engine chooses its node" in record["reason"]
    assert stored["spec"]["schedulingGates"] == [{"name": "gpupack.io/capacity"}]


def test_mps_request_stored_with_shared_resource_and_limits(admin_client: Any, gpu_namespace: str) -> None:
    pod = make_pod(gpu_container("main", "250", "16Gi", env=[{"name": "KEEP", "value": "me"}]),
                   name="mps-pod", namespace=gpu_namespace, mode="mps")
    stored = create(admin_client, gpu_namespace, pod)
    container = stored["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    assert container["env"] == [
        {"name": "KEEP", "value": "me"},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "25"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=16384M"},
    ]
    # placement: engine (the default): the engine chooses the node and with it the split, so the record
    # names no replica count and the affinity only the mode (a gated pod's terms are never widened).
    assert allocation(stored)["mode"] == "mps" and "replicas" not in allocation(stored)
    terms = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert [e["key"] for t in terms for e in t["matchExpressions"]] == [
        "nvidia.com/gpu.sharing-strategy", "gpupack.io/gpu-degraded"]


def test_time_slicing_request_stored(admin_client: Any, gpu_namespace: str) -> None:
    pod = make_pod(gpu_container("main", "200"), name="ts-pod", namespace=gpu_namespace, mode="time-slicing")
    stored = create(admin_client, gpu_namespace, pod)
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    expressions = stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.sharing-strategy", "operator": "In", "values": ["time-slicing"]} in expressions


def test_gate_added_when_no_capacity_exists(admin_client: Any, gpu_namespace: str) -> None:
    # A whole-GPU MIG instance (7g.80gb) exists nowhere in the all-balanced layout.
    pod = make_pod(gpu_container("main", "1000"), name="gated-pod", namespace=gpu_namespace, mode="mig")
    stored = create(admin_client, gpu_namespace, pod)
    assert stored["spec"]["schedulingGates"] == [{"name": "gpupack.io/capacity"}]
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-7g.80gb": "1"}
    assert allocation(stored)["gated"] is True
    # The real kube-scheduler sees the gate and leaves the pod alone (no back-off).
    core = client.CoreV1Api(admin_client)

    def gated_condition() -> bool:
        conditions = core.read_namespaced_pod("gated-pod", gpu_namespace).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "SchedulingGated" for c in conditions)

    _wait("kube-scheduler to report the pod as SchedulingGated", gated_condition)


def test_invalid_request_rejected_with_message(admin_client: Any, gpu_namespace: str) -> None:
    pod = make_pod(gpu_container("main", "1500"), name="too-much", namespace=gpu_namespace)
    with pytest.raises(ApiException) as info:
        client.CoreV1Api(admin_client).create_namespaced_pod(gpu_namespace, pod)
    assert info.value.status in (400, 403)
    assert "outside 1..1000" in info.value.body


def test_pods_without_gpu_requests_never_reach_the_webhook(webhook: Webhook, admin_client: Any, gpu_namespace: str) -> None:
    before = webhook.metric('gpupack_webhook_requests_total{endpoint="mutate"')
    plain = make_pod({"name": "web", "image": "nginx"}, name="plain", namespace=gpu_namespace)
    stored = create(admin_client, gpu_namespace, plain)
    assert "gpupack.io/allocation" not in (stored["metadata"].get("annotations") or {})
    assert webhook.metric('gpupack_webhook_requests_total{endpoint="mutate"') == before  # matchConditions


def test_forbidden_mode_rejected_with_policy_message(admin_client: Any, gpu_namespace: str) -> None:
    custom = client.CustomObjectsApi(admin_client)
    name = f"{PREFIX}{gpu_namespace}"
    policy = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": name},
        # Selects no real node, so no controller acts on it; the webhook only reads namespaces.
        "spec": {"nodeSelector": {"matchLabels": {SELECT_LABEL: "none"}},
                 "namespaces": [{"names": [gpu_namespace], "allowedModes": ["mig"]}]},
    }
    custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", policy)
    core = client.CoreV1Api(admin_client)
    try:
        pod = make_pod(gpu_container("main", "250"), name="mps-forbidden", namespace=gpu_namespace, mode="mps")

        def rejected() -> bool:
            try:
                core.create_namespaced_pod(gpu_namespace, copy.deepcopy(pod), dry_run="All")
            except ApiException as exc:
                return "forbidden" in exc.body
            return False

        _wait("the webhook to see the new SharingPolicy", rejected)
        with pytest.raises(ApiException) as info:
            core.create_namespaced_pod(gpu_namespace, pod)
        message = json.loads(info.value.body)["message"]
        assert f"sharing mode 'mps' (gpupack.io/sharing) is forbidden in namespace '{gpu_namespace}'" in message
        assert "allowed modes: mig" in message
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "sharingpolicies", name)


def test_invalid_policy_rejected_by_validating_webhook(webhook: Webhook, admin_client: Any) -> None:
    custom = client.CustomObjectsApi(admin_client)
    policy = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": f"{PREFIX}bad"},
        "spec": {"nodeSelector": {"matchLabels": {SELECT_LABEL: "none"}}, "allowedProfiles": ["5g.50gb"]},
    }

    def rejected() -> bool:
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", policy, dry_run="All")
        except ApiException as exc:
            return "5g.50gb" in exc.body
        return False

    _wait("the validating webhook to reject an unknown MIG profile", rejected)


def test_policy_namespace_selector_follows_namespace_labels(admin_client: Any, gpu_namespace: str) -> None:
    """Selector rules need the namespace's labels: the webhook watches Namespaces too."""
    custom = client.CustomObjectsApi(admin_client)
    core = client.CoreV1Api(admin_client)
    name = f"{PREFIX}sel-{gpu_namespace}"
    policy = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {SELECT_LABEL: "none"}},
                 "namespaces": [{"selector": {"matchLabels": {"gpu-tier": "shared"}}, "allowedModes": ["time-slicing"]}]},
    }
    pod = make_pod(gpu_container("main", "200"), name="by-label", namespace=gpu_namespace)

    def mode() -> str:
        try:
            created = core.create_namespaced_pod(gpu_namespace, copy.deepcopy(pod), dry_run="All")
        except ApiException as exc:
            return "denied" if "allowed mode" in exc.body or "forbidden" in exc.body else f"error {exc.status}"
        return str(json.loads(created.metadata.annotations["gpupack.io/allocation"])["mode"])

    custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", policy)
    try:
        _wait("the unlabelled namespace to lose every mode", lambda: mode() == "denied")
        core.patch_namespace(gpu_namespace, {"metadata": {"labels": {"gpu-tier": "shared"}}})
        _wait("the label to allow time-slicing", lambda: mode() == "time-slicing")
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "sharingpolicies", name)


def test_init_container_request_reaches_the_webhook(admin_client: Any, gpu_namespace: str) -> None:
    """The matchConditions CEL rule also sends pods whose only GPU ask is in an init container."""
    pod = make_pod({"name": "app", "image": "x"}, name="init-only", namespace=gpu_namespace,
                   init=[gpu_container("warmup", "100")], mode="mig")
    stored = create(admin_client, gpu_namespace, pod)
    assert stored["spec"]["initContainers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert allocation(stored)["containers"][0]["kind"] == "initContainers"


def test_shipped_manifests_pass_api_server_validation(admin_client: Any, gpupack_installed: Any) -> None:
    """Server-side dry run of the webhook's Deployment, Service and PodDisruptionBudget
    (the webhook configurations themselves are created for real by the fixture;
    certificate.yaml needs cert-manager's CRDs, which this control plane lacks)."""
    docs = {d["kind"]: d for name in ("deployment.yaml", "service.yaml", "pdb.yaml")
            for d in yaml.safe_load_all((ROOT / "manifests" / "webhook" / name).read_text()) if d}
    ns = "gpupack-system"
    client.AppsV1Api(admin_client).create_namespaced_deployment(ns, docs["Deployment"], dry_run="All")
    client.CoreV1Api(admin_client).create_namespaced_service(ns, docs["Service"], dry_run="All")
    client.PolicyV1Api(admin_client).create_namespaced_pod_disruption_budget(ns, docs["PodDisruptionBudget"], dry_run="All")


# --- a hostile tenant: a namespaced user who may create and patch pods, nothing more ---------------


@pytest.fixture
def tenant(admin_client: Any, gpu_namespace: str, sa_kubeconfig: Callable[..., Path]) -> Iterator[Any]:
    """An ApiClient acting as ServiceAccount ``tenant`` of ``gpu_namespace``, allowed every pod verb there."""
    api = tenant_client(admin_client, gpu_namespace, sa_kubeconfig, "pods", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]}])
    yield api
    api.close()


FORGED_RECORD = json.dumps({"version": "v1", "mode": "mig", "gated": True, "policy": "p", "reason": "r", "containers": [
    {"name": "main", "kind": "containers", "milli": 1000, "resource": "nvidia.com/mig-7g.80gb", "profile": "7g.80gb"}]})


def _refused(call: Callable[[], Any]) -> ApiException:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value


def test_a_tenant_cannot_create_a_pod_with_a_forged_allocation_or_gpupacks_gate(
    tenant: Any, gpu_namespace: str
) -> None:
    core = client.CoreV1Api(tenant)
    forged = make_pod({"name": "main", "image": "example.com/app:1"}, name="forged-1", namespace=gpu_namespace,
                      annotations={"gpupack.io/allocation": FORGED_RECORD})
    refusal = _refused(lambda: core.create_namespaced_pod(gpu_namespace, forged))
    assert refusal.status == 403 and "ForgedAllocation" in str(refusal.body)
    gate_only = make_pod({"name": "main", "image": "example.com/app:1"}, name="forged-2", namespace=gpu_namespace)
    gate_only["spec"]["schedulingGates"] = [{"name": "gpupack.io/capacity"}]
    refusal = _refused(lambda: core.create_namespaced_pod(gpu_namespace, gate_only))
    assert refusal.status == 403 and "is gpupack's" in str(refusal.body)
    # The same tenant's honest request is admitted and gated as usual.
    honest = core.create_namespaced_pod(gpu_namespace, make_pod(gpu_container("main", "100"), name="honest",
                                                               namespace=gpu_namespace))
    assert [g.name for g in honest.spec.scheduling_gates] == ["gpupack.io/capacity"]


def test_only_the_controller_changes_gpupacks_marks_after_create(
    tenant: Any, gpu_namespace: str, sa_client: Callable[[str], Any]
) -> None:
    core = client.CoreV1Api(tenant)
    core.create_namespaced_pod(gpu_namespace, make_pod(gpu_container("main", "100"), name="queued",
                                                       namespace=gpu_namespace))
    rewrite = {"metadata": {"annotations": {"gpupack.io/allocation": FORGED_RECORD}}}

    def rewrite_refused() -> bool:
        try:
            core.patch_namespaced_pod("queued", gpu_namespace, rewrite)
        except ApiException as exc:
            return exc.status in (403, 422) and "written by gpupack only" in str(exc.body)
        return False

    # The policy is enforced once the API server's policy cache has it (asynchronous).
    _wait("the pod-marks ValidatingAdmissionPolicy to be enforced", rewrite_refused)
    for patch in ({"metadata": {"annotations": {"gpupack.io/allocation": None}}},
                  {"metadata": {"annotations": {"gpupack.io/note": "1"}}}):
        refusal = _refused(lambda: core.patch_namespaced_pod("queued", gpu_namespace, patch))
        assert "written by gpupack only" in str(refusal.body)
    lift = [{"op": "remove", "path": "/spec/schedulingGates"}]
    refusal = _refused(lambda: core.patch_namespaced_pod("queued", gpu_namespace, lift))
    assert "only gpupack's controller lifts" in str(refusal.body)
    # Everything else of the pod stays the owner's.
    core.patch_namespaced_pod("queued", gpu_namespace, {"metadata": {"labels": {"team": "vision"}}})
    # The controller's own account may lift the gate and annotate.
    controller = client.CoreV1Api(sa_client("gpupack-controller"))
    controller.patch_namespaced_pod("queued", gpu_namespace,
                                    {"metadata": {"annotations": {"gpupack.io/note": "50"}}})
    controller.patch_namespaced_pod("queued", gpu_namespace, lift)
    stored = core.read_namespaced_pod("queued", gpu_namespace)
    assert not stored.spec.scheduling_gates and stored.metadata.labels["team"] == "vision"


def test_the_controllers_token_changes_only_placement_fields(
    admin_client: Any, gpu_namespace: str, sa_client: Callable[[str], Any]
) -> None:
    """A stolen controller token used to rewrite any pod (an image, say) and relabel any node."""
    core = client.CoreV1Api(admin_client)
    core.create_namespaced_pod(gpu_namespace, make_pod(gpu_container("main", "100"), name="victim",
                                                       namespace=gpu_namespace, labels={"app": "v"}))
    controller = client.CoreV1Api(sa_client("gpupack-controller"))

    def image_refused() -> bool:
        try:
            controller.patch_namespaced_pod("victim", gpu_namespace, [
                {"op": "replace", "path": "/spec/containers/0/image", "value": "attacker.example/backdoor:1"}])
        except ApiException as exc:
            return "affinity and scheduling gates only" in str(exc.body)
        return False

    _wait("the controller-pod-writes ValidatingAdmissionPolicy to be enforced", image_refused)
    patches: tuple[tuple[Any, str], ...] = (
        ({"metadata": {"labels": {"app": "other"}}}, "gpupack.io/* annotations only"),
        ({"metadata": {"annotations": {"team": "x"}}}, "gpupack.io/* annotations only"),
        ({"metadata": {"finalizers": ["example.com/block"]}}, "gpupack.io/* annotations only"),
        ([{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}],
         "affinity and scheduling gates only"),
    )
    for patch, message in patches:
        refusal = _refused(lambda: controller.patch_namespaced_pod("victim", gpu_namespace, patch))
        assert message in str(refusal.body), patch
    node_name = f"e2e-ctl-probe-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": node_name}})
    try:
        for change in ({"metadata": {"labels": {"cordon": "me"}}}, {"spec": {"unschedulable": True}}):
            assert _refused(lambda: controller.patch_node(node_name, change)).status == 403
    finally:
        core.delete_node(node_name)
    # What placement needs still works: a gpupack annotation, then lifting the gate.
    controller.patch_namespaced_pod("victim", gpu_namespace,
                                    {"metadata": {"annotations": {"gpupack.io/note": "50"}}})
    controller.patch_namespaced_pod("victim", gpu_namespace, [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert not core.read_namespaced_pod("victim", gpu_namespace).spec.scheduling_gates
